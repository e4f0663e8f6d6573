r"""Reverse-time sampling: predictors, the final denoiser, conditioning.

The forward chain noises x_0 to the limit law by time 1. Sampling runs it
backwards on a grid 1 = t_0 > t_1 > ... > t_N = eps (Sec. 4 of Lou et al. 2024):

    x <- graph.sample_limit                    (all MASK, or uniform tokens)
    for n in 0 .. N-1:   x <- predictor(x, t_n, dt_n = t_n - t_{n+1})
    x <- denoise(x, eps)                       (remove the noise left at eps)

and, when conditioning, the fixed positions are overwritten with their tokens
at the start, after every step and after the denoise.

Two predictors, registered by name in ``PREDICTORS``:

  "euler"     tau-leaping with the reverse rate of Eq. (4):
              x_l ~ one_hot(x_l) + dt sigma(t) Qbar_t[x_l, .],
              Qbar_t[x, y] = Q[y, x] s_theta(x, sigma_bar(t))_y  (y != x).
  "analytic"  Tweedie tau-leaping, Thm. 4.2: with dsigma = sigma_bar(t) -
              sigma_bar(t - dt), each position moves by
              p(x_l -> y) ∝ [exp(-dsigma Q)^T s]_y exp(dsigma Q)[y, x_l],
              i.e. ``staggered_score(s, dsigma) * transp_transition(x, dsigma)``,
              exact for one position given the exact score.

Adding a predictor is one function and the decorator::

    @register_predictor("my_predictor")
    def my_predictor(key, score_fn, graph, noise, x, t, dt, categorical):
        sigma, dsigma = noise(t)                        # scalars
        log_score = score_fn(x, jnp.full(x.shape[:1], sigma))   # (B, L, D)
        ...
        return x_new                                    # int32 (B, L)

then ``sample(..., predictor="my_predictor")``. It runs inside ``jax.jit``, so
it must be traceable (no Python control flow on array values).

Categorical draws go through ``sedd.categorical.sample_categorical``:
"precise" (default) is an exponential race exact for small probabilities;
"gumbel32" is ``jax.random.categorical`` (float32 Gumbel-max), which draws a
token of probability 1e-7 at about 0.52 of its rate and one of 1e-8 at ~1e-4
of it (docs/sampling.md): an implicit top-p that lowers the effective
temperature (Zheng et al. 2024, arXiv 2409.02908).

Shapes: B batch, L length, D = graph.dim, N steps.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from sedd.categorical import METHODS as CATEGORICAL_METHODS
from sedd.categorical import sample_categorical
from sedd.graphs import Graph, ScoreFn

Predictor = Callable[..., jax.Array]
"""(key, score_fn, graph, noise, x int32[B, L], t float[], dt float[], categorical)
-> int32[B, L]."""

PREDICTORS: dict[str, Predictor] = {}
"""Predictor name -> function; fill it with ``register_predictor``."""

FINALS = ("sample", "argmax")


def register_predictor(name: str) -> Callable[[Predictor], Predictor]:
    """Decorator: make a predictor available to ``sample`` as ``predictor=name``.

    Names are unique: registering one twice is a ValueError, so a name always
    means the same function (``sample`` caches its compiled loop per function).
    """

    def register(fn: Predictor) -> Predictor:
        if name in PREDICTORS:
            raise ValueError(f"predictor {name!r} is already registered")
        PREDICTORS[name] = fn
        return fn

    return register


def _batch_sigma(sigma: jax.Array, x: jax.Array) -> jax.Array:
    """A scalar noise level repeated for each sequence: float[B]."""
    return jnp.broadcast_to(sigma, x.shape[:1])


@register_predictor("euler")
def euler_predictor(key, score_fn, graph, noise, x, t, dt, categorical):
    r"""One tau-leaping step with the reverse rate, Eq. (4) and Sec. 4.1 of Lou et al.

        p(x_l -> y) = delta_{x_l y} + dt sigma(t) Qbar_t[x_l, y],
        Qbar_t[x, y] = Q[y, x] s_y (y != x),  Qbar_t[x, x] = -sum_{y != x} Qbar_t[x, y].

    Large steps can make the diagonal negative; the categorical treats it as 0.

    Args:
      key: a ``jax.random`` key.
      score_fn: (x, sigma float[B]) -> log_score float[B, L, D].
      graph: the forward ``Graph``.
      noise: the schedule, ``noise(t) -> (sigma_bar, dsigma_bar)``.
      x: int32[B, L] states at time t.
      t: float[] current time; dt: float[] step (> 0), the next time is t - dt.
      categorical: categorical method name.
    Returns:
      int32[B, L] states at time t - dt.
    """
    sigma, dsigma = noise(t)
    score = jnp.exp(score_fn(x, _batch_sigma(sigma, x)))  # (B, L, D)
    rate = (dt * dsigma) * graph.reverse_rate(x, score)  # (B, L, D)
    return graph.sample_rate(key, x, rate, categorical)


@register_predictor("analytic")
def analytic_predictor(key, score_fn, graph, noise, x, t, dt, categorical):
    r"""Tweedie tau-leaping, Thm. 4.2 of Lou et al. 2024.

    With dsigma = sigma_bar(t) - sigma_bar(t - dt) and s the score at sigma_bar(t),

        p(x_l -> y) ∝ [exp(-dsigma Q)^T s]_y  exp(dsigma Q)[y, x_l],

    the exact one-position reverse transition p_{t-dt|t} when s is exact
    (the paper's ``staggered_score * transp_transition``).

    Args and Returns as ``euler_predictor``.
    """
    sigma, _ = noise(t)
    sigma_next, _ = noise(t - dt)
    step_sigma = sigma - sigma_next  # float[]
    score = jnp.exp(score_fn(x, _batch_sigma(sigma, x)))  # (B, L, D)
    probs = graph.staggered_score(score, step_sigma) * graph.transp_transition(x, step_sigma)
    return sample_categorical(key, probs, categorical)


def _denoise(key, score_fn, graph, noise, x, t, final, categorical):
    r"""The last step, from sigma_bar(eps) to zero noise (Sec. 4.2, "denoise").

    The analytic step with dsigma = sigma_bar(eps): every bit of noise is
    removed. For the absorbing graph the MASK column is dropped before the
    draw, so no mask survives (a masked position is filled with a token).

    Returns:
      int32[B, L] clean tokens.
    """
    sigma, _ = noise(t)
    score = jnp.exp(score_fn(x, _batch_sigma(sigma, x)))  # (B, L, D)
    probs = graph.staggered_score(score, sigma) * graph.transp_transition(x, sigma)
    if graph.absorb:
        probs = probs[..., : graph.vocab_size]  # (B, L, D - 1): no MASK
    if final == "argmax":
        return jnp.argmax(probs, axis=-1).astype(jnp.int32)
    return sample_categorical(key, probs, categorical)


@functools.partial(
    jax.jit,
    static_argnames=(
        "score_fn",
        "graph",
        "noise",
        "shape",
        "predictor_fn",
        "denoise",
        "categorical",
        "final",
        "return_trajectory",
        "trajectory_every",
    ),
)
def _sample_loop(
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
    predictor_fn,
    denoise,
    categorical,
    final,
    return_trajectory,
    trajectory_every,
):
    """The whole sampler as one compiled program (see ``sample``).

    jit caches one executable per value of the static arguments, so repeated
    calls with the same score_fn, graph, noise, shape, step count and options
    trace once; key, times, conditioning and score_params are traced.
    """
    steps = times.shape[0] - 1
    if score_params is not None:
        base_fn = score_fn
        score_fn = lambda x, sigma: base_fn(score_params, x, sigma)  # noqa: E731

    def clamp(x):
        if fixed_mask is None:
            return x
        return jnp.where(fixed_mask, fixed_tokens, x)

    k_limit, k_steps, k_final = jax.random.split(key, 3)
    x = clamp(graph.sample_limit(k_limit, shape).astype(jnp.int32))  # (B, L)

    n_saved = steps // trajectory_every + 1
    traj = None
    if return_trajectory:
        traj = jnp.zeros((n_saved, *shape), jnp.int32).at[0].set(x)  # (S, B, L)

    def body(n, carry):
        x, traj = carry
        t, t_next = times[n], times[n + 1]
        x = predictor_fn(
            jax.random.fold_in(k_steps, n), score_fn, graph, noise, x, t, t - t_next, categorical
        )
        x = clamp(x.astype(jnp.int32))
        if traj is not None:
            # Slot (n + 1) // every is in range for every n; it is written with
            # the new state only when n + 1 is a multiple of `every`.
            slot = (n + 1) // trajectory_every
            save = (n + 1) % trajectory_every == 0
            traj = traj.at[slot].set(jnp.where(save, x, traj[slot]))
        return x, traj

    x, traj = jax.lax.fori_loop(0, steps, body, (x, traj))
    if denoise:
        x = clamp(_denoise(k_final, score_fn, graph, noise, x, times[-1], final, categorical))
    if return_trajectory:
        return x, traj
    return x


def _is_concrete(a) -> bool:
    return a is not None and not isinstance(a, jax.core.Tracer)


def _check_int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def sample(
    key: jax.Array,
    score_fn: ScoreFn,
    graph: Graph,
    noise: Callable,
    shape: tuple[int, int],
    steps: int,
    predictor: str = "analytic",
    denoise: bool = True,
    eps: float = 1e-5,
    fixed_mask: jax.Array | None = None,
    fixed_tokens: jax.Array | None = None,
    *,
    categorical: str = "precise",
    final: str = "sample",
    time_grid: Any = None,
    return_trajectory: bool = False,
    trajectory_every: int = 1,
    score_params: Any = None,
):
    r"""Draw sequences from the reverse diffusion, Sec. 4 of Lou et al. 2024.

    x starts at ``graph.sample_limit``; each step t -> t - dt applies the
    predictor; with ``denoise`` a last analytic step at t = eps with
    dsigma = sigma_bar(eps) removes the remaining noise (for the absorbing graph
    the MASK is excluded there, so every position ends as a token).

    Conditioning: where ``fixed_mask`` is True the state is set to
    ``fixed_tokens`` at the start, after every step and after the denoise
    (prefix, suffix or any infill pattern): exact for the absorbing graph, an
    approximation for the uniform graph (docs/math.md, "Sampling").

    The loop is one ``jax.jit`` around a ``jax.lax.fori_loop`` with the key of
    step n equal to ``fold_in(key, n)``. score_fn, graph, noise, shape, steps
    and the option strings are static: the program is compiled once per
    combination and reused (score_fn is compared by identity, so pass the same
    function object, not a fresh lambda, to avoid recompiling). Whatever
    score_fn closes over is baked into the program as a constant; for a model
    whose weights change, pass them as ``score_params`` instead.

    Args:
      key: a ``jax.random`` key.
      score_fn: (x int32[B, L], sigma float[B]) -> log_score float[B, L, D],
        log p_t(x with x_l = y) / p_t(x), 0 at y = x_l. With ``score_params``
        it is called as score_fn(score_params, x, sigma).
      graph: the forward ``Graph`` (``Absorbing`` or ``Uniform``).
      noise: the schedule, ``noise(t) -> (sigma_bar(t), d sigma_bar / dt)``.
      shape: (B, L).
      steps: N >= 1 predictor steps (network calls: N, plus one to denoise).
      predictor: a name in ``PREDICTORS`` ("analytic", "euler", ...).
      denoise: apply the final denoising step.
      eps: the last time of the default grid linspace(1, eps, N + 1), in (0, 1).
      fixed_mask: bool[B, L], True where the token is given; or None.
      fixed_tokens: int[B, L] tokens in [0, vocab_size) at the fixed positions
        (other entries are ignored); given iff fixed_mask is.
      categorical: "precise" (exact exponential race, default) or "gumbel32"
        (float32 Gumbel-max: about half the random bits, but under-draws
        tokens below ~1e-7; see ``sedd.categorical``).
      final: "sample" draws the denoised token; "argmax" takes the most likely
        one. Needs denoise=True.
      time_grid: optional float[N + 1] strictly decreasing times in (0, 1]
        replacing the default grid; the denoise then runs at its last time and
        eps is not used.
      return_trajectory: also return the states along the way.
      trajectory_every: with return_trajectory, keep the state after every
        this many steps.
      score_params: optional pytree of arrays passed to score_fn as its first
        argument and traced, not baked in: new weights neither recompile nor
        go stale (e.g. ``nnx.split`` a model and merge inside score_fn).

    Returns:
      int32[B, L] samples; with return_trajectory, (samples, trajectory) where
      trajectory is int32[N // trajectory_every + 1, B, L]: the starting state
      (after conditioning) and the state after steps every, 2 every, ...
      (before the denoise).

    Raises:
      ValueError: on steps < 1, an unknown predictor, categorical method or
        final, a shape that is not 2-D, eps outside (0, 1), a bad time grid,
        fixed_mask / fixed_tokens of the wrong shape or given alone, or a
        fixed token outside [0, vocab_size).
    """
    steps = _check_int("steps", steps, 1)
    if predictor not in PREDICTORS:
        raise ValueError(f"unknown predictor {predictor!r}; expected one of {sorted(PREDICTORS)}")
    if categorical not in CATEGORICAL_METHODS:
        raise ValueError(
            f"unknown categorical method {categorical!r}; expected one of {CATEGORICAL_METHODS}"
        )
    if final not in FINALS:
        raise ValueError(f"unknown final {final!r}; expected one of {FINALS}")
    if final == "argmax" and not denoise:
        raise ValueError("final='argmax' acts in the denoise step; it needs denoise=True")
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise ValueError(f"shape must be a 2-D (B, L) tuple, got {shape!r}") from None
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"shape must be a 2-D (B, L) tuple of positive sizes, got {shape!r}")
    trajectory_every = _check_int("trajectory_every", trajectory_every, 1)

    if time_grid is None:
        if not 0 < eps < 1:
            raise ValueError(f"eps must be in (0, 1), got {eps!r}")
        times = jnp.asarray(np.linspace(1.0, eps, steps + 1), jnp.float32)  # (N + 1,)
    else:
        times = jnp.asarray(time_grid, jnp.float32)
        if times.shape != (steps + 1,):
            raise ValueError(
                f"time_grid must have shape (steps + 1,) = ({steps + 1},), got {times.shape}"
            )
        if _is_concrete(times):
            grid = np.asarray(times)
            if not (np.all(np.diff(grid) < 0) and grid[-1] > 0 and grid[0] <= 1):
                raise ValueError(
                    f"time_grid must be strictly decreasing within (0, 1], got {grid.tolist()}"
                )

    if (fixed_mask is None) != (fixed_tokens is None):
        raise ValueError("fixed_mask and fixed_tokens must be given together")
    if fixed_mask is not None:
        fixed_mask = jnp.asarray(fixed_mask, bool)
        fixed_tokens = jnp.asarray(fixed_tokens, jnp.int32)
        for name, arr in (("fixed_mask", fixed_mask), ("fixed_tokens", fixed_tokens)):
            if arr.shape != shape:
                raise ValueError(f"{name} must have the sample shape {shape}, got {arr.shape}")
        # Checked eagerly; inside a caller's jit the arrays are tracers and
        # the check is skipped.
        if _is_concrete(fixed_mask) and _is_concrete(fixed_tokens):
            tokens = np.asarray(fixed_tokens)[np.asarray(fixed_mask)]
            bad = tokens[(tokens < 0) | (tokens >= graph.vocab_size)]
            if bad.size:
                raise ValueError(
                    f"fixed_tokens must lie in [0, vocab_size={graph.vocab_size}) where "
                    f"fixed_mask is True, got {bad[:5].tolist()}"
                )

    return _sample_loop(
        key,
        times,
        fixed_mask,
        fixed_tokens,
        score_params,
        score_fn=score_fn,
        graph=graph,
        noise=noise,
        shape=shape,
        predictor_fn=PREDICTORS[predictor],
        denoise=bool(denoise),
        categorical=categorical,
        final=final,
        return_trajectory=bool(return_trajectory),
        trajectory_every=trajectory_every,
    )


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
        map each character to one token.
    """
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
