"""`sedd serve`'s engine: one worker thread running batches of requests that share a compiled program.

Shapes: B batch rows, L length, N steps.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import itertools
import logging
import threading
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from sedd import runs
from sedd.sampling import lanes as lanes_lib
from sedd.serve.api import Limits, Plan

logger = logging.getLogger("sedd.serve")

BATCH_IDS = itertools.count()
"""The ids of running batches (``sedd.sampling.lanes.listening``)."""


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

    def __init__(self, run: runs.Run, limits: Limits, speculation=None):
        self.run, self.limits = run, limits
        # A run decoded by speculative rounds (``sedd.kinds.Kind.speculation``) runs the speculation's program,
        # whose first argument may hold a drafter network's weights too.
        self.speculation = speculation
        self.state = (run.params, run.rest)
        if speculation is not None:
            self.state = speculation.program_state(self.state)
        self.pending: collections.deque[Job] = collections.deque()
        self.rows = 0  # rows of the jobs in `pending` (those given up on included, until dropped)
        self.cond = threading.Condition()
        self.stopping = False
        self.batches = 0
        self.programs: collections.OrderedDict[tuple, tuple] = collections.OrderedDict()  # (compiled, LaneProgram)
        self.compiles = 0
        self.thread = threading.Thread(target=self._loop, name="sedd-serve-engine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join(timeout=30)

    def submit(
        self, plan: Plan, trajectory: bool, progress: Callable[[int, np.ndarray], None] | None = None
    ) -> concurrent.futures.Future:
        """Queue a job; its future gets (ids int32[n, L], trajectory int32[n, N + 1, L] or None, info dict)."""
        job = Job(self._one_program(plan), trajectory, concurrent.futures.Future(), progress)
        with self.cond:
            if len(self.pending) >= self.limits.max_queue:  # purge the jobs given up on before refusing
                self.pending = collections.deque(j for j in self.pending if not j.future.cancelled())
                self.rows = sum(j.plan.n for j in self.pending)
            if len(self.pending) >= self.limits.max_queue:
                raise Busy(
                    f"the server is busy: {len(self.pending)} requests are waiting "
                    f"(limit {self.limits.max_queue}); retry later"
                )
            self.pending.append(job)
            self.rows += plan.n
            # Wake the engine only when it may act: a first job to start a window on, or rows enough for a
            # full batch. Waking it at every arrival cost a scan of the queue and a GIL hand-over each.
            if len(self.pending) == 1 or self.rows >= self.limits.max_batch:
                self.cond.notify_all()
        return job.future

    def _one_program(self, plan: Plan) -> Plan:
        """The plan as the engine batches it: a speculation has no steps or sampler, so all its jobs share programs."""
        if self.speculation is None:
            return plan
        return dataclasses.replace(plan, steps=0, sampler="")

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

    @property
    def failed(self) -> bool:
        """Whether the worker thread has ended without being stopped (it then answers nothing)."""
        return self.thread.ident is not None and not self.thread.is_alive() and not self.stopping

    def _loop(self) -> None:
        while True:
            try:
                batch = self._take()
            except Exception as e:  # a fault of the queue's own code: fail what waits, keep serving
                logger.exception(
                    "sedd serve: the engine's queue failed; failing the %d waiting requests", len(self.pending)
                )
                with self.cond:
                    waiting, self.pending, self.rows = list(self.pending), collections.deque(), 0
                for job in waiting:
                    if job.future.set_running_or_notify_cancel():
                        job.future.set_exception(e)
                continue
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
        """Sample the lanes of all jobs of the batch in one call of the compiled program."""
        lanes = [(job, i) for job in batch for i in range(job.plan.n)]
        live = {k: lane for k, lane in enumerate(lanes) if lane[0].progress is not None}  # the jobs that watch
        used, size = len(lanes), batch_size(len(lanes))
        pad = size - used  # padding lanes: lane 0's conditioning at T = 1, top_p = 1
        masks = np.stack([job.plan.mask for job, _ in lanes] + [batch[0].plan.mask] * pad)
        tokens = np.stack([job.plan.tokens for job, _ in lanes] + [batch[0].plan.tokens] * pad)
        batch_id = next(BATCH_IDS) & 0x7FFFFFFF
        args = (
            self.state,
            jnp.asarray([job.plan.seed for job, _ in lanes] + [0] * pad, jnp.uint32),
            jnp.asarray([i for _, i in lanes] + [0] * pad, jnp.uint32),
            jnp.asarray(masks),
            jnp.asarray(tokens),
            jnp.asarray([job.plan.temperature for job, _ in lanes] + [1.0] * pad, jnp.float32),
            jnp.asarray([job.plan.top_p for job, _ in lanes] + [1.0] * pad, jnp.float32),
            jnp.int32(batch_id),
        )
        t0 = time.perf_counter()
        (program, lane_program), compiled = self._program((size, *batch[0].program), args)
        listening = contextlib.nullcontext()
        if live:  # the host holds the whole text of each row; a call may see part of it
            listener = lambda states, *more: [  # noqa: E731
                job.progress(i, states[k], *(m[k] for m in more)) for k, (job, i) in live.items()
            ]
            blank = self.run.kind.unwritten_id()
            texts = np.where(masks, tokens, 0 if blank is None else blank).astype(np.int32)
            listening = lanes_lib.listening(batch_id, lane_program.listen(listener, texts))
        with listening:
            out = jax.tree.map(np.asarray, program(*args))  # the listener is called while this runs
        seconds = time.perf_counter() - t0
        ids, traj, counts = out
        counts = counts if isinstance(counts, dict) else {"nfe": counts}  # per-row stats
        self.batches += 1
        # compiled: `seconds` includes compiling the program
        info = {"batch_rows": used, "padded_rows": size, "seconds": seconds, "compiled": compiled}
        results, i = [], 0
        for job in batch:
            n = job.plan.n
            mine = {name: v[i : i + n] for name, v in counts.items()}
            more = {} if lane_program.report is None else lane_program.report(mine, job.plan.length)
            # nfe: the most network calls any of the job's rows needed (measured by the sampler)
            done = {**info, "nfe": int(mine["nfe"].max()), "report": more}
            results.append((ids[i : i + n], None if traj is None else traj[i : i + n], done))
            i += n
        return results

    def _program(self, key: tuple, args: tuple) -> tuple[tuple[jax.stages.Compiled, lanes_lib.LaneProgram], bool]:
        """((the compiled program of key = (rows, steps, sampler, trajectory, live), its LaneProgram), whether it
        was compiled now).

        The kind of the run makes the program (``Kind.lane_program``, or the speculation's ``program``). It is
        compiled ahead of time and kept here, not in jit's own cache, so that dropping the least recently used
        beyond ``max_programs`` frees it (with JAX's caches, cleared then).
        """
        program = self.programs.get(key)
        if program is not None:
            self.programs.move_to_end(key)
            return program, False
        _, steps, sampler, trajectory, live = key
        make = self.run.kind.lane_program if self.speculation is None else self.speculation.program
        lane_program = make(self.run.graphdef, steps=steps, sampler=sampler, trajectory=trajectory, live=live)
        program = lane_program.compile(*args), lane_program
        self.programs[key] = program
        self.compiles += 1
        if len(self.programs) > self.limits.max_programs:
            while len(self.programs) > self.limits.max_programs:
                self.programs.popitem(last=False)
            # JAX's own trace and lowering caches keep what a dropped program was built from
            # (docs/studies/serving.md); the kept programs are ours and are not touched by clearing them.
            jax.clear_caches()
        return program, True

    def read_frames(self, p: Plan, traj: np.ndarray) -> tuple:
        """(frames int[n, F, L], calls int[F], labels int[F] or None) of a job's trajectory int[n, F0, L].

        The frames that show its completion, the network calls made before
        each, and the part of the text each draws: the kind's reading of its
        own program's frames (``sedd.sampling.lanes.LaneProgram.frames``).
        """
        program = self.run.kind.lane_program(
            self.run.graphdef, steps=p.steps, sampler=p.sampler, trajectory=True, live=False
        )
        return program.frames(traj, p.start, p.length, p.steps)

    def warmup(self, steps: int | None = None, sampler: str | None = None, trajectory: bool = False) -> None:
        """Compile the program of every batch size (``batch_sizes(max_batch)``) before serving."""
        s = self.run.config.sampling
        L = self.run.seq_len
        p = Plan(1, steps or s.steps, sampler or s.sampler, 0, np.zeros(L, bool), np.zeros(L, np.int32), 0, L, L, 0)
        p = self._one_program(p)
        for size in batch_sizes(self.limits.max_batch):
            self.run_batch([Job(dataclasses.replace(p, n=size), trajectory, concurrent.futures.Future())])
        self.batches = 0

    def counts(self) -> dict:
        """What /health says of the engine: requests queued, batches run, programs held and compiled."""
        return {
            "queued": self.queued,
            "batches": self.batches,
            "programs": len(self.programs),
            "compiles": self.compiles,
        }

    @property
    def queued(self) -> int:
        return len(self.pending)
