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
sampler. Requests that can share a program (same steps, sampler, temperature,
top_p, trajectory or not) that arrive within a short collection window run as
one batch; every row has its own key ``fold_in(key(seed), row)``, so a seeded
request gives the same text whatever it was batched with. Batch sizes are
rounded up to a few sizes (``batch_size``) so a few compiled programs serve
every load. The queue is bounded (503 when full) and a request waits at most
``timeout_s`` seconds (then 503).

docs/serving.md shows how to call it with curl and the `openai` client.
Shapes: B batch rows, L length, N steps.
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
import json
import secrets
import sys
import threading
import time
import uuid
from importlib import resources
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

# The optional extra `sedd[serve]`: only `sedd serve` imports this module, nothing else in sedd does.
import uvicorn
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from sedd import kinds, runs, sampling

MASK_CHAR = "\u2591"  # "░": how a masked position shows in the text of a diffusing frame


# --------------------------------------------------------------------------- limits and errors


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the server accepts and how it batches.

    Attributes:
      max_steps: most denoising steps a request may ask for.
      max_n: most completions (`n`) per request.
      max_batch: most rows in one batch of the engine (>= max_n).
      max_queue: most requests waiting; beyond it a request gets 503.
      timeout_s: most seconds a request waits for its result; then 503.
      window_s: how long the engine waits for more requests to batch with the first.
      max_body_bytes: largest request body; beyond it 413.
    """

    max_steps: int = 1024
    max_n: int = 16
    max_batch: int = 64
    max_queue: int = 256
    timeout_s: float = 120.0
    window_s: float = 0.005
    max_body_bytes: int = 65536


class APIError(Exception):
    """An error answered in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status)


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


@functools.partial(jax.jit, static_argnames=("graphdef", "graph", "noise", "steps", "predictor", "eps",
                                             "categorical", "trajectory", "temperature", "top_p"))
def _sample_rows(state, seeds, rows, mask, tokens, *, graphdef, graph, noise, steps, predictor, eps,
                 categorical, trajectory, temperature=1.0, top_p=1.0):
    """Each row sampled with its own key fold_in(key(seed), row): the same text in any batch.

    Args:
      state: (params, rest) of the network.
      seeds, rows: uint32[B] each.
      mask: bool[B, L]; tokens: int32[B, L] (``sedd.sampling.sample``'s fixed_mask / fixed_tokens).
    Returns:
      (x, traj, nfe): x int32[B, L]; traj int32[B, N + 1, L], the state before
      each step, or None without trajectory; nfe int32[B], the network calls
      each row's sampler made, counted as if it ran alone (the batch skips a
      call only when no row needs it).
    """
    score_fn = kinds.params_score_fn(graphdef)
    length = mask.shape[1]

    def one(seed, row, m, t):  # one row as a batch of 1: (1, L)
        key = jax.random.fold_in(jax.random.key(seed), row)
        out = sampling.sample(key, score_fn, graph, noise, (1, length), steps, predictor, eps=eps,
                              fixed_mask=m[None], fixed_tokens=t[None], score_params=state,
                              categorical=categorical, return_trajectory=trajectory, temperature=temperature,
                              top_p=top_p, return_stats=True, axis_name="rows")
        traj = None if out.trajectory is None else out.trajectory[:, 0]  # (N + 1, L)
        return out.tokens[0], traj, out.stats["nfe_per_sample"][0]  # (L,), ..., ()

    # axis_name: the network runs once a step on all rows with unbatched weights (not once per row).
    return jax.vmap(one, axis_name="rows")(seeds, rows, mask, tokens)


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
    """A request waiting for the engine; `future` receives its result."""

    plan: Plan
    trajectory: bool  # also return the states along the way (a diffusing request)
    future: concurrent.futures.Future

    @functools.cached_property
    def program(self) -> tuple:
        """Jobs with equal programs can run in one batch."""
        return (self.plan.steps, self.plan.sampler, self.trajectory, self.plan.temperature, self.plan.top_p)


class Busy(Exception):
    """The engine's queue is full."""


class Engine:
    """One worker thread running batches of jobs that share a compiled program.

    The oldest waiting job always runs next, so none waits behind others for
    ever; jobs arriving within `window_s` of it with the same program join its
    batch (up to max_batch rows), padded to one of a few sizes (``batch_size``).
    """

    def __init__(self, run: runs.Run, limits: Limits):
        self.run, self.limits = run, limits
        self.pending: collections.deque[Job] = collections.deque()
        self.rows = 0  # rows of the jobs in `pending` (those given up on included, until dropped)
        self.cond = threading.Condition()
        self.stopping = False
        self.batches = 0
        self.compiled: set[tuple] = set()
        self.thread = threading.Thread(target=self._loop, name="sedd-serve-engine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join(timeout=30)

    def submit(self, plan: Plan, trajectory: bool) -> concurrent.futures.Future:
        """Queue a job; its future gets (ids int32[n, L], trajectory int32[n, N + 1, L] or None, info dict)."""
        job = Job(plan, trajectory, concurrent.futures.Future())
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
        run, first = self.run, batch[0].plan
        seeds, rows, masks, tokens = [], [], [], []
        for job in batch:
            for i in range(job.plan.n):
                seeds.append(job.plan.seed)
                rows.append(i)
                masks.append(job.plan.mask)
                tokens.append(job.plan.tokens)
        used = len(seeds)
        size = batch_size(used)
        for _ in range(size - used):
            seeds.append(0), rows.append(0), masks.append(masks[0]), tokens.append(tokens[0])
        s = run.config.sampling
        t0 = time.perf_counter()
        out = _sample_rows((run.params, run.rest), jnp.asarray(seeds, jnp.uint32), jnp.asarray(rows, jnp.uint32),
                           jnp.asarray(np.stack(masks)), jnp.asarray(np.stack(tokens)), graphdef=run.graphdef,
                           graph=run.graph, noise=run.noise, steps=first.steps, predictor=first.sampler,
                           eps=float(s.eps), categorical=s.categorical, trajectory=batch[0].trajectory,
                           temperature=first.temperature, top_p=first.top_p)
        out = jax.tree.map(np.asarray, out)
        seconds = time.perf_counter() - t0
        ids, traj, nfe = out
        self.batches += 1
        program = (size, *batch[0].program)
        info = {"batch_rows": used, "padded_rows": size, "seconds": seconds,
                "compiled": program not in self.compiled}  # True: `seconds` includes compiling the program
        self.compiled.add(program)
        results, i = [], 0
        for job in batch:
            n = job.plan.n
            # nfe: the most network calls any of the job's rows needed (measured by the sampler)
            results.append((ids[i:i + n], None if traj is None else traj[i:i + n],
                            {**info, "nfe": int(nfe[i:i + n].max())}))
            i += n
        return results

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


# --------------------------------------------------------------------------- the app


def model_name(workdir: str | Path) -> str:
    """The model id `GET /v1/models` reports: sedd-<run directory name>."""
    return f"sedd-{Path(workdir).resolve().name}"


def create_app(run: runs.Run, name: str = "sedd", limits: Limits = Limits()) -> Starlette:
    """The ASGI app serving `run` (start and stop its engine with the app's lifespan).

    A bare Starlette app: four routes whose bodies pydantic validates, with no
    per-request dependency solving or middleware beyond Starlette's error
    handling (FastAPI's layers took about a quarter of the server's CPU under
    load; docs/serving.md).
    """
    if not run.kind.serves:
        raise ValueError(f"sedd serve serves diffusion runs; this run's model.kind is {run.kind.name!r}")
    if limits.max_batch < limits.max_n:
        raise ValueError(f"max_batch={limits.max_batch} must be at least max_n={limits.max_n}")
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
                             "batches": engine.batches})

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": name, "object": "model", "created": created,
                                                         "owned_by": "sedd", "seq_len": run.seq_len, "step": run.step,
                                                         "samplers": sorted(sampling.PREDICTORS)}]})

    async def playground(request: Request) -> HTMLResponse:
        return HTMLResponse(resources.files("sedd").joinpath("static/playground.html").read_text(encoding="utf-8"))

    async def completions(request: Request):
        body = await _read_body(request, limits.max_body_bytes)
        try:
            req = CompletionRequest.model_validate_json(body)
        except ValidationError as e:
            raise _validation_error(e) from None
        if req.model is not None and req.model != name:
            raise APIError(404, f"the model {req.model!r} does not exist; this server serves {name!r}", "model",
                           "model_not_found")
        p = plan(run, req, limits)
        try:
            future = engine.submit(p, trajectory=req.diffusing)
        except Busy as e:
            raise APIError(503, str(e), None, "server_busy", kind="server_error") from None
        try:
            ids, traj, info = await asyncio.wait_for(asyncio.wrap_future(future), limits.timeout_s)
        except asyncio.CancelledError:  # the client went away: its job need not run
            future.cancel()
            raise
        except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11
            future.cancel()
            raise APIError(503, f"the request waited more than {limits.timeout_s:g} s; the server is busy, retry "
                                "later", None, "timeout", kind="server_error") from None
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        choices = [dict(zip(("text", "finish_reason"), texts.completion(row, p, stop))) for row in ids]
        cid, now = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        diffusion = {"steps": p.steps, "sampler": p.sampler, "seed": p.seed, **info,
                     "tokens_per_second": p.n * p.length / max(info["seconds"], 1e-9)}
        usage = {"prompt_tokens": p.start + p.suffix_len, "completion_tokens": p.n * p.length,
                 "total_tokens": p.start + p.suffix_len + p.n * p.length}
        head = {"id": cid, "object": "text_completion", "created": now, "model": name}
        if req.diffusing:
            return EventSourceResponse(_frames(texts, p, req, traj, choices, head, diffusion, usage), ping=600)
        out = [{"index": i, "text": c["text"], "logprobs": None, "finish_reason": c["finish_reason"]}
               for i, c in enumerate(choices)]
        if req.stream:
            return EventSourceResponse(_chunks(head, out), ping=600)
        return JSONResponse({**head, "choices": out, "usage": usage, "diffusion": diffusion})

    async def api_error(request, e: APIError) -> JSONResponse:
        return e.response()

    async def http_error(request, e: HTTPException) -> JSONResponse:  # no such route (404), wrong method (405)
        return APIError(e.status_code, str(e.detail)).response()

    async def server_error(request, e: Exception) -> JSONResponse:
        return APIError(500, f"{type(e).__name__}: {e}", kind="server_error").response()

    app = Starlette(
        routes=[Route("/health", health), Route("/v1/models", models), Route("/", playground),
                Route("/v1/completions", completions, methods=["POST"])],
        exception_handlers={APIError: api_error, HTTPException: http_error, Exception: server_error},
        lifespan=lifespan)
    app.state.engine, app.state.name = engine, name
    return app


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 once it is over `limit` bytes (by its header or as it arrives)."""
    too_big = APIError(413, f"the request body is over this server's limit of {limit} bytes", None,
                       "request_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


async def _chunks(head: dict, choices: list[dict]):
    """OpenAI's streamed completion: chunks whose texts concatenate to each choice's text, then [DONE]."""
    for c in choices:
        yield {"data": json.dumps({**head, "choices": [c]})}
    yield {"data": "[DONE]"}


async def _frames(texts: Texts, p: Plan, req: CompletionRequest, traj: np.ndarray, choices: list[dict],
                  head: dict, diffusion: dict, usage: dict):
    """The diffusing stream: N + 1 frames, the state before each of the N steps and then the final text.

    Frame k (k < N) holds the state after k steps and the network calls made
    so far (a step of the absorbing graph whose state has no mask left makes
    none); the last frame holds the final text, after the N-th step and the
    denoise, and the sampler's own count.
    """
    prompt, suffix = req.prompt, req.suffix or ""
    steps = p.steps
    if texts.mask_id is None:  # the uniform graph calls the network at every step
        calls = np.arange(steps + 1)
    else:  # the most calls any choice made before each frame
        pending = (traj[:, :steps] == texts.mask_id).any(-1)  # (n, N): step j needed the network
        calls = np.concatenate([[0], np.cumsum(pending, axis=1).max(0)])
    for k in range(steps):
        frame = []
        for i in range(p.n):
            text, masked = texts.frame(traj[i, k], p, prompt, suffix)
            frame.append({"index": i, "text": text, "masked": masked, "finish_reason": None})
        yield {"data": json.dumps({**head, "object": "text_completion.diffusion", "step": k, "steps": steps,
                                   "nfe": int(calls[k]), "choices": frame})}
    final = [{"index": i, "text": prompt + c["text"] + suffix, "completion": c["text"], "masked": [],
              "finish_reason": c["finish_reason"]} for i, c in enumerate(choices)]
    yield {"data": json.dumps({**head, "object": "text_completion.diffusion", "step": steps, "steps": steps,
                               "nfe": diffusion["nfe"], "choices": final, "usage": usage, "diffusion": diffusion})}
    yield {"data": "[DONE]"}


# --------------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    """`sedd serve --workdir RUN [--host 127.0.0.1] [--port 8000] [limits ...]`."""
    d = Limits()
    parser = argparse.ArgumentParser(prog="sedd serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="the run directory to serve")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: localhost only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    parser.add_argument("--model_name", default=None, help="the model id (default: sedd-<run directory name>)")
    parser.add_argument("--max_steps", type=int, default=d.max_steps, help="most steps a request may ask for")
    parser.add_argument("--max_n", type=int, default=d.max_n, help="most completions per request")
    parser.add_argument("--max_batch", type=int, default=d.max_batch, help="most rows in one batch")
    parser.add_argument("--max_queue", type=int, default=d.max_queue, help="most waiting requests (then 503)")
    parser.add_argument("--timeout", type=float, default=d.timeout_s, help="seconds a request may wait (then 503)")
    parser.add_argument("--window_ms", type=float, default=d.window_s * 1e3,
                        help="collection window of a batch, in milliseconds (0: no batching wait)")
    parser.add_argument("--max_body", type=int, default=d.max_body_bytes, help="largest request body, bytes")
    parser.add_argument("--log_level", default="info", help="uvicorn's log level (warning: no line per request)")
    parser.add_argument("--warmup", action="store_true",
                        help="compile every batch size of the warm-up steps and the default sampler before serving")
    parser.add_argument("--warmup_steps", type=int, default=None, help="steps to compile (default: the run's)")
    args = parser.parse_args(argv)
    limits = Limits(max_steps=args.max_steps, max_n=args.max_n, max_batch=args.max_batch, max_queue=args.max_queue,
                    timeout_s=args.timeout, window_s=args.window_ms / 1e3, max_body_bytes=args.max_body)
    try:
        run = runs.load(args.workdir, step=args.step)
        app = create_app(run, args.model_name or model_name(args.workdir), limits)
    except (FileNotFoundError, RuntimeError, ValueError) as e:
        print(f"sedd serve: error: {e}", file=sys.stderr)
        return 2
    name = app.state.name
    if args.warmup:
        t0 = time.perf_counter()
        app.state.engine.warmup(steps=args.warmup_steps)
        print(f"compiled the batch sizes up to {limits.max_batch} in {time.perf_counter() - t0:.1f} s")
    print(f"serving {name} (step {run.step}, length {run.seq_len}) on http://{args.host}:{args.port}/")
    # JAX, the model and the compiled programs are millions of long-lived objects; a full collection walks
    # them all, pausing the whole server (GIL held) under load (docs/serving.md). Frozen, the collector
    # skips them.
    gc.collect()
    gc.freeze()
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
