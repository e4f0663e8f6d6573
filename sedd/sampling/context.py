"""The sampler's view of the loop: ``Context`` (network calls, NFE, cache, temperature), nucleus, entropy.

Shapes: B batch, L length, D = graph.dim, V = graph.vocab_size.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sedd import categorical as categorical_lib
from sedd.categorical import sample_categorical
from sedd.graphs import log_expm1


class Context:
    """What a sampler step sees: the score function, the process and the options.

    Built inside the compiled loop. ``evaluate`` is the only way a sampler
    calls the network: it counts the NFE, skips calls that cannot change the
    draw, and serves the cache.

    Attributes (besides ``sample``'s score_fn, graph, noise and ``Options``' fields):
      options: dict of the sampler's own options.
      steps: N, the number of steps of the grid.
      shaping: None, or traced (temperature, top_p), float32[] or float32[B] each, applied to every
        network output by ``tempered`` (one program for every value); the static ones are then 1.
    """

    def __init__(self, score_fn, graph, noise, options, steps: int, shaping=None):
        self.graph, self.noise, self.steps = graph, noise, steps
        self.categorical, self.temperature, self.top_p = options.categorical, options.temperature, options.top_p
        self.cache, self.axis_name, self.options = options.cache, options.axis_name, dict(options.own)
        self.shaping = shaping
        if shaping is None:
            self.score_fn = score_fn
        else:
            self.score_fn = lambda x, sigma: self.tempered(score_fn(x, sigma), x)

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
        caller (a block model scores a block's start state in the call that
        commits the block before it), a call at exactly x' and sigma' (every
        row, over the mapped batch too) takes that log-score and is not counted.
        Returns (float32[B, L, D] log-score, the carry with nfe and nfe_row updated).
        """
        x = carry["x"]
        sigma = jnp.broadcast_to(jnp.asarray(sigma, jnp.float32), x.shape[:1])  # (B,)
        if carry.get("prime") is None:
            return self._evaluate(carry, x, sigma)
        prime_x, prime_sigma, prime_score = carry["prime"]
        hit = ~self.any(jnp.any(x != prime_x, axis=-1) | (sigma != prime_sigma))  # ()

        def primed(carry):
            score = prime_score if self.shaping is None else self.tempered(prime_score, x)
            if self.cache:
                carry = dict(carry, cache=(x, score + log_expm1(sigma)[:, None, None]))
            return score.astype(jnp.float32), carry

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
                called, lambda _: (x, call(None) + offset), lambda _: (cached_x, cached), None
            )
            here = jax.nn.one_hot(x, self.graph.dim, dtype=bool)
            log_score = jnp.where(here, 0.0, cached - offset)  # (B, L, D)
            carry = dict(carry, cache=(cached_x, cached))
        elif self.graph.absorb:
            zeros = lambda _: jnp.zeros(x.shape + (self.graph.dim,), jnp.float32)  # noqa: E731
            log_score = jax.lax.cond(called, call, zeros, None)
        else:
            log_score = call(None)
        return log_score, dict(
            carry, nfe=carry["nfe"] + called.astype(jnp.int32), nfe_row=carry["nfe_row"] + need.astype(jnp.int32)
        )

    def denoiser(self, logits: jax.Array) -> jax.Array:
        r"""The denoiser's law at each position with temperature and nucleus: float32[..., V], rows sum to 1.

        For the absorbing graph the token part of the score at a masked
        position is p(x0_l = y | x_t) / (e^sigma - 1) (RADD, Thm. 1), so
        softmax(log s[:V]) is the denoiser p(x0_l | x_t), and

            q_y ∝ p(x0_l = y | x_t)^{1 / T}            (temperature T; T = 0: argmax)
            q_y ∝ q_y [y in the nucleus of mass top_p]  (``nucleus``)

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
                sums = categorical_lib.bucket_sums(weights)
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
        return entropy(self.denoiser(logits))

    def score(self, log_score: jax.Array, x: jax.Array) -> jax.Array:
        r"""The ratios exp(log_score) float32[B, L, D], with temperature / top_p applied at masked positions.

        A masked position's token ratios s_y are replaced by (sum_y s_y) q_y,
        q = ``denoiser``: the total unmasking mass of the step is kept and only
        its sharing among tokens changes. At T = 1, top_p = 1 nothing is computed.
        """
        score = jnp.exp(log_score)
        if not self.graph.absorb or (self.temperature == 1 and self.top_p == 1):
            return score
        v = self.graph.vocab_size
        logits = log_score[..., :v]
        total = jnp.exp(jax.nn.logsumexp(logits, axis=-1, keepdims=True))  # (B, L, 1)
        adjusted = jnp.concatenate([total * self.denoiser(logits), score[..., v:]], -1)
        return jnp.where((x == self.graph.mask)[..., None], adjusted, score)

    def tempered(self, log_score: jax.Array, x: jax.Array) -> jax.Array:
        r"""The log-score with the traced ``shaping`` (T, top_p) applied to the denoiser at masked positions.

        The law of ``score``, with T and top_p values of the program: at a
        masked position the token log-scores l_y (y < V) become

            l'_y = logsumexp(l) + log q_y,   q ∝ softmax(l / T) on its top_p nucleus   (T = 0: one-hot of the argmax),

        which keeps the step's unmasking mass sum_y e^{l_y} and shares it as
        q, so a sampler run at T = 1, top_p = 1 on l' draws what it would have
        drawn from q. When no row of the batch (over ``axis_name`` too) asks
        for either, nothing of it is computed. The absorbing graph only.
        """
        if not self.graph.absorb:
            return log_score
        v, mask = self.graph.vocab_size, self.graph.mask

        def per_row(a):  # float32[] stays as it is; float32[B] -> (B, 1, 1)
            a = jnp.asarray(a, jnp.float32)
            return a.reshape(a.shape + (1,) * (log_score.ndim - a.ndim)) if a.ndim else a

        temperature, top_p = map(per_row, self.shaping)
        asks = (temperature != 1) | (top_p < 1)

        def shaped(log_score):
            logits = log_score[..., :v].astype(jnp.float32)  # (B, L, V)
            q = shaped_law(logits, temperature, top_p, any_fn=self.any)
            mass = jax.nn.logsumexp(logits, axis=-1, keepdims=True)  # (B, L, 1)
            tokens = jnp.where(q > 0, mass + jnp.log(jnp.where(q > 0, q, 1.0)), -jnp.inf)
            out = jnp.concatenate([tokens, log_score[..., v:].astype(jnp.float32)], -1)  # (B, L, D)
            return jnp.where((x == mask)[..., None] & asks, out, log_score).astype(log_score.dtype)

        return jax.lax.cond(self.any(asks), shaped, lambda s: s, log_score)


def nucleus(q: jax.Array, top_p) -> jax.Array:
    """q restricted to its top_p nucleus and renormalised (float32[..., V]); top_p a float or a traced float32[].

    The nucleus is the smallest set of most probable tokens whose mass
    reaches top_p, a token tied with its least probable member kept
    (Holtzman et al. 2020). A token y is kept when the mass of the tokens
    more probable than it, f(q_y) with f(t) = sum_z q_z [q_z > t], is under
    top_p; f decreases, so the kept tokens are those with q_y >= t*, the
    least t with f(t) < top_p. t* is found by bisection on the bits of a
    float32 (their integer order is the order of non-negative floats; 32
    halvings make it exact) instead of a sort of V per position, which XLA's
    CPU backend runs several times slower.
    """
    bits = jax.lax.bitcast_convert_type(q, jnp.int32)
    lo = jnp.zeros(q.shape[:-1] + (1,), jnp.int32)  # f(0) = 1 >= top_p
    hi = jnp.max(bits, axis=-1, keepdims=True)  # f(max q) = 0 < top_p

    def halve(_, bounds):
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        above = jnp.where(q > jax.lax.bitcast_convert_type(mid, jnp.float32), q, 0.0)  # (..., V)
        under = jnp.sum(above, axis=-1, keepdims=True) < top_p
        return jnp.where(under, lo, mid), jnp.where(under, mid, hi)

    _, hi = jax.lax.fori_loop(0, 32, halve, (lo, hi))
    kept = jnp.where(q >= jax.lax.bitcast_convert_type(hi, jnp.float32), q, 0.0)
    return kept / kept.sum(-1, keepdims=True)


def shaped_law(logits: jax.Array, temperature, top_p, any_fn=None) -> jax.Array:
    """softmax(logits / T) on its top_p nucleus (T = 0: the one-hot of the argmax): float32[..., V].

    T >= 0 and top_p in (0, 1] are floats or traced float32 values broadcastable against logits[..., :1]
    (one program for every value). any_fn: bool[...] -> bool[], whether any row asks for a nucleus (a
    reduction over a mapped axis skips the nucleus when none does); None: wherever top_p < 1.
    """
    logits = logits.astype(jnp.float32)
    argmax = jax.nn.one_hot(jnp.argmax(logits, -1), logits.shape[-1], dtype=jnp.float32)
    scaled = logits / jnp.where(temperature == 0, 1.0, temperature)
    q = jnp.where(temperature == 0, argmax, jax.nn.softmax(scaled, -1))
    if isinstance(top_p, (int, float)):  # a Python value: the nucleus is there or not when traced
        return nucleus(q, top_p) if top_p < 1 else q
    if any_fn is None:
        return jnp.where(top_p < 1, nucleus(q, top_p), q)
    return jax.lax.cond(any_fn(top_p < 1), lambda q: jnp.where(top_p < 1, nucleus(q, top_p), q), lambda q: q, q)


def entropy(q: jax.Array) -> jax.Array:
    """-sum q log q over the last axis (nats), 0 log 0 = 0."""
    return -jnp.sum(q * jnp.log(jnp.where(q > 0, q, 1.0)), axis=-1)
