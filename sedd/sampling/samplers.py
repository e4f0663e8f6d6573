"""The sampler registry and the samplers of the time grid: euler, analytic, and the corrector.

A sampler is a ``Sampler`` (``init`` its state, ``step`` it N times, each
step calling the network only through ``Context.evaluate``) registered by
name in ``SAMPLERS``; ``check_graph`` decides whether it runs on a graph.
The absorbing graph's own samplers are in ``sedd.sampling.absorbing``.

Shapes: B batch, L length, D = graph.dim, V = graph.vocab_size.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from sedd import categorical as categorical_lib
from sedd.categorical import sample_categorical
from sedd.graphs import Graph
from sedd.sampling.context import Context

SAMPLERS: dict[str, "Sampler"] = {}
"""Sampler name -> ``Sampler``; fill it with ``register_sampler``."""

GENERIC_OPTIONS = ("temperature", "top_p", "corrector_steps", "cache")


class Sampler:
    """A reverse-time sampler: ``init`` its state, then ``step`` it N times.

    Class attributes:
      graphs: the graph kinds it runs on ("absorbing", "uniform").
      honours: the generic options (``GENERIC_OPTIONS``) it can honour.
      options: its own options and their defaults.
      settles: a position it unmasks keeps its token to the end (True but for
        a sampler that masks decoded tokens again); where it holds, text can
        be sent while the sampling runs (``sedd serve``'s streams).

    A step reads carry["x"] (int32[B, L]) and carry["state"] (its own
    pytree), calls the network only through ``ctx.evaluate`` (which counts
    the NFE) and returns the carry with both updated.
    """

    graphs: tuple[str, ...] = ("absorbing", "uniform")
    honours: frozenset = frozenset(GENERIC_OPTIONS)
    options: dict = {}
    settles: bool = True

    def check(self, options: dict) -> None:
        """Raise a ValueError for a bad value of one of ``options``."""

    def init(self, ctx: Context, x: jax.Array, times: jax.Array) -> Any:
        """The state before the first step."""
        return ()

    def step(self, ctx: Context, key: jax.Array, carry: dict, n: jax.Array, t: jax.Array, t_next: jax.Array) -> dict:
        """One step t -> t_next < t; n is its index in 0 .. N-1."""
        raise NotImplementedError

    def denoise_sigma(self, ctx: Context, carry: dict, t: jax.Array) -> jax.Array:
        """The noise the final denoise removes: sigma_bar(t_N), or a per-row float[B]."""
        return ctx.noise(t)[0]


def register_sampler(name: str) -> Callable:
    """Decorator that makes ``sample(..., sampler=name)`` run a ``Sampler`` subclass (or instance), or a
    stateless step function (key, score_fn, graph, noise, x, t, dt, categorical) -> x (``FunctionSampler``).

    Names are unique: registering one twice is a ValueError, so a name always
    means the same sampler (``sample`` caches its compiled loop per sampler).
    """

    def register(obj):
        if name in SAMPLERS:
            raise ValueError(f"sampler {name!r} is already registered")
        SAMPLERS[name] = obj() if isinstance(obj, type) else obj if isinstance(obj, Sampler) else FunctionSampler(obj)
        return obj

    return register


class UnknownSampler(ValueError):
    """A sampler name that is not in ``SAMPLERS``."""


def get_sampler(name: str) -> Sampler:
    """The registered sampler of this name.

    Raises:
      UnknownSampler: naming the registered ones.
    """
    if name not in SAMPLERS:
        raise UnknownSampler(f"unknown sampler {name!r}; expected one of {sorted(SAMPLERS)}")
    return SAMPLERS[name]


def check_graph(name: str, graph: Graph) -> Sampler:
    """The sampler `name` when it runs on `graph`: the one place that decides it.

    Raises:
      UnknownSampler: an unregistered name.
      ValueError: a sampler that does not run on this graph.
    """
    sampler = get_sampler(name)
    kind = "absorbing" if graph.absorb else "uniform"
    if kind not in sampler.graphs:
        raise ValueError(f"sampler {name!r} runs on the {' and '.join(sampler.graphs)} graph, not the {kind} graph")
    return sampler


class FunctionSampler(Sampler):
    """A stateless step function (key, score_fn, graph, noise, x, t, dt, categorical) -> x.

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
        if large_absorbing_step(ctx):
            return dict(carry, x=absorbing_jump(ctx, key, x, log_score, (t - t_next) * dsigma))
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
        if large_absorbing_step(ctx):
            return dict(carry, x=absorbing_jump(ctx, key, x, log_score, jnp.expm1(step_sigma)))
        score = ctx.score(log_score, x)  # (B, L, D)
        probs = ctx.graph.staggered_score(score, step_sigma) * ctx.graph.transp_transition(x, step_sigma)
        return dict(carry, x=sample_categorical(key, probs, ctx.categorical))


def large_absorbing_step(ctx: Context) -> bool:
    """Whether euler / analytic take the absorbing graph's factorised draw (``absorbing_jump``)."""
    return ctx.graph.absorb and ctx.categorical == "precise" and ctx.graph.dim >= categorical_lib.TWO_LEVEL_MIN_DIM


def absorbing_jump(ctx: Context, key: jax.Array, x: jax.Array, log_score: jax.Array, rate: jax.Array) -> jax.Array:
    r"""The absorbing graph's euler / analytic step drawn without building the (B, L, D) probabilities.

    For the absorbing graph both steps are, at a masked position,

        p(MASK -> y) = c s_y  (y a token),   p(MASK -> MASK) = max(0, 1 - c S),  S = sum_y s_y,

    with c = dt sigma(t) (euler) or e^{dsigma} - 1 (analytic), and a token
    never moves. The same law drawn as: unmask with probability min(1, c S)
    (an exponential race of the two weights, exact when c S is tiny), then
    y ∝ s_y by the two-level race of ``sedd.categorical``, whose block sums
    give S too: one pass over the D entries instead of three (docs/benchmarks.md).
    Used from ``categorical.TWO_LEVEL_MIN_DIM`` states on with "precise"; below,
    the general form is kept and draws are unchanged. rate: c, float[].
    """
    v = ctx.graph.vocab_size
    if ctx.temperature == 1 and ctx.top_p == 1:
        tokens = jnp.exp(log_score[..., :v])  # (B, L, V)
    else:
        tokens = ctx.score(log_score, x)[..., :v]
    sums = categorical_lib.bucket_sums(tokens)  # (B, L, nb)
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
