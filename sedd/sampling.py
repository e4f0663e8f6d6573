r"""Reverse-time sampling: samplers (a registry), the final denoiser, conditioning.

The forward chain noises x_0 to the limit law by time 1. Sampling runs it
backwards on a grid 1 = t_0 > t_1 > ... > t_N = eps (Sec. 4 of Lou et al. 2024):

    x <- graph.sample_limit                    (all MASK, or uniform tokens)
    for n in 0 .. N-1:   x, state <- sampler.step(x, state, t_n -> t_{n+1})
                         (then corrector_steps corrector steps at t_{n+1})
    x <- denoise(x, eps)                       (remove the noise left at eps)

and, when conditioning, the fixed positions are overwritten with their tokens
at the start, after every step and after the denoise. The whole loop is one
compiled program; a sampler may carry state across steps (its own times,
the cached network output) in the loop's carry.

Samplers, registered by name in ``PREDICTORS`` (the math is in each class):

  "euler"          tau-leaping with the reverse rate, Eq. (4) of Lou et al.
  "analytic"       Tweedie tau-leaping, Thm. 4.2 of Lou et al.
  "first_hitting"  (absorbing) the exact reverse chain event by event: the
                   next unmasking time, then one position and its token
                   (Zheng et al. 2024, arXiv 2409.02908).
  "confidence"     (absorbing) unmask ceil(masked / steps left) positions a
                   step, the most confident first (MaskGIT; LLaDA's
                   low_confidence); order="random" is any-order AR sampling.
  "entropy_bound"  (absorbing) the lowest-entropy positions while their
                   summed entropy minus the largest stays under max_entropy
                   (EB-sampler, Ben-Hamu et al. 2025, arXiv 2505.24857).
  "remdm"          (absorbing) MDLM's posterior plus remasking of decoded
                   tokens (ReMDM, Wang et al. 2025, arXiv 2503.00307).

Options every sampler reads (an option a sampler or graph cannot honour is a
ValueError, never ignored):

  temperature, top_p   on the denoiser p(x0_l = . | x_t) at masked positions
                       (absorbing graph), keeping the step's unmasking mass;
                       temperature 0 takes the argmax.
  corrector_steps      forward-backward corrector steps after each step
                       (Campbell et al. 2022, arXiv 2205.14987); euler/analytic.
  cache                skip the network when no token changed since its last
                       call, rescaling the cached output analytically
                       (MDLM's ddpm_cache; exact for a time-independent
                       absorbing model, RADD, Ou et al. 2024).

Every draw counts its network evaluations (NFE): a step whose network call
can be skipped (nothing masked, or nothing changed under ``cache``) costs
none. ``sample(..., return_stats=True)`` returns them in ``Samples.stats``.

Adding a stateless predictor is one function and the decorator::

    @register_predictor("my_predictor")
    def my_predictor(key, score_fn, graph, noise, x, t, dt, categorical):
        sigma, dsigma = noise(t)                        # scalars
        log_score = score_fn(x, jnp.full(x.shape[:1], sigma))   # (B, L, D)
        ...
        return x_new                                    # int32 (B, L)

and a sampler with state is a ``Sampler`` subclass registered with
``register_sampler``. Both run inside ``jax.jit``: traceable code only.

Categorical draws go through ``sedd.categorical.sample_categorical``:
"precise" (default) is an exponential race exact for small probabilities
(in two levels at large vocabularies); "gumbel32" is ``jax.random.categorical``
(float32 Gumbel-max), which draws a token of probability 1e-7 at about 0.52 of
its rate and one of 1e-8 at ~1e-4 of it (docs/sampling.md): an implicit top-p
that lowers the effective temperature (Zheng et al. 2024, arXiv 2409.02908).

Shapes: B batch, L length, D = graph.dim, V = graph.vocab_size, N steps.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from sedd import categorical as categorical_lib
from sedd.categorical import METHODS as CATEGORICAL_METHODS
from sedd.categorical import sample_categorical
from sedd.graphs import Graph, ScoreFn, log_expm1

PREDICTORS: dict[str, "Sampler"] = {}
"""Sampler name -> ``Sampler``; fill it with ``register_sampler`` or ``register_predictor``."""

FINALS = ("sample", "argmax")
GENERIC_OPTIONS = ("temperature", "top_p", "corrector_steps", "cache")


# --------------------------------------------------------------------------- the loop's context


class Context:
    """What a sampler step sees: the score function, the process and the options.

    Built inside the compiled loop. ``evaluate`` is the only way a sampler
    calls the network: it counts the NFE, skips calls that cannot change the
    draw, and serves the cache.

    Attributes:
      score_fn, graph, noise: as in ``sample``.
      categorical: the categorical method.
      temperature, top_p, cache: the generic options.
      options: dict of the sampler's own options.
      steps: N, the number of steps of the grid.
      axis_name: the ``jax.vmap`` axis the sampler is mapped over, or None (``Options.axis_name``).
    """

    def __init__(self, score_fn, graph, noise, options: "Options", steps: int):
        self.score_fn, self.graph, self.noise, self.steps = score_fn, graph, noise, steps
        self.categorical, self.temperature, self.top_p = options.categorical, options.temperature, options.top_p
        self.cache, self.axis_name, self.options = options.cache, options.axis_name, dict(options.own)

    def any(self, flags: jax.Array) -> jax.Array:
        """bool[]: whether any row needs a call, over the whole mapped batch when ``axis_name`` is set.

        Under ``jax.vmap`` a per-row predicate would turn ``lax.cond`` into a
        select that runs both branches and broadcasts everything they close
        over, the weights included, to one copy per row; reduced over the
        mapped axis the predicate is the same for every row and the call
        stays one batched call on unbatched weights.
        """
        found = jnp.any(flags)
        if self.axis_name is not None:
            found = jax.lax.psum(found.astype(jnp.int32), self.axis_name) > 0
        return found

    def pending(self, x: jax.Array) -> jax.Array:
        """bool[B]: rows whose step needs the score (a MASK left; always, for the uniform graph)."""
        if self.graph.absorb:
            return jnp.any(x == self.graph.mask, axis=-1)
        return jnp.ones(x.shape[:1], bool)

    def evaluate(self, carry: dict, sigma: jax.Array) -> tuple[jax.Array, dict]:
        """The log-score at carry["x"] and noise sigma (float[] or float[B]), and the carry with the NFE counted.

        Absorbing graph: a row with no MASK needs no call (the samplers and
        the corrector read the score only at masked positions, and the ratio
        of a token to itself, 1), so when no row has one the call is skipped
        and a zero log-score stands in. With ``cache``, a
        row whose tokens did not change since the last call needs none
        either; the cached output is kept as log p(x0 | x) = log s + log(e^sigma - 1)
        and mapped to the new sigma by

            log s(x, sigma') = log s(x, sigma) + log(e^sigma - 1) - log(e^sigma' - 1),

        exact when the score depends on sigma only through that factor (the
        absorbing score of RADD, Ou et al. 2024, Thm. 1: p(x0 | unmasked)
        / (e^sigma - 1); a model trained with model.time_conditioning=False).

        With a ``prime`` in the carry, (x', sigma', log-score) computed by the
        caller (``sedd.block`` scores a block's start state in the call that
        commits the block before it), a call at exactly x' and sigma' (every
        row, over the mapped batch too) takes that log-score and is not counted.

        Returns:
          (float32[B, L, D] log-score, carry with nfe (int32[]) and nfe_row (int32[B]) updated).
        """
        x = carry["x"]
        sigma = jnp.broadcast_to(jnp.asarray(sigma, jnp.float32), x.shape[:1])  # (B,)
        if carry.get("prime") is None:
            return self._evaluate(carry, x, sigma)
        prime_x, prime_sigma, prime_score = carry["prime"]
        hit = ~self.any(jnp.any(x != prime_x, axis=-1) | (sigma != prime_sigma))  # ()

        def primed(carry):
            if self.cache:
                carry = dict(carry, cache=(x, prime_score + log_expm1(sigma)[:, None, None]))
            return prime_score.astype(jnp.float32), carry

        return jax.lax.cond(hit, primed, lambda carry: self._evaluate(carry, x, sigma), carry)

    def _evaluate(self, carry: dict, x: jax.Array, sigma: jax.Array) -> tuple[jax.Array, dict]:
        """``evaluate`` without a prime: sigma float[B]."""
        need = self.pending(x)  # (B,)
        if self.cache:
            cached_x, cached = carry["cache"]
            need = need & jnp.any(x != cached_x, axis=-1)
        called = self.any(need)  # ()
        call = lambda _: self.score_fn(x, sigma).astype(jnp.float32)  # noqa: E731
        if self.cache:
            offset = log_expm1(sigma)[:, None, None]  # (B, 1, 1)
            cached_x, cached = jax.lax.cond(
                called, lambda _: (x, call(None) + offset), lambda _: (cached_x, cached), None)
            here = jax.nn.one_hot(x, self.graph.dim, dtype=bool)
            log_score = jnp.where(here, 0.0, cached - offset)  # (B, L, D)
            carry = dict(carry, cache=(cached_x, cached))
        elif self.graph.absorb:
            zeros = lambda _: jnp.zeros(x.shape + (self.graph.dim,), jnp.float32)  # noqa: E731
            log_score = jax.lax.cond(called, call, zeros, None)
        else:
            log_score = call(None)
        return log_score, dict(carry, nfe=carry["nfe"] + called.astype(jnp.int32),
                               nfe_row=carry["nfe_row"] + need.astype(jnp.int32))

    def denoiser(self, logits: jax.Array) -> jax.Array:
        r"""The denoiser's law at each position with temperature and nucleus: float32[..., V], rows sum to 1.

        For the absorbing graph the token part of the score at a masked
        position is p(x0_l = y | x_t) / (e^sigma - 1) (RADD, Thm. 1), so
        softmax(log s[:V]) is the denoiser p(x0_l | x_t), and

            q_y ∝ p(x0_l = y | x_t)^{1 / T}            (temperature T; T = 0: argmax)
            q_y ∝ q_y [y in the nucleus of mass top_p]  (Holtzman et al. 2020)

        The nucleus is the smallest set of most probable tokens whose mass
        reaches top_p (a token tied with its least probable member is kept).

        Args:
          logits: float[..., V] log-scores of the tokens (any additive constant).
        """
        if self.temperature == 0:
            q = jax.nn.one_hot(jnp.argmax(logits, -1), logits.shape[-1], dtype=jnp.float32)
        else:
            q = jax.nn.softmax(logits.astype(jnp.float32) / self.temperature, axis=-1)
        if self.top_p < 1:
            q = nucleus(q, self.top_p)
        return q

    def draw(self, key: jax.Array, logits: jax.Array) -> tuple[jax.Array, jax.Array]:
        """y_l ~ q_l (``denoiser``) at every position, and q_l(y_l): (int32[...], float32[...]).

        At T = 1, top_p = 1 with "precise" the draw is made from exp(logits)
        as it is (a race needs no normalising) and q_l(y_l) from the total
        that the two-level draw's block sums give: one pass over V, not the
        three of a softmax followed by a draw.
        """
        if self.temperature == 1 and self.top_p == 1 and self.categorical == "precise":
            weights = jnp.exp(logits.astype(jnp.float32))  # ∝ q_l, (..., V)
            if weights.shape[-1] >= categorical_lib.TWO_LEVEL_MIN_DIM:
                sums = categorical_lib.block_sums(weights)
                token, total = categorical_lib.sample_two_level(key, weights, sums=sums), sums.sum(-1)
            else:
                token, total = sample_categorical(key, weights), weights.sum(-1)
        else:
            weights = self.denoiser(logits)
            token, total = sample_categorical(key, weights, self.categorical), 1.0
        return token, jnp.take_along_axis(weights, token[..., None], axis=-1)[..., 0] / total

    def entropy(self, logits: jax.Array) -> jax.Array:
        """H(q_l) in nats at every position: float32[...].

        At T = 1, top_p = 1 from the logits in one pass, H = log S - sum_y s_y log s_y / S
        with s = exp(logits), S = sum_y s_y (no softmax is materialised).
        """
        if self.temperature == 1 and self.top_p == 1:
            logits = logits.astype(jnp.float32)
            weights = jnp.exp(logits)
            total = weights.sum(-1)
            return jnp.log(total) - jnp.where(weights > 0, weights * logits, 0.0).sum(-1) / total
        return _entropy(self.denoiser(logits))

    def score(self, log_score: jax.Array, x: jax.Array) -> jax.Array:
        r"""The ratios exp(log_score), with temperature / top_p applied at masked positions.

        A masked position's token ratios s_y are replaced by (sum_y s_y) q_y,
        q = ``denoiser``: the total unmasking mass of the step (its Σ s) is
        kept and only its sharing among tokens changes. At T = 1, top_p = 1
        nothing is computed, so the draws are the base sampler's.

        Returns:
          float32[B, L, D].
        """
        score = jnp.exp(log_score)
        if not self.graph.absorb or (self.temperature == 1 and self.top_p == 1):
            return score
        v = self.graph.vocab_size
        logits = log_score[..., :v]
        total = jnp.exp(jax.nn.logsumexp(logits, axis=-1, keepdims=True))  # (B, L, 1)
        adjusted = jnp.concatenate([total * self.denoiser(logits), score[..., v:]], -1)
        return jnp.where((x == self.graph.mask)[..., None], adjusted, score)


def nucleus(q: jax.Array, top_p: float) -> jax.Array:
    """q restricted to its top_p nucleus and renormalised (float[..., V])."""
    desc = -jnp.sort(-q, axis=-1)  # (..., V) descending
    before = jnp.cumsum(desc, axis=-1) - desc  # mass of the strictly more probable tokens
    count = jnp.sum(before < top_p, axis=-1, keepdims=True)  # >= 1
    threshold = jnp.take_along_axis(desc, count - 1, axis=-1)  # the least probable kept
    kept = jnp.where(q >= threshold, q, 0.0)
    return kept / kept.sum(-1, keepdims=True)


def _entropy(q: jax.Array) -> jax.Array:
    """-sum q log q over the last axis (nats), 0 log 0 = 0."""
    return -jnp.sum(q * jnp.log(jnp.where(q > 0, q, 1.0)), axis=-1)


def _rank(priority: jax.Array) -> jax.Array:
    """int32[B, L]: 0 for the highest priority of each row, 1 for the next, ..."""
    return jnp.argsort(jnp.argsort(-priority, axis=-1), axis=-1)


# --------------------------------------------------------------------------- the registry


class Sampler:
    """A reverse-time sampler: ``init`` its state, then ``step`` it N times.

    Class attributes:
      graphs: the graph kinds it runs on ("absorbing", "uniform").
      honours: the generic options (``GENERIC_OPTIONS``) it can honour.
      options: its own options and their defaults.

    A step reads carry["x"] (int32[B, L]) and carry["state"] (its own
    pytree), calls the network only through ``ctx.evaluate`` (which counts
    the NFE) and returns the carry with both updated.
    """

    graphs: tuple[str, ...] = ("absorbing", "uniform")
    honours: frozenset = frozenset(GENERIC_OPTIONS)
    options: dict = {}

    def check(self, options: dict) -> None:
        """Raise a ValueError for a bad value of one of ``options``."""

    def init(self, ctx: Context, x: jax.Array, times: jax.Array) -> Any:
        """The state before the first step."""
        return ()

    def step(self, ctx: Context, key: jax.Array, carry: dict, n: jax.Array, t: jax.Array,
             t_next: jax.Array) -> dict:
        """One step t -> t_next < t; n is its index in 0 .. N-1."""
        raise NotImplementedError

    def denoise_sigma(self, ctx: Context, carry: dict, t: jax.Array) -> jax.Array:
        """The noise the final denoise removes: sigma_bar(t_N), or a per-row float[B]."""
        return ctx.noise(t)[0]


def register_sampler(name: str) -> Callable:
    """Decorator of a ``Sampler`` subclass (or instance): make it ``sample(..., predictor=name)``.

    Names are unique: registering one twice is a ValueError, so a name always
    means the same sampler (``sample`` caches its compiled loop per sampler).
    """

    def register(obj):
        if name in PREDICTORS:
            raise ValueError(f"predictor {name!r} is already registered")
        PREDICTORS[name] = obj() if isinstance(obj, type) else obj
        return obj

    return register


class FunctionPredictor(Sampler):
    """A stateless predictor function (key, score_fn, graph, noise, x, t, dt, categorical) -> x.

    Its NFE per step is the number of times it calls score_fn, counted while
    tracing; it takes none of the generic options.
    """

    honours = frozenset()

    def __init__(self, fn):
        self.fn = fn

    def step(self, ctx, key, carry, n, t, t_next):
        calls = []

        def counted(x, sigma):
            calls.append(1)
            return ctx.score_fn(x, sigma)

        x = self.fn(key, counted, ctx.graph, ctx.noise, carry["x"], t, t - t_next, ctx.categorical)
        return dict(carry, x=x, nfe=carry["nfe"] + len(calls), nfe_row=carry["nfe_row"] + len(calls))


def register_predictor(name: str) -> Callable:
    """Decorator of a stateless predictor function (see the module docstring)."""

    def register(fn):
        register_sampler(name)(FunctionPredictor(fn))
        return fn

    return register


# --------------------------------------------------------------------------- grid samplers


@register_sampler("euler")
class Euler(Sampler):
    r"""One tau-leaping step with the reverse rate, Eq. (4) and Sec. 4.1 of Lou et al. 2024.

        p(x_l -> y) = delta_{x_l y} + dt sigma(t) Qbar_t[x_l, y],
        Qbar_t[x, y] = Q[y, x] s_y (y != x),  Qbar_t[x, x] = -sum_{y != x} Qbar_t[x, y].

    Large steps can make the diagonal negative; the categorical treats it as 0.
    """

    def step(self, ctx, key, carry, n, t, t_next):
        sigma, dsigma = ctx.noise(t)
        log_score, carry = ctx.evaluate(carry, sigma)
        x = carry["x"]
        if _large_absorbing(ctx):
            return dict(carry, x=_absorbing_jump(ctx, key, x, log_score, (t - t_next) * dsigma))
        rate = ((t - t_next) * dsigma) * ctx.graph.reverse_rate(x, ctx.score(log_score, x))  # (B, L, D)
        return dict(carry, x=ctx.graph.sample_rate(key, x, rate, ctx.categorical))


@register_sampler("analytic")
class Analytic(Sampler):
    r"""Tweedie tau-leaping, Thm. 4.2 of Lou et al. 2024.

    With dsigma = sigma_bar(t) - sigma_bar(t - dt) and s the score at sigma_bar(t),

        p(x_l -> y) ∝ [exp(-dsigma Q)^T s]_y  exp(dsigma Q)[y, x_l],

    the exact one-position reverse transition p_{t-dt|t} when s is exact
    (the paper's ``staggered_score * transp_transition``).
    """

    def step(self, ctx, key, carry, n, t, t_next):
        sigma, _ = ctx.noise(t)
        sigma_next, _ = ctx.noise(t_next)
        step_sigma = sigma - sigma_next  # float[]
        log_score, carry = ctx.evaluate(carry, sigma)
        x = carry["x"]
        if _large_absorbing(ctx):
            return dict(carry, x=_absorbing_jump(ctx, key, x, log_score, jnp.expm1(step_sigma)))
        score = ctx.score(log_score, x)  # (B, L, D)
        probs = ctx.graph.staggered_score(score, step_sigma) * ctx.graph.transp_transition(x, step_sigma)
        return dict(carry, x=sample_categorical(key, probs, ctx.categorical))


def _large_absorbing(ctx: Context) -> bool:
    """Whether euler / analytic take the absorbing graph's factorised draw (``_absorbing_jump``)."""
    return (ctx.graph.absorb and ctx.categorical == "precise"
            and ctx.graph.dim >= categorical_lib.TWO_LEVEL_MIN_DIM)


def _absorbing_jump(ctx: Context, key: jax.Array, x: jax.Array, log_score: jax.Array, rate: jax.Array) -> jax.Array:
    r"""The absorbing graph's euler / analytic step drawn without building the (B, L, D) probabilities.

    For the absorbing graph both steps are, at a masked position,

        p(MASK -> y) = c s_y  (y a token),   p(MASK -> MASK) = max(0, 1 - c S),  S = sum_y s_y,

    with c = dt sigma(t) (euler) or e^{dsigma} - 1 (analytic), and a token
    never moves. The same law drawn as: unmask with probability min(1, c S)
    (an exponential race of the two weights, exact when c S is tiny), then
    y ∝ s_y by the two-level race of ``sedd.categorical``, whose block sums
    give S too: one pass over the D entries instead of three, which at
    GPT-2's D = 50,258 is most of the step's cost beside the network
    (docs/benchmarks.md has the figures). Used
    from ``categorical.TWO_LEVEL_MIN_DIM`` states on with "precise"; below,
    the general form is kept and draws are unchanged.

    Args:
      log_score: float32[B, L, D]; rate: c, float[].
    Returns:
      int32[B, L].
    """
    v = ctx.graph.vocab_size
    if ctx.temperature == 1 and ctx.top_p == 1:
        tokens = jnp.exp(log_score[..., :v])  # (B, L, V)
    else:
        tokens = ctx.score(log_score, x)[..., :v]
    sums = categorical_lib.block_sums(tokens)  # (B, L, nb)
    jump = rate * sums.sum(-1)  # (B, L): c S
    k_jump, k_token = jax.random.split(key)
    unmask = categorical_lib.race(k_jump, jnp.stack([jnp.maximum(1.0 - jump, 0.0), jump], -1)) == 1
    token = categorical_lib.sample_two_level(k_token, tokens, sums=sums)  # (B, L)
    return jnp.where((x == ctx.graph.mask) & unmask, token, x)


def corrector_step(ctx: Context, key: jax.Array, carry: dict, t: jax.Array, dt: jax.Array) -> dict:
    r"""One forward-backward corrector step at time t, Campbell et al. 2022 (arXiv 2205.14987), Sec. 4.2.

    Tau-leaping with the sum of the forward rate and the reverse rate,

        p(x_l -> y) = delta_{x_l y} + dt sigma(t) (Q[x_l, y] + Qbar_t[x_l, y]),

    a generator whose stationary law is p_t (the reverse rate satisfies
    p_t(x) Qbar_t[x, y] = p_t(y) Q[y, x]): it moves the state towards p_t
    without moving t. For the absorbing graph it remasks tokens at rate
    sigma(t) and unmasks as the reverse process does.
    """
    sigma, dsigma = ctx.noise(t)
    log_score, carry = ctx.evaluate(carry, sigma)
    x = carry["x"]
    rate = (dt * dsigma) * (ctx.graph.rate(x) + ctx.graph.reverse_rate(x, jnp.exp(log_score)))  # (B, L, D)
    return dict(carry, x=ctx.graph.sample_rate(key, x, rate, ctx.categorical))


# --------------------------------------------------------------------------- absorbing-only samplers


class _Absorbing(Sampler):
    graphs = ("absorbing",)
    honours = frozenset({"temperature", "top_p", "cache"})


@register_sampler("first_hitting")
class FirstHitting(_Absorbing):
    r"""The first-hitting sampler, Zheng et al. 2024 (arXiv 2409.02908), Alg. 1.

    In the absorbing reverse chain each of the k masked positions of a row at
    noise sigma was masked at an independent time whose masking probability
    m(s) = 1 - e^{-sigma_bar(s)} has CDF m(s) / m(t) on [0, t]. The next
    unmasking is the latest of k such times, so with u ~ U(0, 1)

        m(s) = m(t) u^{1/k},   sigma_s = -log(1 - m(s)),

    and then one masked position, uniformly, takes the token
    y ~ p(x0_l = y | x_t) (the normalised token score). With the exact score
    this is the reverse process exactly, one network call per token; a row
    runs at its own sigma (float[B] to the network). ``steps`` is the budget:
    with fewer steps than masked positions the final denoise fills the rest
    at each row's sigma.
    """

    def init(self, ctx, x, times):
        return jnp.broadcast_to(ctx.noise(times[0])[0], x.shape[:1]).astype(jnp.float32)  # (B,) sigma

    def step(self, ctx, key, carry, n, t, t_next):
        sigma = carry["state"]  # (B,)
        log_score, carry = ctx.evaluate(carry, sigma)
        x = carry["x"]
        b = x.shape[0]
        masked = x == ctx.graph.mask  # (B, L)
        k = masked.sum(-1)  # (B,)
        k_time, k_pos, k_tok = jax.random.split(key, 3)
        u = jax.random.uniform(k_time, (b,), minval=jnp.finfo(jnp.float32).tiny)
        log_m = jnp.log(-jnp.expm1(-sigma)) + jnp.log(u) / jnp.maximum(k, 1)
        sigma_next = -jnp.log1p(-jnp.exp(log_m))
        pos = jnp.argmax(jnp.where(masked, jax.random.uniform(k_pos, x.shape), -1.0), axis=-1)  # (B,)
        logits = jnp.take_along_axis(log_score, pos[:, None, None], axis=1)[:, 0, : ctx.graph.vocab_size]
        token = sample_categorical(k_tok, ctx.denoiser(logits), ctx.categorical)  # (B,)
        rows = jnp.arange(b)
        has = k > 0
        x = x.at[rows, pos].set(jnp.where(has, token, x[rows, pos]))
        return dict(carry, x=x, state=jnp.where(has, sigma_next, sigma))

    def denoise_sigma(self, ctx, carry, t):
        return carry["state"]


@register_sampler("confidence")
class Confidence(_Absorbing):
    r"""Confidence-ordered unmasking: MaskGIT (Chang et al. 2022), LLaDA's low_confidence (Nie et al. 2025).

    At step n of N every masked position draws a candidate y_l ~ q_l (the
    denoiser with temperature / top_p), and the

        k_n = ceil(masked / (N - n))

    masked positions of highest priority take theirs (all are unmasked by the
    end). Priority by ``order``: "confidence" q_l(y_l), "margin" the gap
    between the two most probable tokens, "entropy" minus the entropy of
    q_l, "random" a uniform draw. With "random" and one position a step
    (N >= L) this is any-order autoregressive sampling, exact with the exact
    score (Zheng et al. 2024, Prop. 3.1; Ou et al. 2024); the other orders
    are heuristics. The network sees sigma_bar(t_n).

    With ``threshold`` = tau > 0 (Fast-dLLM's parallel decoding, Wu et al.
    2025, arXiv 2505.22618, Sec. 3.3) a step also unmasks every position
    whose candidate has q_l(y_l) >= tau: k_n = max(ceil(masked / (N - n)),
    #{l masked : q_l(y_l) >= tau}), so a sure block is written in few calls
    and at least one position is taken a step (with order "confidence", the
    positions over tau are the first taken).
    """

    options = {"order": "confidence", "threshold": 0.0}
    ORDERS = ("confidence", "margin", "entropy", "random")

    def check(self, options):
        if options["order"] not in self.ORDERS:
            raise ValueError(f"unknown order {options['order']!r}; expected one of {self.ORDERS}")
        tau = options.get("threshold", 0.0)
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0 <= tau <= 1:
            raise ValueError(f"threshold must be a probability in [0, 1] (0: off), got {tau!r}")

    def count(self, ctx, masked, n, logits, prob=None):
        """int32[B]: positions to unmask this step (prob: the candidates' q_l(y_l), for the threshold)."""
        left = ctx.steps - n
        m = masked.sum(-1)
        k = (m + left - 1) // left
        tau = ctx.options.get("threshold", 0.0)
        if tau > 0 and prob is not None:
            k = jnp.maximum(k, (masked & (prob >= tau)).sum(-1))
        return k

    def priority(self, ctx, key, logits, token, prob):
        """float[B, L]: higher goes first."""
        order = ctx.options["order"]
        if order == "confidence":
            return prob
        if order == "margin":
            top2 = jax.lax.top_k(ctx.denoiser(logits), 2)[0]  # (B, L, 2)
            return top2[..., 0] - top2[..., 1]
        if order == "entropy":
            return -ctx.entropy(logits)
        return jax.random.uniform(key, token.shape)

    def step(self, ctx, key, carry, n, t, t_next):
        log_score, carry = ctx.evaluate(carry, ctx.noise(t)[0])
        x = carry["x"]
        k_tok, k_order = jax.random.split(key)
        logits = log_score[..., : ctx.graph.vocab_size]  # (B, L, V)
        token, prob = ctx.draw(k_tok, logits)  # (B, L) each
        masked = x == ctx.graph.mask
        priority = jnp.where(masked, self.priority(ctx, k_order, logits, token, prob), -jnp.inf)
        unmask = masked & (_rank(priority) < self.count(ctx, masked, n, logits, prob)[:, None])
        return dict(carry, x=jnp.where(unmask, token, x))


@register_sampler("entropy_bound")
class EntropyBound(Confidence):
    r"""The entropy-bounded (EB) sampler, Ben-Hamu et al. 2025 (arXiv 2505.24857), Alg. 1.

    The masked positions are sorted by the entropy H_l of their denoiser q_l
    (lowest first) and the longest prefix U with

        sum_{l in U} H_l - max_{l in U} H_l <= max_entropy      (nats)

    is unmasked, each with its candidate y_l ~ q_l (the left side bounds the
    mutual information the factorised draw ignores; the first position is
    always taken). At least ceil(masked / steps left) positions are taken so
    the draw ends within ``steps``: with steps >= L that floor is 1 and the
    bound holds at every step. Adaptive: steps left with nothing masked cost
    no network call.

    The entropies are rounded to ``ENTROPY_GRID`` nats, and positions whose
    rounded entropies tie go in a random order drawn from the row's key.
    Rounding makes the order, and so the text, the same in any batch: a
    network's output in a batch of 4 differs from its output alone in the
    last bits (5e-7 here), and unrounded entropies of positions the network
    cannot yet tell apart (all of them, at the first step) differ by as
    little, so the batch decided which went first. Any order chosen from
    the revealed tokens and independent randomness keeps the chain rule, so
    the sampler is as exact as before with the exact score.
    """

    options = {"max_entropy": 1.0}
    ENTROPY_GRID = 1e-2  # nats; far above float32 noise, far below the entropy gaps that order positions

    def check(self, options):
        if not (isinstance(options["max_entropy"], (int, float)) and options["max_entropy"] >= 0):
            raise ValueError(f"max_entropy must be a number >= 0, got {options['max_entropy']!r}")

    def rounded_entropy(self, ctx, logits):
        """float32[B, L]: H(q_l) rounded to ENTROPY_GRID nats, a multiple of it."""
        return jnp.round(ctx.entropy(logits) / self.ENTROPY_GRID) * self.ENTROPY_GRID

    def count(self, ctx, masked, n, logits, prob=None):
        entropy = self.rounded_entropy(ctx, logits)  # (B, L)
        ascending = jnp.sort(jnp.where(masked, entropy, jnp.inf), axis=-1)
        finite = jnp.where(jnp.isfinite(ascending), ascending, 0.0)
        before = jnp.cumsum(finite, axis=-1) - finite  # sum - max of each prefix
        m = masked.sum(-1)
        within = (before <= ctx.options["max_entropy"]) & (jnp.arange(masked.shape[1]) < m[:, None])
        return jnp.minimum(jnp.maximum(within.sum(-1), super().count(ctx, masked, n, logits)), m)

    def priority(self, ctx, key, logits, token, prob):
        # ties of the rounded entropy broken at random (a jitter under a tenth of the grid)
        jitter = 0.1 * self.ENTROPY_GRID * jax.random.uniform(key, token.shape)
        return -self.rounded_entropy(ctx, logits) - jitter


@register_sampler("remdm")
class ReMDM(_Absorbing):
    r"""Remasking sampler, Wang et al. 2025 (arXiv 2503.00307), Eq. (4)-(5) and Sec. 4.

    With alpha_t = e^{-sigma_bar(t)} the probability that a token is still
    unmasked at t, and a remasking probability sigma_r in [0, sigma_max],
    sigma_max = min(1, (1 - alpha_s) / alpha_t), a step t -> s < t draws

        masked z_l:    x_l ~ q_l with prob. (alpha_s - (1 - sigma_r) alpha_t) / (1 - alpha_t), else stays MASK
        unmasked z_l:  MASK with prob. sigma_r, else stays

    which has MDLM's marginals for any such sigma_r (sigma_r = 0 is the
    analytic step). ``schedule``:
      "cap"      sigma_r = min(eta, sigma_max);
      "rescale"  sigma_r = eta sigma_max;
      "loop"     alpha rises linearly to alpha_on at t_on, stays there until
                 t_off with sigma_r = eta (decode and remask at a fixed noise
                 level), then rises linearly to 1 at t = 0; sigma_r = 0
                 outside [t_off, t_on]. (alpha linear in t, as for MDLM's
                 log-linear schedule; the network sees sigma = -log alpha.)
    """

    options = {"schedule": "cap", "eta": 0.02, "t_on": 0.55, "t_off": 0.05, "alpha_on": 0.9}
    SCHEDULES = ("cap", "rescale", "loop")

    def check(self, options):
        if options["schedule"] not in self.SCHEDULES:
            raise ValueError(f"unknown schedule {options['schedule']!r}; expected one of {self.SCHEDULES}")
        if not 0 <= options["eta"] <= 1:
            raise ValueError(f"eta must be in [0, 1], got {options['eta']!r}")
        if not 0 < options["t_off"] < options["t_on"] < 1 or not 0 < options["alpha_on"] < 1:
            raise ValueError(f"need 0 < t_off < t_on < 1 and 0 < alpha_on < 1, got t_on={options['t_on']}, "
                             f"t_off={options['t_off']}, alpha_on={options['alpha_on']}")

    def alpha(self, ctx, t):
        """(alpha_t, 1 - alpha_t, the network's sigma) at time t, each float[]."""
        o = ctx.options
        if o["schedule"] != "loop":
            sigma = ctx.noise(t)[0]
            return jnp.exp(-sigma), -jnp.expm1(-sigma), sigma
        a1 = jnp.exp(-ctx.noise(jnp.float32(1.0))[0])
        t_on, t_off, a_on = o["t_on"], o["t_off"], o["alpha_on"]
        masked = jnp.where(t >= t_on, (1 - a_on) + (a_on - a1) * (t - t_on) / (1 - t_on),
                           jnp.where(t >= t_off, 1 - a_on, (1 - a_on) * t / t_off))  # 1 - alpha
        return 1 - masked, masked, -jnp.log1p(-masked)

    def step(self, ctx, key, carry, n, t, t_next):
        o = ctx.options
        a_t, m_t, sigma = self.alpha(ctx, t)
        a_s, m_s, _ = self.alpha(ctx, t_next)
        sigma_max = jnp.minimum(1.0, m_s / a_t)
        if o["schedule"] == "cap":
            remask = jnp.minimum(o["eta"], sigma_max)
        elif o["schedule"] == "rescale":
            remask = o["eta"] * sigma_max
        else:
            remask = jnp.where((t <= o["t_on"]) & (t_next >= o["t_off"]), jnp.minimum(o["eta"], sigma_max), 0.0)
        log_score, carry = ctx.evaluate(carry, sigma)
        x = carry["x"]
        k_tok, k_u = jax.random.split(key)
        token, _ = ctx.draw(k_tok, log_score[..., : ctx.graph.vocab_size])  # (B, L)
        unmask = jnp.clip((a_s - (1 - remask) * a_t) / m_t, 0.0, 1.0)
        u = jax.random.uniform(k_u, x.shape)
        masked = x == ctx.graph.mask
        mask = jnp.int32(ctx.graph.mask)
        x = jnp.where(masked, jnp.where(u < unmask, token, mask), jnp.where(u < remask, mask, x))
        return dict(carry, x=x)

    def denoise_sigma(self, ctx, carry, t):
        return self.alpha(ctx, t)[2]


# --------------------------------------------------------------------------- the loop


def _denoise(ctx, key, carry, sigma, final):
    r"""The last step, removing sigma of noise (Sec. 4.2, "denoise"): the analytic step with dsigma = sigma.

    For the absorbing graph the MASK column is dropped before the draw, so no
    mask survives (a masked position is filled with a token); a row with no
    mask left costs no network call.

    Args:
      sigma: float[] or float[B].
    Returns:
      the carry with int32[B, L] clean tokens.
    """
    log_score, carry = ctx.evaluate(carry, sigma)
    x = carry["x"]
    sigma = jnp.asarray(sigma)
    if sigma.ndim:
        sigma = sigma[:, None]  # (B, 1): against x
    score = ctx.score(log_score, x)  # (B, L, D)
    probs = ctx.graph.staggered_score(score, sigma) * ctx.graph.transp_transition(x, sigma)
    if ctx.graph.absorb:
        probs = probs[..., : ctx.graph.vocab_size]  # (B, L, D - 1): no MASK
    if final == "argmax":
        return dict(carry, x=jnp.argmax(probs, axis=-1).astype(jnp.int32))
    return dict(carry, x=sample_categorical(key, probs, ctx.categorical))


def _start(ctx: Context, sampler: Sampler, x: jax.Array, times: jax.Array, prime=None) -> dict:
    """The loop's carry at its start: the state x, the NFE counters, the sampler's state, the cache, the prime."""
    carry = {"x": x, "nfe": jnp.int32(0), "nfe_row": jnp.zeros(x.shape[:1], jnp.int32),
             "state": sampler.init(ctx, x, times), "cache": None, "prime": prime}
    if ctx.cache:
        carry["cache"] = (jnp.full(x.shape, -1, jnp.int32), jnp.zeros(x.shape + (ctx.graph.dim,), jnp.float32))
    return carry


@functools.partial(jax.jit, static_argnames=("score_fn", "graph", "noise", "shape", "sampler", "denoise", "options"))
def _sample_loop(key, times, fixed_mask, fixed_tokens, score_params, *, score_fn, graph, noise, shape, sampler,
                 denoise, options, prime=None):
    """The whole sampler as one compiled program (see ``sample``); returns (x, trajectory or None, stats).

    jit caches one executable per value of the static arguments; key, times,
    conditioning, score_params and prime are traced. prime: None, or
    (x' int32[B, L], sigma' float32[B], log-score float32[B, L, D]) the score
    at one state, computed by the caller (``Context.evaluate``).
    """
    steps = times.shape[0] - 1
    if score_params is not None:
        base_fn = score_fn
        score_fn = lambda x, sigma: base_fn(score_params, x, sigma)  # noqa: E731
    ctx = Context(score_fn, graph, noise, options, steps)
    every = options.trajectory_every

    def clamp(x):
        return x if fixed_mask is None else jnp.where(fixed_mask, fixed_tokens, x)

    k_limit, k_steps, k_final = jax.random.split(key, 3)
    x = clamp(graph.sample_limit(k_limit, shape).astype(jnp.int32))  # (B, L)
    carry = _start(ctx, sampler, x, times, prime)
    traj = None
    if options.return_trajectory:
        traj = jnp.zeros((steps // every + 1, *shape), jnp.int32).at[0].set(x)  # (S, B, L)

    def body(n, loop_carry):
        carry, traj = loop_carry
        t, t_next = times[n], times[n + 1]
        key_n = jax.random.fold_in(k_steps, n)
        carry = sampler.step(ctx, key_n, carry, n, t, t_next)
        carry["x"] = clamp(carry["x"].astype(jnp.int32))
        for c in range(options.corrector_steps):
            carry = corrector_step(ctx, jax.random.fold_in(key_n, c + 1), carry, t_next, t - t_next)
            carry["x"] = clamp(carry["x"].astype(jnp.int32))
        if traj is not None:
            # Slot (n + 1) // every is in range for every n; it is written with
            # the new state only when n + 1 is a multiple of `every`.
            slot = (n + 1) // every
            traj = traj.at[slot].set(jnp.where((n + 1) % every == 0, carry["x"], traj[slot]))
        return carry, traj

    carry, traj = jax.lax.fori_loop(0, steps, body, (carry, traj))
    if denoise:
        carry = _denoise(ctx, k_final, carry, sampler.denoise_sigma(ctx, carry, times[-1]), options.final)
        carry["x"] = clamp(carry["x"].astype(jnp.int32))
    return carry["x"], traj, {"nfe": carry["nfe"], "nfe_per_sample": carry["nfe_row"]}


# --------------------------------------------------------------------------- options, result, entry points


@dataclasses.dataclass(frozen=True)
class Options:
    """How to sample beyond the sampler's name and step count: one frozen value, checked by ``sample``.

    ``Options.make(**values)`` takes these fields and the sampler's own
    options by name; ``sample`` takes the same keywords. Hashable: the
    compiled loop is cached per value.

    Attributes:
      categorical: "precise" (exact for small probabilities, default) or "gumbel32".
      final: "sample" draws the denoised token; "argmax" takes the most likely one.
      temperature: >= 0, on the denoiser at masked positions (absorbing); 0 = argmax.
      top_p: in (0, 1], the nucleus of the denoiser (absorbing).
      corrector_steps: forward-backward corrector steps after each step (euler, analytic).
      cache: reuse the network output while no token changes (absorbing; exact
        for a time-independent model, model.time_conditioning=False).
      time_grid: optional float[N + 1] strictly decreasing times in (0, 1]
        replacing the default grid linspace(1, eps, N + 1); traced, so not
        part of the value's equality or hash.
      return_trajectory: keep the states after every ``trajectory_every`` steps.
      trajectory_every: the spacing of the kept states.
      return_stats: count the network evaluations.
      axis_name: set when ``sample`` runs under ``jax.vmap(..., axis_name=...)``
        (one key per row, as ``sedd serve`` does): a network call is then
        skipped only when no row of the mapped batch needs it, so it stays
        one batched call on unbatched weights; "nfe" counts the calls of the
        mapped batch, "nfe_per_sample" those each row needed.
      own: the sampler's own options as sorted (name, value) pairs: ``order``
        (confidence), ``max_entropy`` (entropy_bound), ``schedule``, ``eta``,
        ``t_on``, ``t_off``, ``alpha_on`` (remdm); see each sampler's class.
    """

    categorical: str = "precise"
    final: str = "sample"
    temperature: float = 1.0
    top_p: float = 1.0
    corrector_steps: int = 0
    cache: bool = False
    time_grid: Any = dataclasses.field(default=None, compare=False)
    return_trajectory: bool = False
    trajectory_every: int = 1
    return_stats: bool = False
    axis_name: Any = None
    own: tuple = ()

    @classmethod
    def make(cls, **values) -> Options:
        """Options from keywords: the fields above, and any other name as one of the sampler's own options."""
        names = {f.name for f in dataclasses.fields(cls)} - {"own"}
        own = {k: values.pop(k) for k in list(values) if k not in names}
        return cls(**values, own=tuple(sorted(own.items())))

    def updated(self, **values) -> Options:
        """These options with some fields or own options replaced."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "own"}
        return Options.make(**{**fields, **dict(self.own), **values})

    def checked(self, predictor: str, graph: Graph, denoise: bool = True) -> Options:
        """These options with the sampler's defaults filled in, each value checked against sampler and graph.

        Raises:
          ValueError: an unknown predictor, categorical method or final; an
            option the sampler or graph cannot honour; an unknown or bad
            sampler option.
        """
        if predictor not in PREDICTORS:
            raise ValueError(f"unknown predictor {predictor!r}; expected one of {sorted(PREDICTORS)}")
        sampler = PREDICTORS[predictor]
        if self.categorical not in CATEGORICAL_METHODS:
            raise ValueError(f"unknown categorical method {self.categorical!r}; expected one of {CATEGORICAL_METHODS}")
        if self.final not in FINALS:
            raise ValueError(f"unknown final {self.final!r}; expected one of {FINALS}")
        if self.final == "argmax" and not denoise:
            raise ValueError("final='argmax' acts in the denoise step; it needs denoise=True")
        _check_int("trajectory_every", self.trajectory_every, 1)
        kind = "absorbing" if graph.absorb else "uniform"
        if kind not in sampler.graphs:
            raise ValueError(f"sampler {predictor!r} runs on the {' and '.join(sampler.graphs)} graph, "
                             f"not the {kind} graph")
        t, p, cache = self.temperature, self.top_p, self.cache
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0:
            raise ValueError(f"temperature must be a number >= 0, got {t!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {p!r}")
        corrector_steps = _check_int("corrector_steps", self.corrector_steps, 0)
        if not isinstance(cache, bool):
            raise ValueError(f"cache must be True or False, got {cache!r}")
        wanted = {"temperature": t != 1, "top_p": p != 1, "corrector_steps": corrector_steps > 0, "cache": cache}
        for name, used in wanted.items():
            if used and name not in sampler.honours:
                raise ValueError(f"sampler {predictor!r} cannot honour {name}; it takes "
                                 f"{sorted(sampler.honours) or 'none of the generic options'}")
        for name in ("temperature", "top_p", "cache"):
            if wanted[name] and not graph.absorb:
                why = ("it needs the absorbing score's p(x0 | unmasked) times 1 / (e^sigma - 1)" if name == "cache"
                       else "it acts on the denoiser p(x0 | x_t), which the absorbing score gives directly")
                raise ValueError(f"{name} is for the absorbing graph only: {why}")
        own = dict(self.own)
        unknown = sorted(set(own) - set(sampler.options))
        if unknown:
            raise ValueError(f"sampler {predictor!r} takes no option {unknown}; its own options are "
                             f"{sorted(sampler.options) or 'none'}, the generic ones {list(GENERIC_OPTIONS)}")
        merged = {**sampler.options, **own}
        sampler.check(merged)
        return dataclasses.replace(self, temperature=float(t), top_p=float(p), corrector_steps=corrector_steps,
                                   own=tuple(sorted(merged.items())))


def _options(options: Options | None, values: dict) -> Options:
    """``sample``'s options argument and its option keywords as one value (the keywords win)."""
    if options is None:
        return Options.make(**values)
    if not isinstance(options, Options):
        raise ValueError(f"options must be a sedd.sampling.Options, got {type(options).__name__}")
    return options.updated(**values) if values else options


@functools.partial(jax.tree_util.register_dataclass, data_fields=["tokens", "trajectory", "stats"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class Samples:
    """What ``sample`` returns, whatever was asked for.

    Attributes:
      tokens: int32[B, L] the samples.
      trajectory: int32[N // trajectory_every + 1, B, L], the start after
        conditioning, then the state every trajectory_every steps, before the
        denoise; None unless ``return_trajectory``.
      stats: {"nfe": int32[] network calls made on the batch, "nfe_per_sample":
        int32[B] the calls each row needed}; None unless ``return_stats``.
    """

    tokens: Any
    trajectory: Any = None
    stats: Any = None


def _is_concrete(a) -> bool:
    return a is not None and not isinstance(a, jax.core.Tracer)


def _check_int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _check_shape(shape) -> tuple[int, int]:
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise ValueError(f"shape must be a 2-D (B, L) tuple, got {shape!r}") from None
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"shape must be a 2-D (B, L) tuple of positive sizes, got {shape!r}")
    return shape


def _time_grid(time_grid, steps: int, eps: float) -> jax.Array:
    """float32[N + 1]: the default grid linspace(1, eps, N + 1), or the given one after its checks."""
    if time_grid is None:
        if not 0 < eps < 1:
            raise ValueError(f"eps must be in (0, 1), got {eps!r}")
        return jnp.asarray(np.linspace(1.0, eps, steps + 1), jnp.float32)
    times = jnp.asarray(time_grid, jnp.float32)
    if times.shape != (steps + 1,):
        raise ValueError(f"time_grid must have shape (steps + 1,) = ({steps + 1},), got {times.shape}")
    if _is_concrete(times):
        grid = np.asarray(times)
        if not (np.all(np.diff(grid) < 0) and grid[-1] > 0 and grid[0] <= 1):
            raise ValueError(f"time_grid must be strictly decreasing within (0, 1], got {grid.tolist()}")
    return times


def _conditioning(fixed_mask, fixed_tokens, shape: tuple[int, int], graph: Graph):
    """fixed_mask / fixed_tokens as bool / int32 arrays of `shape` (or None, None), tokens in the vocabulary."""
    if (fixed_mask is None) != (fixed_tokens is None):
        raise ValueError("fixed_mask and fixed_tokens must be given together")
    if fixed_mask is None:
        return None, None
    fixed_mask, fixed_tokens = jnp.asarray(fixed_mask, bool), jnp.asarray(fixed_tokens, jnp.int32)
    for name, arr in (("fixed_mask", fixed_mask), ("fixed_tokens", fixed_tokens)):
        if arr.shape != shape:
            raise ValueError(f"{name} must have the sample shape {shape}, got {arr.shape}")
    # Checked eagerly; inside a caller's jit the arrays are tracers and the check is skipped.
    if _is_concrete(fixed_mask) and _is_concrete(fixed_tokens):
        tokens = np.asarray(fixed_tokens)[np.asarray(fixed_mask)]
        bad = tokens[(tokens < 0) | (tokens >= graph.vocab_size)]
        if bad.size:
            raise ValueError(f"fixed_tokens must lie in [0, vocab_size={graph.vocab_size}) where fixed_mask "
                             f"is True, got {bad[:5].tolist()}")
    return fixed_mask, fixed_tokens


def sample(key: jax.Array, score_fn: ScoreFn, graph: Graph, noise: Callable, shape: tuple[int, int], steps: int,
           predictor: str = "analytic", denoise: bool = True, eps: float = 1e-5, fixed_mask: jax.Array | None = None,
           fixed_tokens: jax.Array | None = None, *, score_params: Any = None, options: Options | None = None,
           **option_values) -> Samples:
    r"""Draw sequences from the reverse diffusion, Sec. 4 of Lou et al. 2024.

    x starts at ``graph.sample_limit``; each step t -> t - dt applies the
    sampler; with ``denoise`` a last analytic step at t = eps with
    dsigma = sigma_bar(eps) removes the remaining noise (for the absorbing graph
    the MASK is excluded there, so every position ends as a token).

    Conditioning: where ``fixed_mask`` is True the state is set to
    ``fixed_tokens`` at the start, after every step and after the denoise
    (prefix, suffix or any infill pattern): exact for the absorbing graph, an
    approximation for the uniform graph (docs/math.md, "Sampling").

    The loop is one ``jax.jit`` around a ``jax.lax.fori_loop`` with the key of
    step n equal to ``fold_in(key, n)``. score_fn, graph, noise, shape, steps
    and the options are static: the program is compiled once per combination
    and reused (score_fn is compared by identity: pass the same function
    object, not a fresh lambda). Whatever score_fn closes over is baked into
    the program as a constant; for weights that change, pass ``score_params``.
    Where the rows are computed (a mesh's data axis) is the score function's
    business: ``sedd.runs.Run`` passes one that constrains its input's rows.

    Args:
      key: a ``jax.random`` key.
      score_fn: (x int32[B, L], sigma float[B]) -> log_score float[B, L, D],
        log p_t(x with x_l = y) / p_t(x), 0 at y = x_l. With ``score_params``
        it is called as score_fn(score_params, x, sigma).
      graph: the forward ``Graph`` (``Absorbing`` or ``Uniform``).
      noise: the schedule, ``noise(t) -> (sigma_bar(t), d sigma_bar / dt)``.
      shape: (B, L).
      steps: N >= 1 sampler steps (the budget of network calls, plus the denoise).
      predictor: a name in ``PREDICTORS`` (see the module docstring).
      denoise: apply the final denoising step.
      eps: the last time of the default grid linspace(1, eps, N + 1), in (0, 1).
      fixed_mask: bool[B, L], True where the token is given; or None.
      fixed_tokens: int[B, L], tokens in [0, vocab_size) at the fixed
        positions; given iff fixed_mask is.
      score_params: optional pytree passed to score_fn as its first argument, traced.
      options: an ``Options``; **option_values: its fields and the sampler's
        own options by keyword (they win over ``options``): categorical,
        final, temperature, top_p, corrector_steps, cache, time_grid,
        return_trajectory, trajectory_every, return_stats, axis_name, ...

    Returns:
      ``Samples``: .tokens int32[B, L]; .trajectory and .stats when asked for.

    Raises:
      ValueError: on steps < 1, a shape that is not 2-D, eps outside (0, 1), a
        bad time grid, bad conditioning arrays, or options that
        ``Options.checked`` refuses.
    """
    opts = _options(options, option_values).checked(predictor, graph, bool(denoise))
    shape, steps = _check_shape(shape), _check_int("steps", steps, 1)
    times = _time_grid(opts.time_grid, steps, eps)
    fixed_mask, fixed_tokens = _conditioning(fixed_mask, fixed_tokens, shape, graph)
    x, traj, stats = _sample_loop(key, times, fixed_mask, fixed_tokens, score_params, score_fn=score_fn, graph=graph,
                                  noise=noise, shape=shape, sampler=PREDICTORS[predictor], denoise=bool(denoise),
                                  options=dataclasses.replace(opts, time_grid=None))
    return Samples(x, traj, stats if opts.return_stats else None)


def sample_long(key: jax.Array, score_fn: ScoreFn, graph: Graph, noise: Callable, shape: tuple[int, int],
                steps: int, max_length: int, block_length: int | None = None, fixed_mask: jax.Array | None = None,
                fixed_tokens: jax.Array | None = None, **sample_args) -> Samples:
    r"""Text of ``max_length`` >= L tokens by semi-autoregressive windows of L (MDLM Sec. 3.5; BD3-LM).

    Window w covers positions [s_w, s_w + L): s_0 = 0, then each window
    starts block_length after the previous one (the last is moved back to
    end at max_length). Its positions before the previous window's end are
    fixed to the text already drawn; the rest are drawn by ``sample``'s loop,
    with the caller's own fixed positions kept. Every window is the same compiled
    program (the conditioning is traced); window w uses fold_in(key, w).

    Args:
      key, score_fn, graph, noise, steps: as in ``sample``.
      shape: (B, L), L the window (the model's length).
      max_length: the length of the text, >= L.
      block_length: new tokens per window after the first, in [1, L] (default L // 2).
      fixed_mask, fixed_tokens: as in ``sample``, of shape (B, max_length).
      **sample_args: the other arguments of ``sample`` (predictor, denoise,
        eps, score_params, options and option keywords; no trajectory), and
        stop_id: a token id that ends the text: no window is drawn after the
        one in which every row has written it, and the positions not drawn
        hold stop_id.
    Returns:
      ``Samples`` with tokens int32[B, max_length] and, when asked for, the
      stats with the NFE summed over the windows.
    """
    b, length = _check_shape(shape)
    stop_id = sample_args.pop("stop_id", None)
    if stop_id is not None and not 0 <= int(stop_id) < graph.vocab_size:
        raise ValueError(f"stop_id must be a token id in [0, {graph.vocab_size}), got {stop_id!r}")
    predictor, denoise = sample_args.pop("predictor", "analytic"), bool(sample_args.pop("denoise", True))
    eps, score_params = sample_args.pop("eps", 1e-5), sample_args.pop("score_params", None)
    opts = _options(sample_args.pop("options", None), sample_args).checked(predictor, graph, denoise)
    times = _time_grid(opts.time_grid, _check_int("steps", steps, 1), eps)  # checked once: every window shares them
    if opts.return_trajectory:
        raise ValueError("return_trajectory is not available with max_length (one trajectory per window)")
    max_length = _check_int("max_length", max_length, length)
    block_length = _check_int("block_length", length // 2 if block_length is None else block_length, 1)
    if block_length > length:
        raise ValueError(f"block_length must be <= the window L = {length}, got {block_length}")
    fixed_mask, fixed_tokens = _conditioning(fixed_mask, fixed_tokens, (b, max_length), graph)
    out = jnp.zeros((b, max_length), jnp.int32)
    user_mask = jnp.zeros((b, max_length), bool) if fixed_mask is None else fixed_mask
    user_tokens = jnp.zeros((b, max_length), jnp.int32) if fixed_tokens is None else fixed_tokens
    nfe, nfe_row = jnp.int32(0), jnp.zeros((b,), jnp.int32)
    loop = functools.partial(_sample_loop, score_fn=score_fn, graph=graph, noise=noise, shape=(b, length),
                             sampler=PREDICTORS[predictor], denoise=denoise,
                             options=dataclasses.replace(opts, time_grid=None))
    done, start, w = 0, 0, 0
    while done < max_length:
        start = min(start, max_length - length)
        window = slice(start, start + length)
        drawn = jnp.arange(start, start + length) < done  # (L,) already generated
        mask = user_mask[:, window] | drawn[None, :]
        tokens = jnp.where(drawn[None, :], out[:, window], user_tokens[:, window])
        x, _, stats = loop(jax.random.fold_in(key, w), times, mask, tokens, score_params)
        out = out.at[:, window].set(x)
        nfe, nfe_row = nfe + stats["nfe"], nfe_row + stats["nfe_per_sample"]
        done, start, w = start + length, start + block_length, w + 1
        if stop_id is not None and done < max_length and bool(jnp.all(jnp.any(out[:, :done] == stop_id, axis=1))):
            out = out.at[:, done:].set(jnp.int32(stop_id))
            break
    return Samples(out, None, {"nfe": nfe, "nfe_per_sample": nfe_row} if opts.return_stats else None)


def one_step(key: jax.Array, score_fn: ScoreFn, graph: Graph, noise: Callable, x: jax.Array, t, dt,
             predictor: str = "analytic", **option_values) -> jax.Array:
    """One step of a registered sampler from x at time t to t - dt (its state freshly initialised).

    For benchmarks and tests of a single step; traceable (jit it with the
    strings static). Options as ``sample``'s keywords. Returns int32[B, L].
    """
    opts = Options.make(**option_values).checked(predictor, graph)
    sampler = PREDICTORS[predictor]
    times = jnp.stack([jnp.asarray(t, jnp.float32), jnp.asarray(t - dt, jnp.float32)])
    ctx = Context(score_fn, graph, noise, opts, 1)
    return sampler.step(ctx, key, _start(ctx, sampler, x, times), jnp.int32(0), times[0], times[1])["x"]


def text_conditioning(tokenizer, seq_len: int, num: int, prefix: str = "", suffix: str = "",
                      infill: str = "", blank: str = "_") -> tuple[np.ndarray | None, np.ndarray | None]:
    """``fixed_mask`` and ``fixed_tokens`` of ``sample`` from text prompts, or (None, None) without any.

    prefix fills the first positions and suffix the last. An infill template
    fills positions 0, 1, ... with its characters, except `blank`, which marks
    the positions to generate (character-level tokenizers only).

    Args:
      tokenizer: with ``encode(text) -> int[n]``.
      seq_len: L, the model's sequence length.
      num: B, rows of the result.
      prefix, suffix: text (either may be empty); not with infill.
      infill: a template such as "To be, or ______ to be".
      blank: the character of the template that marks a free position.
    Returns:
      (bool[B, L], int32[B, L]) or (None, None).
    Raises:
      ValueError: text the tokenizer cannot encode, prompts longer than seq_len,
        infill with prefix or suffix, or infill with a tokenizer that does not
        map each character to one token, or a blank that is not one character.
    """
    if infill and len(blank) != 1:
        raise ValueError(f"the blank of an infill template must be one character, got {blank!r}")
    if not (prefix or suffix or infill):
        return None, None
    mask = np.zeros(seq_len, bool)
    tokens = np.zeros(seq_len, np.int32)
    if infill:
        if prefix or suffix:
            raise ValueError("an infill template cannot be combined with a prefix or suffix (put them in the template)")
        if len(infill) > seq_len:
            raise ValueError(f"the infill template has {len(infill)} characters; the model's sequence length is {seq_len}")
        for i, ch in enumerate(infill):
            if ch != blank:
                ids = tokenizer.encode(ch)
                if len(ids) != 1:
                    raise ValueError("infill templates need a character-level tokenizer (char, or byte with ASCII text)")
                mask[i], tokens[i] = True, ids[0]
    else:
        pre = np.asarray(tokenizer.encode(prefix), np.int32) if prefix else np.zeros(0, np.int32)
        suf = np.asarray(tokenizer.encode(suffix), np.int32) if suffix else np.zeros(0, np.int32)
        if len(pre) + len(suf) > seq_len:
            raise ValueError(
                f"prefix ({len(pre)} tokens) + suffix ({len(suf)} tokens) is longer than the "
                f"model's sequence length {seq_len}"
            )
        mask[: len(pre)], tokens[: len(pre)] = True, pre
        if len(suf):
            mask[seq_len - len(suf):], tokens[seq_len - len(suf):] = True, suf
    return np.broadcast_to(mask, (num, seq_len)), np.broadcast_to(tokens, (num, seq_len))
