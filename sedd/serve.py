"""`sedd serve`: an OpenAI-style completions server for a run directory, and its playground page.

  POST /v1/completions   OpenAI's request and response shapes, plus `steps`,
                         `sampler` and `diffusing` (one SSE event per denoising step)
  GET  /v1/models        the one model served
  GET  /health           liveness and the engine's queue
  GET  /                 the playground (sedd/static/playground.html)

A completion is one reverse diffusion over the model's whole sequence (length
L). The prompt fixes the first P positions, the next M = max_tokens positions
are the completion, the suffix (if any) fixes the S positions after them, and
whatever lies beyond P + M + S is sampled too and cut from the answer, so
prompt and suffix are always conditioned on exactly (the absorbing graph keeps
fixed tokens fixed; see ``sedd.sampling.sample``).

Requests go to an ``Engine``: one worker thread that runs the compiled
sampler. Requests that can share a program (same steps and sampler, and the
same kind of answer: plain, diffusing frames, or streamed as it settles) that
arrive within a short collection window run as one batch; every row has its
own key ``fold_in(key(seed), row)`` and its own temperature and top_p (traced
values, so no value compiles a program), and a seeded request gives the same
text whatever it was batched with. Batch sizes are rounded up to a few sizes
(``batch_size``) so a few compiled programs serve every load, and at most
``Limits.max_programs`` are kept. The queue is bounded (503 when full), a
request waits at most ``timeout_s`` seconds (then 503), and one whose client
hung up is dropped before it runs.

What a request meets before any of that (``Gate``): a Host header that must
name this server (localhost by default: a page of another site cannot reach
it through DNS rebinding), an optional API key (``Authorization: Bearer``),
a JSON body (``Content-Type: application/json``, so a page cannot post to it
cross-origin without a preflight) that arrives within ``body_timeout_s``.
docs/serving.md shows how to call it and what to set before exposing it.
Shapes: B batch rows, L length, N steps, V vocabulary, D = graph.dim.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import gc
import itertools
import json
import logging
import math
import os
import secrets
import sys
import threading
import time
import uuid
from importlib import resources
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

# The optional extra `sedd-jax[serve]`: only `sedd serve` imports this module, nothing else in sedd does.
import uvicorn
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from sedd import block, kinds, runs, sampling

MASK_CHAR = "\u2591"  # "░": how a masked position shows in the text of a diffusing frame
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")  # the Host names answered by default
API_KEY_ENV = "SEDD_API_KEY"  # read when --api_key is not given (a key on the command line shows in `ps`)

logger = logging.getLogger("sedd.serve")


# --------------------------------------------------------------------------- limits and errors


def _check_number(name: str, value, low: float, strict: bool, integer: bool) -> None:
    """Raise ValueError unless value is a finite number (an integer when asked) >= low (> low when strict)."""
    types = (int,) if integer else (int, float)
    ok = isinstance(value, types) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < low or (strict and value == low):
        what = "an integer" if integer else "a finite number"
        raise ValueError(f"{name} must be {what} {'>' if strict else '>='} {low:g}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the server accepts and how it batches; each value is checked when the Limits are made.

    Attributes:
      max_steps: most denoising steps a request may ask for.
      max_n: most completions (`n`) per request.
      max_batch: most rows in one batch of the engine (>= max_n).
      max_queue: most requests waiting; beyond it a request gets 503.
      timeout_s: most seconds a request waits for its result; then 503.
      window_s: how long the engine waits for more requests to batch with the first.
      max_body_bytes: largest request body; beyond it 413.
      max_programs: compiled programs kept (one per batch size, steps, sampler
        and kind of answer); beyond it the least recently used is dropped.
      header_timeout_s: seconds a connection may take to send a request's
        headers (from its opening or its previous answer); then it is closed.
      body_timeout_s: seconds a request's body may take to arrive; then 408.
    """

    max_steps: int = 1024
    max_n: int = 16
    max_batch: int = 64
    max_queue: int = 256
    timeout_s: float = 120.0
    window_s: float = 0.005
    max_body_bytes: int = 65536
    max_programs: int = 64
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0

    def __post_init__(self):
        for name in ("max_steps", "max_n", "max_batch", "max_queue", "max_body_bytes", "max_programs"):
            _check_number(name, getattr(self, name), 1, strict=False, integer=True)
        for name in ("timeout_s", "header_timeout_s", "body_timeout_s"):
            _check_number(name, getattr(self, name), 0, strict=True, integer=False)
        _check_number("window_s", self.window_s, 0, strict=False, integer=False)


class APIError(Exception):
    """An error answered in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers

    def response_body(self) -> dict:
        """The error object: {"message", "type", "param", "code"}."""
        return {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.response_body()}, status_code=self.status, headers=self.headers)


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


def _validation_error(e: ValidationError) -> APIError:
    """The first problem pydantic found, as a 400 naming the field."""
    err = e.errors()[0]
    param = ".".join(str(p) for p in err["loc"]) or None
    if err["type"] == "extra_forbidden":
        return APIError(400, f"unknown field {param!r}", param, "unknown_field")
    if err["type"] == "json_invalid":
        return APIError(400, f"the body is not valid JSON: {err['msg']}", None, "invalid_json")
    if err["type"] == "missing":
        return APIError(400, f"{param} is required", param, "missing_field")
    return APIError(400, f"{param}: {err['msg']} (got {err.get('input')!r})", param, "invalid_value")


# --------------------------------------------------------------------------- the request


class CompletionRequest(BaseModel):
    """The body of POST /v1/completions: OpenAI's fields, plus steps, sampler and diffusing."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    prompt: str = ""
    suffix: str | None = None
    max_tokens: int | None = Field(None, ge=1)  # default: up to the end of the model's length
    n: int = Field(1, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, lt=2**32)
    stop: str | list[str] | None = None
    stream: bool = False
    user: str | None = None
    steps: int | None = Field(None, ge=1)
    sampler: str | None = None
    diffusing: bool = False


@dataclasses.dataclass
class Plan:
    """A validated request, in token positions: prompt [0, P), completion [P, P + M), suffix after."""

    n: int
    steps: int
    sampler: str
    seed: int
    mask: np.ndarray  # bool[L], True where the token is given
    tokens: np.ndarray  # int32[L]
    start: int  # P
    length: int  # M
    suffix_start: int  # P + M
    suffix_len: int  # S
    temperature: float = 1.0  # on the denoiser (sedd.sampling.sample); 0 = argmax
    top_p: float = 1.0  # nucleus of the denoiser


def plan(run: runs.Run, req: CompletionRequest, limits: Limits) -> Plan:
    """Check a request against the model and the limits, and place prompt, completion and suffix.

    Raises:
      APIError: 400 naming the field at fault.
    """
    s = run.config.sampling
    sampler = req.sampler or s.predictor
    if sampler not in sampling.PREDICTORS:
        raise APIError(400, f"unknown sampler {sampler!r}; expected one of {sorted(sampling.PREDICTORS)}",
                       "sampler", "unknown_sampler")
    kind = "absorbing" if run.graph.absorb else "uniform"
    if kind not in sampling.PREDICTORS[sampler].graphs:
        raise APIError(400, f"sampler {sampler!r} does not run on this model's {kind} graph", "sampler",
                       "unsupported_value")
    for name, value in (("temperature", req.temperature), ("top_p", req.top_p)):
        if value != 1.0 and not (run.graph.absorb and name in sampling.PREDICTORS[sampler].honours):
            raise APIError(400, f"{name}={value} is not supported by sampler {sampler!r} on this model's "
                                f"{kind} graph (it acts on the absorbing graph's denoiser); only {name}=1.0 is",
                           name, "unsupported_value")
    steps = s.steps if req.steps is None else req.steps
    if steps > limits.max_steps:
        raise APIError(400, f"steps={steps} is over this server's limit of {limits.max_steps}", "steps",
                       "steps_over_limit")
    if req.n > limits.max_n:
        raise APIError(400, f"n={req.n} is over this server's limit of {limits.max_n}", "n", "n_over_limit")
    encoded = {}
    for name, text in (("prompt", req.prompt), ("suffix", req.suffix or "")):
        try:
            encoded[name] = np.asarray(run.tokenizer.encode(text), np.int32) if text else np.zeros(0, np.int32)
        except ValueError as e:
            raise APIError(400, f"{name}: {e}", name, "unencodable_text") from None
    pre, suf, L = encoded["prompt"], encoded["suffix"], run.seq_len
    if len(suf) and run.kind.prefix_only:
        raise APIError(400, f"a suffix cannot be honoured by this {run.kind.name} model: it writes text after "
                            "a prompt only (it never saw text after a block)", "suffix", "unsupported_value")
    room = L - len(pre) - len(suf)
    if room < 1:
        raise APIError(400, f"prompt ({len(pre)} tokens) + suffix ({len(suf)} tokens) leave no room in the "
                            f"model's sequence length of {L} tokens", "prompt", "context_length_exceeded")
    length = room if req.max_tokens is None else req.max_tokens
    if length > room:
        raise APIError(400, f"max_tokens={length} is over the {room} tokens the model's length of {L} leaves "
                            f"after a prompt of {len(pre)} and a suffix of {len(suf)} tokens", "max_tokens",
                       "context_length_exceeded")
    mask, tokens = np.zeros(L, bool), np.zeros(L, np.int32)
    p, q = len(pre), len(pre) + length
    mask[:p], tokens[:p] = True, pre
    mask[q:q + len(suf)], tokens[q:q + len(suf)] = True, suf
    seed = secrets.randbits(32) if req.seed is None else req.seed
    return Plan(req.n, steps, sampler, seed, mask, tokens, p, length, q, len(suf), float(req.temperature),
                float(req.top_p))


# --------------------------------------------------------------------------- the batched sampler


_LISTENERS: dict[int, Callable[[np.ndarray], None]] = {}
"""Batch id -> what receives its states while it runs (``_deliver``); set by ``Engine.run_batch``."""
_BATCH_IDS = itertools.count()


def _deliver(batch_id, states) -> None:
    """The host end of the per-call hook: hand states int32[B, L] to the listener of the running batch.

    Runs on XLA's thread inside the compiled program, so it never raises (an
    exception here would fail the whole batch).
    """
    listener = _LISTENERS.get(int(batch_id))
    if listener is None:
        return
    try:
        listener(np.asarray(states))
    except Exception:  # noqa: BLE001  a failing listener (a closed event loop) must not fail the batch
        logger.exception("sedd serve: a stream's listener failed")


def _anywhere(flag: jax.Array) -> jax.Array:
    """bool[]: whether any row of the vmapped batch ("rows") has `flag`: one branch for the whole batch."""
    return jax.lax.psum(flag.astype(jnp.int32), "rows") > 0


def _nucleus(q: jax.Array, top_p: jax.Array) -> jax.Array:
    """q restricted to its top_p nucleus and renormalised (float32[..., V]): ``sedd.sampling.nucleus``'s set.

    A token y is kept when the mass of the tokens more probable than it,
    f(q_y) with f(t) = sum_z q_z [q_z > t], is under top_p; f decreases, so
    the kept tokens are those with q_y >= t*, the least t with f(t) < top_p.
    t* is found by bisection on the bits of a float32 (their integer order is
    the order of non-negative floats; 32 halvings make it exact) instead of
    a sort of V per position, which XLA's CPU backend runs about 7x slower.
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


def _tempered(log_score: jax.Array, x: jax.Array, temperature: jax.Array, top_p: jax.Array, graph) -> jax.Array:
    r"""The log-score with this row's temperature T and nucleus top_p applied to the denoiser at masked positions.

    The law of ``sedd.sampling.Context.score``, with T and top_p traced: at a
    masked position the token log-scores l_y (y < V) become

        l'_y = logsumexp(l) + log q_y,   q ∝ softmax(l / T) on its top_p nucleus   (T = 0: one-hot of the argmax),

    which keeps the step's unmasking mass sum_y e^{l_y} and shares it as q
    (``Context.denoiser``; the nucleus by ``_nucleus``), so a sampler run at
    T = 1, top_p = 1 on l' draws what it would have drawn from q. Rows at
    T = 1, top_p = 1 keep their log-score as it is, and when no row of the
    batch asks for either (or for a top_p < 1) nothing of it is computed.

    Args:
      log_score: float[1, L, D] this row's network output; x: int32[1, L] its state.
      temperature, top_p: float32[] this row's values.
    Returns:
      float[1, L, D], log_score's dtype.
    """
    v = graph.vocab_size
    asks = (temperature != 1) | (top_p < 1)  # ()

    def shaped(log_score):
        logits = log_score[..., :v].astype(jnp.float32)  # (1, L, V)
        argmax = jax.nn.one_hot(jnp.argmax(logits, -1), v, dtype=jnp.float32)
        scaled = logits / jnp.where(temperature == 0, 1.0, temperature)
        q = jnp.where(temperature == 0, argmax, jax.nn.softmax(scaled, -1))
        q = jax.lax.cond(_anywhere(top_p < 1), lambda q: jnp.where(top_p < 1, _nucleus(q, top_p), q),
                         lambda q: q, q)
        mass = jax.nn.logsumexp(logits, axis=-1, keepdims=True)  # (1, L, 1)
        tokens = jnp.where(q > 0, mass + jnp.log(jnp.where(q > 0, q, 1.0)), -jnp.inf)
        out = jnp.concatenate([tokens, log_score[..., v:].astype(jnp.float32)], -1)  # (1, L, D)
        return jnp.where((x == graph.mask)[..., None] & asks, out, log_score).astype(log_score.dtype)

    return jax.lax.cond(_anywhere(asks), shaped, lambda s: s, log_score)


@functools.lru_cache(maxsize=None)
def _serving_score(graphdef, graph, live: bool):
    """The score function of a served row: (params, x, sigma) -> log-score, params = (state, T, top_p, batch id).

    The network of ``sedd.kinds.params_score_fn``, its output tempered per row
    (``_tempered``; the absorbing graph only: the server refuses T != 1 and
    top_p != 1 elsewhere). With `live`, each call first hands the states of
    all rows of the batch to the host (``_deliver``): one callback a call, the
    rows gathered over the vmapped axis, whatever the batch size.
    """
    network = kinds.params_score_fn(graphdef)

    def score_fn(params, x, sigma):
        state, temperature, top_p, batch_id = params
        if live:
            jax.debug.callback(_deliver, batch_id, jax.lax.all_gather(x[0], "rows"))  # (B, L)
        log_score = network(state, x, sigma)
        return _tempered(log_score, x, temperature, top_p, graph) if graph.absorb else log_score

    return score_fn


@functools.partial(jax.jit, static_argnames=("graphdef", "graph", "noise", "steps", "predictor", "eps",
                                             "categorical", "trajectory", "live"))
def _sample_rows(state, seeds, rows, mask, tokens, temperature, top_p, batch_id, *, graphdef, graph, noise, steps,
                 predictor, eps, categorical, trajectory, live):
    """Each row sampled with its own key fold_in(key(seed), row), temperature and top_p: the same text in any batch.

    Args:
      state: (params, rest) of the network.
      seeds, rows: uint32[B] each.
      mask: bool[B, L]; tokens: int32[B, L] (``sedd.sampling.sample``'s fixed_mask / fixed_tokens).
      temperature, top_p: float32[B], traced: one program serves every value.
      batch_id: int32[], the batch's key in ``_LISTENERS`` (with `live`).
    Returns:
      (x, traj, nfe): x int32[B, L]; traj int32[B, N + 1, L], the state before
      each step, or None without trajectory; nfe int32[B], the network calls
      each row's sampler made, counted as if it ran alone (the batch skips a
      call only when no row needs it).
    """
    score_fn = _serving_score(graphdef, graph, live)
    length = mask.shape[1]

    def one(seed, row, m, t, temp, p):  # one row as a batch of 1: (1, L)
        key = jax.random.fold_in(jax.random.key(seed), row)
        out = sampling.sample(key, score_fn, graph, noise, (1, length), steps, predictor, eps=eps,
                              fixed_mask=m[None], fixed_tokens=t[None], score_params=(state, temp, p, batch_id),
                              categorical=categorical, return_trajectory=trajectory, return_stats=True,
                              axis_name="rows")
        traj = None if out.trajectory is None else out.trajectory[:, 0]  # (N + 1, L)
        return out.tokens[0], traj, out.stats["nfe_per_sample"][0]  # (L,), ..., ()

    # axis_name: the network runs once a step on all rows with unbatched weights (not once per row).
    return jax.vmap(one, axis_name="rows")(seeds, rows, mask, tokens, temperature, top_p)


class _Placed:
    """A block run's listener: the whole text of each row, the current block's states placed into it.

    A block run's network calls see only the block being drawn; the host keeps
    the rest (the prompt, the blocks committed, MASK after) and hands the
    listener the whole state int32[B, L] at each call, as a SEDD run does.
    """

    def __init__(self, listener: Callable[[np.ndarray], None], text: np.ndarray):
        self.listener, self.text = listener, text

    def place(self, start: int, states: np.ndarray) -> None:
        self.text[:, start:start + states.shape[1]] = states
        self.listener(self.text.copy())


def _deliver_block(batch_id, start, states) -> None:
    """``_deliver`` for a block run: states int32[B, b] of the block that starts at position `start`."""
    listener = _LISTENERS.get(int(batch_id))
    if listener is None:
        return
    try:
        listener.place(int(start), np.asarray(states))
    except Exception:  # noqa: BLE001  as in _deliver
        logger.exception("sedd serve: a stream's listener failed")


@functools.lru_cache(maxsize=None)
def _serving_scorer(graphdef, graph, window: int, live: bool) -> block.Scorer:
    """``_serving_score`` for a block run: ``block.network_scorer`` with params = (state, T, top_p, batch id).

    The score of the current block is tempered per row; with `live`, each
    call (a sampler step or the commit of the clean block) first hands the
    block's states of all rows to the host (``_deliver_block``).
    """
    base = block.network_scorer(graphdef, window)

    def tell(batch_id, ctx, x):
        start = jax.lax.all_gather(ctx[2], "rows")[0] % window  # the block's first position, the same on every row
        jax.debug.callback(_deliver_block, batch_id, start, jax.lax.all_gather(x[0], "rows"))  # (B, b)

    def score(params, ctx, x, sigma):
        state, temperature, top_p, batch_id = params
        if live:
            tell(batch_id, ctx, x)
        return _tempered(base.score(state, ctx, x, sigma), x, temperature, top_p, graph)

    def commit(params, ctx, x):
        if live:
            tell(params[3], ctx, x)
        return base.commit(params[0], ctx, x)

    return block.Scorer(lambda params, batch: base.init(params[0], batch), score, commit)


@functools.partial(jax.jit, static_argnames=("graphdef", "graph", "noise", "steps", "predictor", "eps",
                                             "categorical", "trajectory", "live", "block_size"))
def _sample_block_rows(state, seeds, rows, mask, tokens, temperature, top_p, batch_id, *, graphdef, graph, noise,
                       steps, predictor, eps, categorical, trajectory, live, block_size):
    """``_sample_rows`` for a block run (``sedd.block.draw`` per row, blocks of block_size).

    The prompt is a prefix (``plan`` refuses a suffix). With trajectory, traj
    is int32[B, F, L]: the whole text at each state of each block's sampler
    in turn, then the text (``sedd.block._draw_blocks``'s frames).
    """
    length = mask.shape[1]
    scorer = _serving_scorer(graphdef, graph, length, live)
    options = sampling.Options.make(categorical=categorical, return_trajectory=trajectory, return_stats=True,
                                    axis_name="rows").checked(predictor, graph, True)
    times = sampling._time_grid(None, steps, eps)

    def one(seed, row, m, t, temp, p):  # one row as a batch of 1: (1, L)
        key = jax.random.fold_in(jax.random.key(seed), row)
        text, frames, _, nfe_row, _ = block.draw(
            key, scorer, (state, temp, p, batch_id), graph, noise, m[None], jnp.where(m, t, 0)[None], times,
            block_size=block_size, predictor=predictor, denoise=True, options=options)
        return text[0], None if frames is None else frames[:, 0], nfe_row[0]

    return jax.vmap(one, axis_name="rows")(seeds, rows, mask, tokens, temperature, top_p)


def batch_size(rows: int) -> int:
    """The rows a batch is padded to: a power of two up to 8, then a multiple of 8.

    Each size is one compiled program; multiples of 8 past 8 waste at most 7
    rows of compute where powers of two would waste up to half the batch.
    """
    return 1 << (rows - 1).bit_length() if rows <= 8 else -(-rows // 8) * 8


def batch_sizes(max_batch: int) -> list[int]:
    """Every size ``batch_size`` gives for 1 .. max_batch rows."""
    return sorted({batch_size(r) for r in range(1, max_batch + 1)})


@dataclasses.dataclass
class Job:
    """A request waiting for the engine; `future` receives its result.

    `progress`, when given, is called as progress(i, ids) with the state
    int32[L] of the job's row i at each network call of its batch, from XLA's
    thread while the batch runs (it must be quick and thread-safe).
    """

    plan: Plan
    trajectory: bool  # also return the states along the way (a diffusing request)
    future: concurrent.futures.Future
    progress: Callable[[int, np.ndarray], None] | None = None

    @functools.cached_property
    def program(self) -> tuple:
        """Jobs with equal programs can run in one batch (temperature and top_p are per row)."""
        return (self.plan.steps, self.plan.sampler, self.trajectory, self.progress is not None)


class Busy(Exception):
    """The engine's queue is full."""


class Engine:
    """One worker thread running batches of jobs that share a compiled program.

    The oldest waiting job always runs next, so none waits behind others for
    ever; jobs arriving within `window_s` of it with the same program join its
    batch (up to max_batch rows), padded to one of a few sizes (``batch_size``).
    The compiled programs are kept in least-recently-used order, at most
    `max_programs` of them (``programs``); ``compiles`` counts the compilations.
    """

    def __init__(self, run: runs.Run, limits: Limits):
        self.run, self.limits = run, limits
        self.block_size = run.kind.block_size if run.kind.prefix_only else None  # a block run's programs
        self.pending: collections.deque[Job] = collections.deque()
        self.rows = 0  # rows of the jobs in `pending` (those given up on included, until dropped)
        self.cond = threading.Condition()
        self.stopping = False
        self.batches = 0
        self.programs: collections.OrderedDict[tuple, jax.stages.Compiled] = collections.OrderedDict()
        self.compiles = 0
        self.thread = threading.Thread(target=self._loop, name="sedd-serve-engine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join(timeout=30)

    def submit(self, plan: Plan, trajectory: bool,
               progress: Callable[[int, np.ndarray], None] | None = None) -> concurrent.futures.Future:
        """Queue a job; its future gets (ids int32[n, L], trajectory int32[n, N + 1, L] or None, info dict)."""
        job = Job(plan, trajectory, concurrent.futures.Future(), progress)
        with self.cond:
            if len(self.pending) >= self.limits.max_queue:  # purge the jobs given up on before refusing
                self.pending = collections.deque(j for j in self.pending if not j.future.cancelled())
                self.rows = sum(j.plan.n for j in self.pending)
            if len(self.pending) >= self.limits.max_queue:
                raise Busy(f"the server is busy: {len(self.pending)} requests are waiting "
                           f"(limit {self.limits.max_queue}); retry later")
            self.pending.append(job)
            self.rows += plan.n
            # Wake the engine only when it may act: a first job to start a window on, or rows enough for a
            # full batch. Waking it at every arrival cost a scan of the queue and a GIL hand-over each.
            if len(self.pending) == 1 or self.rows >= self.limits.max_batch:
                self.cond.notify_all()
        return job.future
    def _take(self) -> list[Job] | None:
        """The next batch: the oldest job and the jobs of its program that came within the window."""
        with self.cond:
            while not self.pending and not self.stopping:
                self.cond.wait()
            if self.stopping:
                return None
            # Jobs whose callers gave up (timeout, closed connection) leave the queue unrun.
            while self.pending and self.pending[0].future.cancelled():
                self.rows -= self.pending.popleft().plan.n
            if not self.pending:
                return []
            program = self.pending[0].program
            deadline = time.monotonic() + self.limits.window_s
            while not self.stopping:
                left = deadline - time.monotonic()
                full = self.rows >= self.limits.max_batch and self._rows_waiting(program) >= self.limits.max_batch
                if full or left <= 0:
                    break
                self.cond.wait(left)
            # The oldest jobs of the program, up to max_batch rows; the scan stops once the batch is full,
            # so a long queue costs a batch nothing (one-at-a-time serving takes one job off its head).
            batch, rows, keep = [], 0, collections.deque()
            while self.pending and rows < self.limits.max_batch:
                job = self.pending.popleft()
                if job.future.cancelled():
                    self.rows -= job.plan.n
                elif job.program == program and rows + job.plan.n <= self.limits.max_batch:
                    batch.append(job)
                    rows += job.plan.n
                    self.rows -= job.plan.n
                else:
                    keep.append(job)
            keep.extend(self.pending)
            self.pending = keep
        # A caller may give up between the purge and here.
        return [j for j in batch if j.future.set_running_or_notify_cancel()]

    def _rows_waiting(self, program: tuple) -> int:
        """Rows of the live waiting jobs of `program`, counted up to max_batch (call holding `cond`)."""
        rows = 0
        for job in self.pending:
            if job.program == program and not job.future.cancelled():
                rows += job.plan.n
                if rows >= self.limits.max_batch:
                    break
        return rows

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            if not batch:
                continue
            try:
                results = self.run_batch(batch)
            except Exception as e:  # a failed batch fails its requests, not the server
                for job in batch:
                    job.future.set_exception(e)
                continue
            for job, result in zip(batch, results):
                job.future.set_result(result)

    def run_batch(self, batch: list[Job]) -> list[tuple]:
        """Sample the rows of all jobs of the batch in one call of the compiled program."""
        run = self.run
        seeds, rows, masks, tokens, temperature, top_p = [], [], [], [], [], []
        live = {}  # batch row -> (job, its row) for the jobs that watch their rows
        for job in batch:
            for i in range(job.plan.n):
                if job.progress is not None:
                    live[len(seeds)] = (job, i)
                seeds.append(job.plan.seed)
                rows.append(i)
                masks.append(job.plan.mask)
                tokens.append(job.plan.tokens)
                temperature.append(job.plan.temperature)
                top_p.append(job.plan.top_p)
        used = len(seeds)
        size = batch_size(used)
        for _ in range(size - used):  # padding rows: row 0's conditioning at T = 1, top_p = 1
            seeds.append(0), rows.append(0), masks.append(masks[0]), tokens.append(tokens[0])
            temperature.append(1.0), top_p.append(1.0)
        batch_id = next(_BATCH_IDS) & 0x7FFFFFFF
        args = ((run.params, run.rest), jnp.asarray(seeds, jnp.uint32), jnp.asarray(rows, jnp.uint32),
                jnp.asarray(np.stack(masks)), jnp.asarray(np.stack(tokens)), jnp.asarray(temperature, jnp.float32),
                jnp.asarray(top_p, jnp.float32), jnp.int32(batch_id))
        t0 = time.perf_counter()
        program, compiled = self._program((size, *batch[0].program), args)
        if live:
            listener = lambda states: [job.progress(i, states[k]) for k, (job, i) in live.items()]  # noqa: E731
            if self.block_size:  # the host holds the whole text; the calls see one block
                texts = np.where(np.stack(masks), np.stack(tokens), run.graph.mask).astype(np.int32)
                listener = _Placed(listener, texts)
            _LISTENERS[batch_id] = listener
        try:
            out = jax.tree.map(np.asarray, program(*args))  # the listener is called while this runs
        finally:
            _LISTENERS.pop(batch_id, None)
        seconds = time.perf_counter() - t0
        ids, traj, nfe = out
        self.batches += 1
        info = {"batch_rows": used, "padded_rows": size, "seconds": seconds,
                "compiled": compiled}  # True: `seconds` includes compiling the program
        results, i = [], 0
        for job in batch:
            n = job.plan.n
            # nfe: the most network calls any of the job's rows needed (measured by the sampler)
            results.append((ids[i:i + n], None if traj is None else traj[i:i + n],
                            {**info, "nfe": int(nfe[i:i + n].max())}))
            i += n
        return results

    def _program(self, key: tuple, args: tuple) -> tuple[jax.stages.Compiled, bool]:
        """(the compiled program of key = (rows, steps, sampler, trajectory, live), whether it was compiled now).

        Compiled ahead of time and kept here, not in jit's own cache, so that
        dropping the least recently used beyond ``max_programs`` frees it
        (with JAX's caches, cleared then).
        """
        program = self.programs.get(key)
        if program is not None:
            self.programs.move_to_end(key)
            return program, False
        _, steps, sampler, trajectory, live = key
        run, s = self.run, self.run.config.sampling
        rows_fn, extra = _sample_rows, {}
        if self.block_size:
            rows_fn, extra = _sample_block_rows, {"block_size": self.block_size}
        program = rows_fn.lower(*args, graphdef=run.graphdef, graph=run.graph, noise=run.noise, steps=steps,
                                predictor=sampler, eps=float(s.eps), categorical=s.categorical,
                                trajectory=trajectory, live=live, **extra).compile()
        self.programs[key] = program
        self.compiles += 1
        if len(self.programs) > self.limits.max_programs:
            while len(self.programs) > self.limits.max_programs:
                self.programs.popitem(last=False)
            # JAX's own trace and lowering caches keep what a dropped program was built from (~18 MiB a
            # program of the tiny run); the kept programs are ours and are not touched by clearing them.
            jax.clear_caches()
        return program, True

    def warmup(self, steps: int | None = None, sampler: str | None = None, trajectory: bool = False) -> None:
        """Compile the program of every batch size (``batch_sizes(max_batch)``) before serving."""
        s = self.run.config.sampling
        L = self.run.seq_len
        p = Plan(1, steps or s.steps, sampler or s.predictor, 0, np.zeros(L, bool), np.zeros(L, np.int32), 0, L, L, 0)
        for size in batch_sizes(self.limits.max_batch):
            self.run_batch([Job(dataclasses.replace(p, n=size), trajectory, concurrent.futures.Future())])
        self.batches = 0

    @property
    def queued(self) -> int:
        return len(self.pending)


# --------------------------------------------------------------------------- texts


class Texts:
    """Token ids of a run as completion text and as the frames of a diffusing stream."""

    def __init__(self, run: runs.Run):
        self.run = run
        self.tok = run.tokenizer
        self.mask_id = run.graph.dim - 1 if run.graph.absorb else None
        self.eos_id = getattr(self.tok, "eos_id", None)
        self.pieces: dict[int, str] = {}

    def piece(self, i: int) -> str:
        """The text of one token id (MASK_CHAR for the mask), decoded once."""
        if i not in self.pieces:
            self.pieces[i] = MASK_CHAR if i == self.mask_id else self.tok.decode([i])
        return self.pieces[i]

    def completion(self, ids: np.ndarray, p: Plan, stop: list[str]) -> tuple[str, str]:
        """(text, finish_reason) of one row int[L]: the completion span, cut at EOS or a stop string."""
        span = ids[p.start:p.start + p.length]
        reason = "length"
        if self.eos_id is not None and (span == self.eos_id).any():
            span, reason = span[: int(np.argmax(span == self.eos_id))], "stop"
        text = self.tok.decode(span) if len(span) else ""
        cuts = [text.find(s) for s in stop if s and s in text]
        if cuts:
            text, reason = text[: min(cuts)], "stop"
        return text, reason

    def frame(self, ids: np.ndarray, p: Plan, prompt: str, suffix: str) -> tuple[str, list[int]]:
        """(text, masked character offsets) of one state int[L]: prompt + span + suffix, masks shown as MASK_CHAR."""
        out, masked, at = [prompt], [], len(prompt)
        for i in ids[p.start:p.start + p.length].tolist():
            s = self.piece(int(i))
            if i == self.mask_id:
                masked.append(at)
            out.append(s)
            at += len(s)
        out.append(suffix)
        return "".join(out), masked


def settles(run: runs.Run, sampler: str) -> bool:
    """Whether a completion position, once unmasked, keeps its token until the end of the sampling.

    True on the absorbing graph for every sampler but ReMDM, which masks
    decoded tokens again; on the uniform graph no token is settled before the
    end. Where it holds, ``Streamed`` can send text while the sampling runs.
    """
    return run.graph.absorb and not isinstance(sampling.PREDICTORS[sampler], sampling.ReMDM)


class Streamed:
    """The text of each choice of a `stream: true` request, sent as it can no longer change.

    With a sampler that ``settles``, the longest prefix of the completion
    without a mask is final; its text, cut at an end-of-text token or a
    `stop` string, is sent except for the last len(longest stop) - 1
    characters (a stop string could still begin there) and a trailing U+FFFD
    (a character whose bytes are not all unmasked yet). So the chunks a choice
    receives always concatenate to its final text.
    """

    def __init__(self, texts: Texts, p: Plan, stop: list[str]):
        self.texts, self.p, self.stop = texts, p, [s for s in stop if s]
        self.sent = [""] * p.n
        self.done = [False] * p.n
        self.hold = max((len(s) for s in self.stop), default=1) - 1

    def update(self, i: int, ids: np.ndarray) -> str:
        """The text choice i adds with its state ids int[L] (often ""); it is then counted as sent."""
        if self.done[i]:
            return ""
        p, tx = self.p, self.texts
        span = ids[p.start:p.start + p.length]
        masked = span == tx.mask_id
        final = not masked.any()  # no mask left: the denoise changes nothing, this is the answer
        span = span[: int(np.argmax(masked))] if not final else span
        if tx.eos_id is not None and (span == tx.eos_id).any():
            span, final = span[: int(np.argmax(span == tx.eos_id))], True
        text = tx.tok.decode(span) if len(span) else ""
        cut = min((text.find(s) for s in self.stop if s in text), default=None)
        safe = len(text) if final else len(text.rstrip("\ufffd")) - self.hold
        if cut is not None and cut <= safe:  # any earlier stop string would lie inside the text: found
            text, final = text[:cut], True
        elif not final:
            text = text[:max(safe, 0)]
        self.done[i] = final
        return self._extend(i, text)

    def rest(self, i: int, text: str) -> str:
        """What choice i still has to send of its final text."""
        self.done[i] = True
        return self._extend(i, text)

    def _extend(self, i: int, text: str) -> str:
        sent = self.sent[i]
        if len(text) <= len(sent):
            return ""
        if not text.startswith(sent):  # cannot happen with a sampler that settles; never send text twice
            logger.warning("sedd serve: a streamed choice changed after it was sent (%r, then %r)", sent, text)
            return ""
        self.sent[i] = text
        return text[len(sent):]


# --------------------------------------------------------------------------- the app


def model_name(workdir: str | Path) -> str:
    """The model id `GET /v1/models` reports: sedd-<run directory name>."""
    return f"sedd-{Path(workdir).resolve().name}"


def host_name(host: str) -> str:
    """The name of a Host header without its port, lower case: "[::1]:8000" -> "::1", "LocalHost." -> "localhost"."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        host = host.split(":")[0]
    return host.rstrip(".")


class Gate:
    """ASGI middleware: refuse, before any route, a request this server must not answer.

    - A Host header that is not in `hosts` (421): a page of another site that
      rebinds its own name to 127.0.0.1 sends its name, not ours. "*" admits any.
    - With `api_key`, a /v1/ request without ``Authorization: Bearer <api_key>``
      (401, as OpenAI answers a wrong key). The playground page and /health
      stay open.
    """

    def __init__(self, app, hosts: tuple[str, ...] = LOCAL_HOSTS, api_key: str | None = None):
        self.app = app
        self.hosts = frozenset(host_name(h) for h in hosts)
        self.bearer = None if api_key is None else f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                await refusal.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope) -> APIError | None:
        headers = dict(scope["headers"])  # ASGI gives the names lower case
        if "*" not in self.hosts:
            host = headers.get(b"host", b"").decode("latin-1")
            if host_name(host) not in self.hosts:
                return APIError(421, f"this server does not answer requests for the host {host!r}; it answers "
                                     f"{', '.join(sorted(self.hosts))} (start it with --allowed_hosts to add "
                                     "names)", None, "host_not_allowed")
        if self.bearer is not None and scope["path"].startswith("/v1/"):
            given = headers.get(b"authorization", b"")
            if not secrets.compare_digest(given, self.bearer):
                return APIError(401, "incorrect or missing API key: send the key this server was started with as "
                                     "`Authorization: Bearer <key>`", None, "invalid_api_key",
                                headers={"WWW-Authenticate": "Bearer"})
        return None


def _guarded(endpoint):
    """The endpoint with its errors answered in OpenAI's shape and the connection kept usable.

    An ``APIError`` is answered as it is; any other exception is a fault of
    the server: logged with its traceback, answered 500 with a reference to
    the log line and no internal text. (Starlette's own handler of a 500
    re-raises after answering, which closes a keep-alive connection.)
    """

    @functools.wraps(endpoint)
    async def run(request: Request):
        try:
            return await endpoint(request)
        except APIError as e:
            return e.response()
        except ClientGone:
            return Response(status_code=204)  # nobody reads it
        except Exception:  # noqa: BLE001  the server's fault: logged, answered, the server keeps serving
            return _internal_error(f"{request.method} {request.url.path}").response()

    return run


def _internal_error(what: str) -> APIError:
    """Log the exception being handled with its traceback; the 500 the client gets instead of its text."""
    ref = uuid.uuid4().hex[:12]
    logger.exception("sedd serve: internal error %s on %s", ref, what)
    return APIError(500, f"the server failed on this request (reference {ref} in its log)", None,
                    "internal_error", kind="server_error")


def create_app(run: runs.Run, name: str = "sedd", limits: Limits = Limits(),
               allowed_hosts: tuple[str, ...] = LOCAL_HOSTS, api_key: str | None = None) -> Starlette:
    """The ASGI app serving `run` (start and stop its engine with the app's lifespan).

    A bare Starlette app: four routes whose bodies pydantic validates, behind
    ``Gate`` (Host allow-list, optional API key), with no per-request
    dependency solving (FastAPI's layers took about a quarter of the server's
    CPU under load; docs/serving.md). The header timeout is the HTTP server's
    business: ``main`` gives uvicorn ``header_timeout_protocol``.

    Args:
      allowed_hosts: the names a request's Host header may give ("*": any).
      api_key: when given, every /v1/ request must carry ``Authorization: Bearer <api_key>``.
    """
    if not run.kind.serves:
        raise ValueError(f"sedd serve serves diffusion runs; this run's model.kind is {run.kind.name!r}")
    if limits.max_batch < limits.max_n:
        raise ValueError(f"max_batch={limits.max_batch} must be at least max_n={limits.max_n}")
    if api_key is not None and not api_key:
        raise ValueError("api_key must not be empty")
    engine = Engine(run, limits)
    texts = Texts(run)
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        engine.start()
        yield
        engine.stop()

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "model": name, "step": run.step, "queued": engine.queued,
                             "batches": engine.batches, "programs": len(engine.programs),
                             "compiles": engine.compiles})

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": name, "object": "model", "created": created,
                                                         "owned_by": "sedd", "seq_len": run.seq_len, "step": run.step,
                                                         "kind": run.kind.name, "block_size": engine.block_size,
                                                         "sampler": run.config.sampling.predictor,
                                                         "steps": run.config.sampling.steps,
                                                         "samplers": sorted(sampling.PREDICTORS)}]})

    async def favicon(request: Request) -> Response:  # no icon: answered, so a browser's request is not a 404
        return Response(status_code=204)

    async def playground(request: Request) -> HTMLResponse:
        return HTMLResponse(resources.files("sedd").joinpath("static/playground.html").read_text(encoding="utf-8"))

    async def completions(request: Request):
        body = await _read_body(request, limits)
        try:
            req = CompletionRequest.model_validate_json(body)
        except ValidationError as e:
            raise _validation_error(e) from None
        if req.model is not None and req.model != name:
            raise APIError(404, f"the model {req.model!r} does not exist; this server serves {name!r}", "model",
                           "model_not_found")
        p = plan(run, req, limits)
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        cid, now = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": cid, "object": "text_completion", "created": now, "model": name}
        progress, queue = None, None
        if req.stream and not req.diffusing and settles(run, p.sampler):
            queue, loop = asyncio.Queue(), asyncio.get_running_loop()
            progress = lambda i, ids: loop.call_soon_threadsafe(queue.put_nowait, (i, ids.copy()))  # noqa: E731
        try:
            future = engine.submit(p, trajectory=req.diffusing, progress=progress)
        except Busy as e:
            raise APIError(503, str(e), None, "server_busy", kind="server_error") from None
        if req.stream and not req.diffusing:
            return EventSourceResponse(_stream(texts, p, stop, head, future, queue, limits.timeout_s), ping=600)
        ids, traj, info = await _result(request, future, limits.timeout_s)
        choices = [dict(zip(("text", "finish_reason"), texts.completion(row, p, stop))) for row in ids]
        diffusion = _diffusion(p, info)
        if req.diffusing:
            return EventSourceResponse(_frames(texts, p, req, traj, choices, head, diffusion, _usage(p),
                                               engine.block_size), ping=600)
        out = [{"index": i, "text": c["text"], "logprobs": None, "finish_reason": c["finish_reason"]}
               for i, c in enumerate(choices)]
        return JSONResponse({**head, "choices": out, "usage": _usage(p), "diffusion": diffusion})

    async def http_error(request, e: HTTPException) -> JSONResponse:  # no such route (404), wrong method (405)
        return APIError(e.status_code, str(e.detail)).response()

    app = Starlette(
        routes=[Route("/health", _guarded(health)), Route("/v1/models", _guarded(models)),
                Route("/", _guarded(playground)), Route("/favicon.ico", _guarded(favicon)),
                Route("/v1/completions", _guarded(completions), methods=["POST"])],
        exception_handlers={HTTPException: http_error}, lifespan=lifespan)
    app.state.engine, app.state.name = engine, name
    app.add_middleware(Gate, hosts=tuple(allowed_hosts), api_key=api_key)
    return app


def _diffusion(p: Plan, info: dict) -> dict:
    """The response's `diffusion` object: steps, sampler, seed, the batch's figures, tokens/s."""
    return {"steps": p.steps, "sampler": p.sampler, "seed": p.seed, **info,
            "tokens_per_second": p.n * p.length / max(info["seconds"], 1e-9)}


def _usage(p: Plan) -> dict:
    return {"prompt_tokens": p.start + p.suffix_len, "completion_tokens": p.n * p.length,
            "total_tokens": p.start + p.suffix_len + p.n * p.length}


async def _read_body(request: Request, limits: Limits) -> bytes:
    """The JSON body: 415 unless it is sent as application/json, 413 over max_body_bytes, 408 if it stalls.

    Refusing other content types means a page of another site cannot post
    here with a "simple" request (text/plain needs no CORS preflight).

    Raises:
      APIError: 415, 413 (by its header or as it arrives), or 408 when the
        whole body has not arrived within body_timeout_s (the connection is
        then closed).
      ClientGone: the client left while sending it.
    """
    ctype = request.headers.get("content-type", "")
    if ctype.split(";", 1)[0].strip().lower() != "application/json":
        raise APIError(415, f"the body must be JSON sent with Content-Type: application/json (got {ctype!r})",
                       None, "unsupported_media_type")
    limit = limits.max_body_bytes
    too_big = APIError(413, f"the request body is over this server's limit of {limit} bytes", None,
                       "request_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limits.body_timeout_s
    chunks, size = [], 0
    while True:
        try:
            message = await asyncio.wait_for(request.receive(), max(deadline - loop.time(), 0.0))
        except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11
            raise APIError(408, f"the request body did not arrive within {limits.body_timeout_s:g} s", None,
                           "request_timeout", headers={"Connection": "close"}) from None
        if message["type"] == "http.disconnect":
            raise ClientGone()
        size += len(message.get("body", b""))
        if size > limit:
            raise too_big
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _result(request: Request, future: concurrent.futures.Future, timeout_s: float) -> tuple:
    """The engine's result for a job, or its job dropped when the client hangs up or the wait times out.

    A plain HTTP request's task is not cancelled when its client leaves, so
    the disconnect is watched for (the ASGI receive after the body).

    Raises:
      ClientGone: the client hung up (the job is dropped if it has not started).
      APIError: 503 after timeout_s.
    """
    waiter = asyncio.wrap_future(future)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        done, _ = await asyncio.wait({waiter, gone}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if waiter in done:
        return waiter.result()
    future.cancel()  # a job that has not started leaves the queue unrun
    waiter.cancel()
    if gone in done:
        raise ClientGone()
    raise APIError(503, f"the request waited more than {timeout_s:g} s; the server is busy, retry later", None,
                   "timeout", kind="server_error")


async def _disconnect(request: Request) -> None:
    """Return when the client has closed the connection."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _stream(texts: Texts, p: Plan, stop: list[str], head: dict, future: concurrent.futures.Future,
                  queue: asyncio.Queue | None, timeout_s: float):
    """OpenAI's streamed completion, sent as the text settles: chunks that concatenate to each choice's text.

    With a `queue` (a sampler that ``settles``), the states the engine hands
    over at each network call become chunks of new settled text while the
    sampling runs; the last chunk of each choice holds the rest and its
    finish_reason, then [DONE]. A failure after the stream has begun is an
    event {"error": ...}. A client that hangs up (sse-starlette then cancels
    this generator) or a timeout drops the job if it has not started.
    """
    streamed = Streamed(texts, p, stop)
    waiter = asyncio.wrap_future(future)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s

    def chunk(i, text, reason=None):
        return {"data": json.dumps({**head, "choices": [{"index": i, "text": text, "logprobs": None,
                                                         "finish_reason": reason}]})}

    try:
        while not waiter.done():
            wanted = {waiter} if queue is None else {waiter, asyncio.ensure_future(queue.get())}
            done, pending = await asyncio.wait(wanted, timeout=deadline - loop.time(),
                                               return_when=asyncio.FIRST_COMPLETED)
            for task in pending - {waiter}:
                task.cancel()
            if not done:
                error = APIError(503, f"the request waited more than {timeout_s:g} s; the server is busy, retry "
                                      "later", None, "timeout", kind="server_error")
                yield {"data": json.dumps({"error": error.response_body()})}
                return
            for task in done - {waiter}:
                i, ids = task.result()
                text = streamed.update(i, ids)
                if text:
                    yield chunk(i, text)
        try:
            ids, _, _ = waiter.result()
        except Exception:  # noqa: BLE001  the engine failed: the client hears of it, the log has the traceback
            yield {"data": json.dumps({"error": _internal_error("a streamed completion").response_body()})}
            return
        for i, row in enumerate(ids):
            text, reason = texts.completion(row, p, stop)
            yield chunk(i, streamed.rest(i, text), reason)
        yield {"data": "[DONE]"}
    finally:
        future.cancel()  # no effect once it has run
        waiter.cancel()


async def _frames(texts: Texts, p: Plan, req: CompletionRequest, traj: np.ndarray, choices: list[dict],
                  head: dict, diffusion: dict, usage: dict, block_size: int | None = None):
    """The diffusing stream: N + 1 frames, the state before each of the N steps and then the final text.

    Frame k (k < N) holds the state after k steps and the network calls made
    so far (a step of the absorbing graph whose state has no mask left makes
    none); the last frame holds the final text, after the N-th step and the
    denoise, and the sampler's own count. A block run (`block_size`) sends
    the N + 1 states of each block that holds completion positions in turn
    (the last before its denoise; a commit of the clean block is one more
    call), "step" and "steps" counting those frames and "block" naming the block.
    """
    prompt, suffix = req.prompt, req.suffix or ""
    steps, blocks = p.steps, None
    if texts.mask_id is None:  # the uniform graph calls the network at every step
        calls = np.arange(steps + 1)
    elif block_size is None:  # the most calls any choice made before each frame
        pending = (traj[:, :steps] == texts.mask_id).any(-1)  # (n, N): step j needed the network
        calls = np.concatenate([[0], np.cumsum(pending, axis=1).max(0)])
    else:
        per = steps + 1  # states of one block's sampler
        blocks = np.arange(traj.shape[1] - 1) // per  # the block each frame draws
        own = np.arange(traj.shape[2])[None, :] // block_size == blocks[:, None]  # (F, L): its positions
        pending = ((traj[:, :-1] == texts.mask_id) & own[None]).any(-1)  # (n, F): the frame made a call
        commits = (np.arange(len(blocks)) % per == per - 1).astype(int)  # after a block's last state
        calls = np.concatenate([[0], np.cumsum(pending + commits[None], axis=1).max(0)])
        kept = np.flatnonzero(((blocks + 1) * block_size > p.start) & (blocks * block_size < p.start + p.length))
        traj, calls, blocks = traj[:, kept], calls[kept], blocks[kept]
        steps = len(kept)
    for k in range(steps):
        frame = []
        for i in range(p.n):
            text, masked = texts.frame(traj[i, k], p, prompt, suffix)
            frame.append({"index": i, "text": text, "masked": masked, "finish_reason": None})
        where = {} if blocks is None else {"block": int(blocks[k])}
        yield {"data": json.dumps({**head, "object": "text_completion.diffusion", "step": k, "steps": steps,
                                   **where, "nfe": int(calls[k]), "choices": frame})}
    final = [{"index": i, "text": prompt + c["text"] + suffix, "completion": c["text"], "masked": [],
              "finish_reason": c["finish_reason"]} for i, c in enumerate(choices)]
    yield {"data": json.dumps({**head, "object": "text_completion.diffusion", "step": steps, "steps": steps,
                               "nfe": diffusion["nfe"], "choices": final, "usage": usage, "diffusion": diffusion})}
    yield {"data": "[DONE]"}


# --------------------------------------------------------------------------- entry point


def header_timeout_protocol(seconds: float):
    """uvicorn's httptools protocol, closing a connection whose request headers take over `seconds`.

    The clock runs from the connection's opening and from each answer's end
    to the end of the next request's headers; uvicorn itself waits for
    headers for ever once a byte of them has arrived. Returns None where
    httptools is missing (uvicorn then uses h11, without this timeout).
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # optional dependency: httptools
    except ImportError:
        return None

    class HeaderTimeout(HttpToolsProtocol):
        _timer = None

        def _arm(self):
            self._disarm()
            self._timer = self.loop.call_later(seconds, self._late)

        def _disarm(self):
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _late(self):
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def on_headers_complete(self):
            self._disarm()
            super().on_headers_complete()

        def on_response_complete(self):
            waiting = bool(self.pipeline)  # a pipelined request whose headers are in runs next
            super().on_response_complete()
            if not waiting and not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc):
            self._disarm()
            super().connection_lost(exc)

    return HeaderTimeout


def _parser() -> argparse.ArgumentParser:
    d = Limits()
    parser = argparse.ArgumentParser(prog="sedd serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="the run directory to serve")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: localhost only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--allowed_hosts", default="",
                        help="comma-separated names a request's Host header may give, besides localhost, "
                             "127.0.0.1, ::1 and a --host other than 0.0.0.0 / :: ('*': any; see docs/serving.md)")
    parser.add_argument("--api_key", default=None,
                        help=f"require `Authorization: Bearer KEY` on /v1/ (default: ${API_KEY_ENV}, else none)")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    parser.add_argument("--model_name", default=None, help="the model id (default: sedd-<run directory name>)")
    parser.add_argument("--max_steps", type=int, default=d.max_steps, help="most steps a request may ask for")
    parser.add_argument("--max_n", type=int, default=d.max_n, help="most completions per request")
    parser.add_argument("--max_batch", type=int, default=d.max_batch, help="most rows in one batch")
    parser.add_argument("--max_queue", type=int, default=d.max_queue, help="most waiting requests (then 503)")
    parser.add_argument("--max_programs", type=int, default=d.max_programs,
                        help="compiled programs kept (the least recently used is dropped beyond)")
    parser.add_argument("--timeout", type=float, default=d.timeout_s, help="seconds a request may wait (then 503)")
    parser.add_argument("--header_timeout", type=float, default=d.header_timeout_s,
                        help="seconds a connection may take to send a request's headers (then it is closed)")
    parser.add_argument("--body_timeout", type=float, default=d.body_timeout_s,
                        help="seconds a request's body may take to arrive (then 408)")
    parser.add_argument("--window_ms", type=float, default=d.window_s * 1e3,
                        help="collection window of a batch, in milliseconds (0: no batching wait)")
    parser.add_argument("--max_body", type=int, default=d.max_body_bytes, help="largest request body, bytes")
    parser.add_argument("--log_level", default="info", help="uvicorn's log level (warning: no line per request)")
    parser.add_argument("--warmup", action="store_true",
                        help="compile every batch size of the warm-up steps and the default sampler before serving")
    parser.add_argument("--warmup_steps", type=int, default=None, help="steps to compile (default: the run's)")
    return parser


def _options(args) -> tuple[Limits, tuple[str, ...], str | None]:
    """(limits, allowed hosts, API key) of the command line, each value checked.

    Raises:
      ValueError: naming the option and the value refused.
    """
    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} is not a TCP port (1 to 65535)")
    for flag, value, low, strict in (("--timeout", args.timeout, 0, True), ("--window_ms", args.window_ms, 0, False),
                                     ("--header_timeout", args.header_timeout, 0, True),
                                     ("--body_timeout", args.body_timeout, 0, True)):
        _check_number(flag, value, low, strict, integer=False)
    for flag in ("max_steps", "max_n", "max_batch", "max_queue", "max_programs", "max_body"):
        _check_number(f"--{flag}", getattr(args, flag), 1, strict=False, integer=True)
    if args.max_batch < args.max_n:
        raise ValueError(f"--max_batch {args.max_batch} must be at least --max_n {args.max_n}")
    if args.warmup_steps is not None and not 1 <= args.warmup_steps <= args.max_steps:
        raise ValueError(f"--warmup_steps {args.warmup_steps} must be in [1, --max_steps {args.max_steps}]")
    if args.step is not None and args.step < 0:
        raise ValueError(f"--step {args.step} is not a training step")
    limits = Limits(max_steps=args.max_steps, max_n=args.max_n, max_batch=args.max_batch, max_queue=args.max_queue,
                    timeout_s=args.timeout, window_s=args.window_ms / 1e3, max_body_bytes=args.max_body,
                    max_programs=args.max_programs, header_timeout_s=args.header_timeout,
                    body_timeout_s=args.body_timeout)
    hosts = [*LOCAL_HOSTS, *(h.strip() for h in args.allowed_hosts.split(",") if h.strip())]
    if args.host not in ("0.0.0.0", "::", ""):
        hosts.append(args.host)
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    if key is not None and (not key or any(c.isspace() for c in key)):
        raise ValueError("--api_key must be a non-empty key without spaces")
    return limits, tuple(dict.fromkeys(hosts)), key


def main(argv: list[str] | None = None) -> int:
    """`sedd serve --workdir RUN [--host 127.0.0.1] [--port 8000] [limits ...]`; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        limits, hosts, key = _options(args)
        run = runs.load(args.workdir, step=args.step)
        app = create_app(run, args.model_name or model_name(args.workdir), limits, hosts, key)
    except (FileNotFoundError, RuntimeError, ValueError) as e:
        print(f"sedd serve: error: {e}", file=sys.stderr)
        return 2
    name = app.state.name
    if args.warmup:
        t0 = time.perf_counter()
        app.state.engine.warmup(steps=args.warmup_steps)
        print(f"compiled the batch sizes up to {limits.max_batch} in {time.perf_counter() - t0:.1f} s")
    access = "an API key is required" if key else "no API key: whoever can reach the port can use it"
    print(f"serving {name} (step {run.step}, length {run.seq_len}) on http://{args.host}:{args.port}/ "
          f"for the hosts {', '.join(hosts)}; {access}")
    protocol = header_timeout_protocol(limits.header_timeout_s)
    if protocol is None:
        print("sedd serve: warning: without httptools (pip install 'uvicorn[standard]') there is no header timeout",
              file=sys.stderr)
    # JAX, the model and the compiled programs are millions of long-lived objects; a full collection walks
    # them all, pausing the whole server (GIL held) under load (docs/serving.md). Frozen, the collector
    # skips them.
    gc.collect()
    gc.freeze()
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, http=protocol or "auto")
    return 0
