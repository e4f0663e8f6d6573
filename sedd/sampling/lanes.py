"""Lanes: the rows of a served batch, each sampled alone in one batched program, and their states handed on.

A server batches requests that ask for different things: each lane (a row
of the batch) has its own key fold_in(key(seed), lane), its own temperature
and top_p (traced values: one compiled program serves every value), and a
lane's text is the same whatever it was batched with. ``map_lanes`` runs a
one-lane draw that way, under ``jax.vmap`` with the axis ``AXIS``, so that
the network runs once a step on all lanes with unbatched weights
(``Context.any``).

While a batch runs, the states its network calls see can be handed to the
host: ``observe`` (traced, in a score function) sends the states of all lanes
of the batch, the positions [start, start + n) of the text, to the listener
registered for the batch with ``listening``. ``Placed`` keeps the whole text
of each lane on the host and writes each update into it.

What a model kind gives ``sedd serve`` is a ``LaneProgram``: the compiled
draw and how to count the network calls behind each frame of a trajectory.
``full_sequence_program`` is the full-sequence SEDD one; ``sedd.kinds.block`` has
the block model's.

Shapes: B lanes (the batch's rows), L length, N steps, F frames.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from sedd.sampling.loop import Options, run_loop, time_grid
from sedd.sampling.samplers import get_sampler

AXIS = "lanes"
"""The ``jax.vmap`` axis of ``map_lanes``: samplers reduce their "does any lane need a call" over it."""

LISTENERS: dict[int, Callable[[int, np.ndarray], None]] = {}
"""Batch id -> listener(start, states int32[B, n]) of a running batch; set with ``listening``."""

logger = logging.getLogger("sedd.sampling")


def deliver(batch_id, *values) -> None:
    """The host end of ``observe``: hand (start, states int32[B, n]), or another program's values, to the listener.

    Runs on XLA's thread inside the compiled program, so it never raises (an
    exception here would fail the whole batch).
    """
    listener = LISTENERS.get(int(batch_id))
    if listener is None:
        return
    try:
        listener(*(np.asarray(v) for v in values))
    except Exception:  # noqa: BLE001  a failing listener (a closed event loop) must not fail the batch
        logger.exception("a listener of a running batch failed")


def observe(batch_id: jax.Array, start: jax.Array, x: jax.Array) -> None:
    """Traced, under ``map_lanes``: send the states of every lane of the batch (x int32[1, n] is this lane's).

    One callback a call, the lanes gathered over ``AXIS``, whatever the batch size.
    """
    jax.debug.callback(deliver, batch_id, start, jax.lax.all_gather(x[0], AXIS))  # (B, n)


@contextlib.contextmanager
def listening(batch_id: int, listener: Callable[[int, np.ndarray], None]):
    """Register listener(start, states) for the batch `batch_id` while the block runs."""
    LISTENERS[batch_id] = listener
    try:
        yield
    finally:
        LISTENERS.pop(batch_id, None)


class Placed:
    """A listener that keeps the whole text of each lane: each update is written at its place, then handed on.

    A call may see part of the text only (a block model's calls see one
    block); the host keeps the rest (the prompt, what is drawn, MASK after),
    so `listener` always receives whole states int32[B, L].
    """

    def __init__(self, listener: Callable[[np.ndarray], None], text: np.ndarray):
        self.listener, self.text = listener, text

    def __call__(self, start: int, states: np.ndarray) -> None:
        self.place(start, states)

    def place(self, start: int, states: np.ndarray) -> None:
        start = int(start)
        self.text[:, start : start + states.shape[1]] = states
        self.listener(self.text.copy())


def map_lanes(draw_lane: Callable, seeds: jax.Array, lanes: jax.Array, *per_lane) -> tuple:
    """draw_lane(key, *lane_args) on every lane, each a batch of one, under ``jax.vmap`` over ``AXIS``.

    Args:
      draw_lane: (key, *args of one lane) -> pytree; runs traced.
      seeds, lanes: uint32[B]: lane b's key is fold_in(key(seeds[b]), lanes[b]).
      per_lane: arrays of leading dimension B, mapped with the lanes.
    """

    def one(seed, lane, *args):
        return draw_lane(jax.random.fold_in(jax.random.key(seed), lane), *args)

    return jax.vmap(one, axis_name=AXIS)(seeds, lanes, *per_lane)


@dataclasses.dataclass(frozen=True)
class LaneProgram:
    """A model kind's batched sampler, as ``sedd serve`` runs it.

    Attributes:
      fn: a jitted function, called with (state, seeds uint32[B], lanes
        uint32[B], mask bool[B, L], tokens int32[B, L], temperature
        float32[B], top_p float32[B], batch_id int32[]) and the keywords
        `static` -> (ids int32[B, L], frames int32[B, F, L] or None, nfe
        int32[B]): each lane drawn alone (``map_lanes``), the prompt's
        positions fixed; nfe the network calls each lane needed. With `live`
        its calls ``observe`` their states.
      static: its static keyword arguments.
      frames: (frames int[n, F, L], start, length, steps) -> (frames int[n, F', L],
        calls int[F'], labels): the frames that show the completion positions
        [start, start + length), the network calls made before each, and
        labels, None (each frame is the whole draw) or F' dicts naming the
        part of the text each frame draws (a block model: {"block": i}).
      listen: (listener, text int32[B, L]) -> the object registered with
        ``listening`` while a live batch runs, which calls listener(states
        int32[B, L], *more) (``Placed``; ``sedd.sampling.rounds.Rounds``).
      report: None, or (stats of a completion's lanes, its length) -> a dict
        added to the completion's answer, where `nfe` above is a dict of
        per-lane stats int[B, ...] holding "nfe".
    """

    fn: Callable
    static: dict
    frames: Callable
    listen: Callable = Placed
    report: Callable | None = None

    def compile(self, *args) -> jax.stages.Compiled:
        """The program compiled ahead of time for these arguments' shapes (its owner keeps and drops it)."""
        return self.fn.lower(*args, **self.static).compile()


@functools.lru_cache(maxsize=None)
def _observed(score_fn: Callable, live: bool) -> Callable:
    """score_fn with params = (state, batch id): with `live` each call first ``observe``s its states."""

    def fn(params, x, sigma):
        state, batch_id = params
        if live:
            observe(batch_id, jnp.int32(0), x)
        return score_fn(state, x, sigma)

    return fn


@functools.partial(
    jax.jit,
    static_argnames=("score_fn", "graph", "noise", "steps", "sampler", "eps", "categorical", "trajectory", "live"),
)
def sample_lanes(
    state,
    seeds,
    lanes,
    mask,
    tokens,
    temperature,
    top_p,
    batch_id,
    *,
    score_fn,
    graph,
    noise,
    steps,
    sampler,
    eps,
    categorical,
    trajectory,
    live,
):
    """``LaneProgram.fn`` of full-sequence sampling: ``run_loop`` per lane, its T and top_p traced (``map_lanes``).

    score_fn: (state, x, sigma) -> log-score, a stable object (jit's cache key).
    Returns (ids, traj, nfe): traj int32[B, N + 1, L], the state before each
    step, or None without trajectory; nfe int32[B], the calls each lane's
    sampler made, counted as if it ran alone (the batch skips a call only
    when no lane needs it).
    """
    fn = _observed(score_fn, live)
    length = mask.shape[1]
    options = Options.make(
        categorical=categorical, return_trajectory=trajectory, return_stats=True, axis_name=AXIS
    ).checked(sampler, graph, True)
    times = time_grid(None, steps, eps)

    def one(key, m, t, temp, p):  # (1, L)
        x, traj, stats = run_loop(
            key,
            times,
            m[None],
            t[None],
            (state, batch_id),
            score_fn=fn,
            graph=graph,
            noise=noise,
            shape=(1, length),
            sampler=get_sampler(sampler),
            denoise=True,
            options=options,
            shaping=(temp, p),
        )
        traj = None if traj is None else traj[:, 0]  # (N + 1, L)
        return x[0], traj, stats["nfe_per_sample"][0]  # (L,), ..., ()

    return map_lanes(one, seeds, lanes, mask, tokens, temperature, top_p)


def full_sequence_frames(traj: np.ndarray, start: int, length: int, steps: int, *, mask_id: int | None):
    """``LaneProgram.frames`` of full-sequence sampling: the N states before each step, the calls before each.

    The calls are the most any lane made: a step of the absorbing graph whose
    state has no mask left makes none; the uniform graph (mask_id None) calls
    the network at every step.
    """
    if mask_id is None:
        return traj[:, :steps], np.arange(steps), None
    pending = (traj[:, :steps] == mask_id).any(-1)  # (n, N): step j needed the network
    calls = np.concatenate([[0], np.cumsum(pending, axis=1).max(0)])
    return traj[:, :steps], calls[:steps], None


def full_sequence_program(
    score_fn: Callable,
    graph,
    noise,
    *,
    steps: int,
    sampler: str,
    eps: float,
    categorical: str,
    trajectory: bool,
    live: bool,
) -> LaneProgram:
    """The ``LaneProgram`` of a full-sequence SEDD network (score_fn: (state, x, sigma) -> log-score)."""
    static = dict(locals())  # every argument, a static one of ``sample_lanes``
    mask_id = graph.mask if graph.absorb else None
    return LaneProgram(sample_lanes, static, functools.partial(full_sequence_frames, mask_id=mask_id))
