"""The sampling core: ``run_loop`` (the denoising loop over a score function), its options and checks.

The forward chain noises x_0 to the limit law by time 1. Sampling runs it
backwards on a grid 1 = t_0 > t_1 > ... > t_N = eps (Sec. 4 of Lou et al. 2024):

    x <- graph.sample_limit                    (all MASK, or uniform tokens)
    for n in 0 .. N-1:   x, state <- sampler.step(x, state, t_n -> t_{n+1})
                         (then corrector_steps corrector steps at t_{n+1})
    x <- denoise(x, eps)                       (remove the noise left at eps)

and, when conditioning, the fixed positions are overwritten with their tokens
at the start, after every step and after the denoise. The whole loop is one
compiled program (``run_loop``); ``sample`` is its full-sequence driver.

Shapes: B batch, L length, D = graph.dim, V = graph.vocab_size, N steps.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from sedd.categorical import METHODS as CATEGORICAL_METHODS
from sedd.categorical import sample_categorical
from sedd.graphs import Graph, ScoreFn
from sedd.sampling.context import Context
from sedd.sampling.samplers import GENERIC_OPTIONS, SAMPLERS, Sampler, check_graph, corrector_step, get_sampler

FINALS = ("sample", "argmax")


def denoise_step(ctx, key, carry, sigma, final):
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


def start_carry(ctx: Context, sampler: Sampler, x: jax.Array, times: jax.Array, prime=None) -> dict:
    """The loop's carry at its start: the state x, the NFE counters, the sampler's state, the cache, the prime."""
    carry = {
        "x": x,
        "nfe": jnp.int32(0),
        "nfe_row": jnp.zeros(x.shape[:1], jnp.int32),
        "state": sampler.init(ctx, x, times),
        "cache": None,
        "prime": prime,
    }
    if ctx.cache:
        carry["cache"] = (jnp.full(x.shape, -1, jnp.int32), jnp.zeros(x.shape + (ctx.graph.dim,), jnp.float32))
    return carry


@functools.partial(jax.jit, static_argnames=("score_fn", "graph", "noise", "shape", "sampler", "denoise", "options"))
def run_loop(
    key,
    times,
    fixed_mask,
    fixed_tokens,
    score_params,
    *,
    score_fn,
    graph,
    noise,
    shape,
    sampler,
    denoise,
    options,
    prime=None,
    shaping=None,
):
    """The sampling core: the loop of the module docstring over a score function, as one compiled program.

    Every driver runs it: ``sample``, ``sample_long``, a block model's blocks (its score function reading
    a KV cache from ``score_params``) and ``sedd serve`` through the kinds' programs.

    Args:
      key: a ``jax.random`` key; step n uses fold_in(key, n).
      times: float32[N + 1] the time grid (``time_grid``).
      fixed_mask, fixed_tokens: bool / int32 [B, L] or None (``conditioning``).
      score_params: None, or a pytree score_fn takes as its first argument (traced).
      score_fn, graph, noise, shape, denoise: as ``sample``; sampler: a
        ``Sampler``; options: ``Options`` already ``checked``, without a time grid.
      prime: None, or (x' int32[B, L], sigma' float32[B], log-score float32[B, L, D]): the score at one
        state computed by the caller (``Context.evaluate``).
      shaping: None, or (temperature, top_p) traced (``Context.tempered``): one program for every value.
    Returns:
      (x int32[B, L], trajectory int32[S, B, L] or None, {"nfe", "nfe_per_sample"}).
    """
    steps = times.shape[0] - 1
    if score_params is not None:
        base_fn = score_fn
        score_fn = lambda x, sigma: base_fn(score_params, x, sigma)  # noqa: E731
    ctx = Context(score_fn, graph, noise, options, steps, shaping)
    every = options.trajectory_every

    def clamp(x):
        return x if fixed_mask is None else jnp.where(fixed_mask, fixed_tokens, x)

    k_limit, k_steps, k_final = jax.random.split(key, 3)
    x = clamp(graph.sample_limit(k_limit, shape).astype(jnp.int32))  # (B, L)
    carry = start_carry(ctx, sampler, x, times, prime)
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
        carry = denoise_step(ctx, k_final, carry, sampler.denoise_sigma(ctx, carry, times[-1]), options.final)
        carry["x"] = clamp(carry["x"].astype(jnp.int32))
    return carry["x"], traj, {"nfe": carry["nfe"], "nfe_per_sample": carry["nfe_row"]}


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
      axis_name: set when ``sample`` runs under ``jax.vmap(..., axis_name=...)`` (as ``sedd serve``
        does): a network call is then skipped only when no row of the mapped batch needs it, so it
        stays one batched call on unbatched weights.
      own: the sampler's own options as sorted (name, value) pairs (each sampler's class names them).
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

    def checked(self, name: str, graph: Graph, denoise: bool = True) -> Options:
        """These options with the sampler's defaults filled in, each value checked against sampler and graph
        (a ValueError for any the sampler or graph cannot honour)."""
        sampler = check_graph(name, graph)
        if self.categorical not in CATEGORICAL_METHODS:
            raise ValueError(f"unknown categorical method {self.categorical!r}; expected one of {CATEGORICAL_METHODS}")
        if self.final not in FINALS:
            raise ValueError(f"unknown final {self.final!r}; expected one of {FINALS}")
        if self.final == "argmax" and not denoise:
            raise ValueError("final='argmax' acts in the denoise step; it needs denoise=True")
        check_int("trajectory_every", self.trajectory_every, 1)
        t, p, cache = self.temperature, self.top_p, self.cache
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0:
            raise ValueError(f"temperature must be a number >= 0, got {t!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {p!r}")
        corrector_steps = check_int("corrector_steps", self.corrector_steps, 0)
        if not isinstance(cache, bool):
            raise ValueError(f"cache must be True or False, got {cache!r}")
        wanted = {"temperature": t != 1, "top_p": p != 1, "corrector_steps": corrector_steps > 0, "cache": cache}
        for option, used in wanted.items():
            if used and option not in sampler.honours:
                raise ValueError(
                    f"sampler {name!r} cannot honour {option}; it takes "
                    f"{sorted(sampler.honours) or 'none of the generic options'}"
                )
        for option in ("temperature", "top_p", "cache"):
            if wanted[option] and not graph.absorb:
                why = (
                    "it needs the absorbing score's p(x0 | unmasked) times 1 / (e^sigma - 1)"
                    if option == "cache"
                    else "it acts on the denoiser p(x0 | x_t), which the absorbing score gives directly"
                )
                raise ValueError(f"{option} is for the absorbing graph only: {why}")
        own = dict(self.own)
        unknown = sorted(set(own) - set(sampler.options))
        if unknown:
            raise ValueError(
                f"sampler {name!r} takes no option {unknown}; its own options are "
                f"{sorted(sampler.options) or 'none'}, the generic ones {list(GENERIC_OPTIONS)}"
            )
        merged = {**sampler.options, **own}
        sampler.check(merged)
        return dataclasses.replace(
            self,
            temperature=float(t),
            top_p=float(p),
            corrector_steps=corrector_steps,
            own=tuple(sorted(merged.items())),
        )


def options_from(options: Options | None, values: dict) -> Options:
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


def is_concrete(a) -> bool:
    """Whether `a` is a value known now (not None, not a tracer): checks on it can run eagerly."""
    return a is not None and not isinstance(a, jax.core.Tracer)


def check_int(name: str, value, low: int) -> int:
    """value as an int when it is an integer >= low, else a ValueError naming `name` and the value."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def check_shape(shape) -> tuple[int, int]:
    """shape as a (B, L) tuple of positive ints, else a ValueError naming it."""
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise ValueError(f"shape must be a 2-D (B, L) tuple, got {shape!r}") from None
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"shape must be a 2-D (B, L) tuple of positive sizes, got {shape!r}")
    return shape


def time_grid(given, steps: int, eps: float) -> jax.Array:
    """float32[N + 1]: the default grid linspace(1, eps, N + 1), or the `given` one (``Options.time_grid``) checked."""
    if given is None:
        if not 0 < eps < 1:
            raise ValueError(f"eps must be in (0, 1), got {eps!r}")
        return jnp.asarray(np.linspace(1.0, eps, steps + 1), jnp.float32)
    times = jnp.asarray(given, jnp.float32)
    if times.shape != (steps + 1,):
        raise ValueError(f"time_grid must have shape (steps + 1,) = ({steps + 1},), got {times.shape}")
    if is_concrete(times):
        grid = np.asarray(times)
        if not (np.all(np.diff(grid) < 0) and grid[-1] > 0 and grid[0] <= 1):
            raise ValueError(f"time_grid must be strictly decreasing within (0, 1], got {grid.tolist()}")
    return times


def conditioning(fixed_mask, fixed_tokens, shape: tuple[int, int], graph: Graph):
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
    if is_concrete(fixed_mask) and is_concrete(fixed_tokens):
        tokens = np.asarray(fixed_tokens)[np.asarray(fixed_mask)]
        bad = tokens[(tokens < 0) | (tokens >= graph.vocab_size)]
        if bad.size:
            raise ValueError(
                f"fixed_tokens must lie in [0, vocab_size={graph.vocab_size}) where fixed_mask "
                f"is True, got {bad[:5].tolist()}"
            )
    return fixed_mask, fixed_tokens


def bound_loop(score_fn, graph: Graph, noise: Callable, shape, sampler: str, denoise: bool, options: Options):
    """``run_loop`` with its static arguments bound, ``options`` (``checked``) without their traced time grid:
    (key, times, fixed_mask, fixed_tokens, score_params) -> its result."""
    return functools.partial(
        run_loop,
        score_fn=score_fn,
        graph=graph,
        noise=noise,
        shape=shape,
        sampler=get_sampler(sampler),
        denoise=denoise,
        options=dataclasses.replace(options, time_grid=None),
    )


def sample(
    key: jax.Array,
    score_fn: ScoreFn,
    graph: Graph,
    noise: Callable,
    shape: tuple[int, int],
    steps: int,
    sampler: str = "analytic",
    denoise: bool = True,
    eps: float = 1e-5,
    fixed_mask: jax.Array | None = None,
    fixed_tokens: jax.Array | None = None,
    *,
    score_params: Any = None,
    options: Options | None = None,
    **option_values,
) -> Samples:
    r"""Draw sequences from the reverse diffusion, Sec. 4 of Lou et al. 2024.

    The loop of the module docstring, with ``denoise`` a last analytic step at
    t = eps (for the absorbing graph the MASK is excluded there). Where
    ``fixed_mask`` is True the state is set to ``fixed_tokens`` at the start,
    after every step and after the denoise: exact for the absorbing graph, an
    approximation for the uniform graph (docs/math.md, "Sampling").

    score_fn, graph, noise, shape, steps and the options are static: one
    program per combination (score_fn compared by identity: pass the same
    function object, not a fresh lambda). Whatever score_fn closes over is
    baked into the program; for weights that change, pass ``score_params``.

    Args:
      score_fn: (x int32[B, L], sigma float[B]) -> log_score float[B, L, D],
        log p_t(x with x_l = y) / p_t(x), 0 at y = x_l; with ``score_params``
        called as score_fn(score_params, x, sigma).
      noise: the schedule, ``noise(t) -> (sigma_bar(t), d sigma_bar / dt)``.
      shape: (B, L).
      steps: N >= 1 sampler steps (the budget of network calls, plus the denoise).
      sampler: a name in ``SAMPLERS``.
      eps: the last time of the default grid linspace(1, eps, N + 1), in (0, 1).
      fixed_mask, fixed_tokens: bool[B, L] and int[B, L] in [0, vocab_size), or both None (run as an
        all-False mask: free and prompted draws of one shape share a program).
      options: an ``Options``; **option_values: its fields and the sampler's
        own options by keyword (they win over ``options``).
    Returns:
      ``Samples``: .tokens int32[B, L]; .trajectory and .stats when asked for.
    Any argument out of its range is a ValueError.
    """
    opts = options_from(options, option_values).checked(sampler, graph, bool(denoise))
    shape, steps = check_shape(shape), check_int("steps", steps, 1)
    times = time_grid(opts.time_grid, steps, eps)
    fixed_mask, fixed_tokens = conditioning(fixed_mask, fixed_tokens, shape, graph)
    if fixed_mask is None:  # an all-False mask fixes nothing: one program for free and prompted draws
        fixed_mask, fixed_tokens = jnp.zeros(shape, bool), jnp.zeros(shape, jnp.int32)
    loop = bound_loop(score_fn, graph, noise, shape, sampler, bool(denoise), opts)
    x, traj, stats = loop(key, times, fixed_mask, fixed_tokens, score_params)
    return Samples(x, traj, stats if opts.return_stats else None)


def one_step(
    key: jax.Array,
    score_fn: ScoreFn,
    graph: Graph,
    noise: Callable,
    x: jax.Array,
    t,
    dt,
    sampler: str = "analytic",
    **option_values,
) -> jax.Array:
    """One step of a registered sampler from x at time t to t - dt (its state freshly initialised).

    For benchmarks and tests of a single step; traceable (jit it with the
    strings static). Options as ``sample``'s keywords. Returns int32[B, L].
    """
    opts = Options.make(**option_values).checked(sampler, graph)
    step = SAMPLERS[sampler]
    times = jnp.stack([jnp.asarray(t, jnp.float32), jnp.asarray(t - dt, jnp.float32)])
    ctx = Context(score_fn, graph, noise, opts, 1)
    return step.step(ctx, key, start_carry(ctx, step, x, times), jnp.int32(0), times[0], times[1])["x"]
