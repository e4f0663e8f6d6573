"""What a long loop says while it runs: lines above its progress bar, and its pace and the time left.

``BarLines`` prints a line on a line of its own above a tqdm bar, on a
terminal or into a pipe; ``Pace`` times the loop's plain steps once compiled
and re-estimates the time the steps left will take; ``MetricsWriter`` logs
its figures. ``sedd.train`` uses them.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import jax
from tqdm.auto import tqdm

from sedd import files

PACE_STEPS = 10  # plain steps timed, after the first (which compiles), for the steps/s and ETA line
PACE_SETTLE = 4  # plain steps let run before they are timed: the first runs still grow the heap
PACE_WEIGHT = 0.1  # the newest window's weight in the pace's moving average: about the last 100 steps count


class BarLines:
    """`say`: lines printed to stdout, each on a line of its own, above the loop's progress bar once it is drawn.

    Where stdout and the bar's stream are both a terminal, tqdm.write clears
    the bar, writes and redraws it. Elsewhere (`sedd train | tee log`,
    `> log 2>&1`) the bar's carriage-return redraws never end their line, so
    that line is ended first, once for each count the bar has reached (a
    count it skipped drawing costs a blank line); and stdout is flushed, as a
    pipe buffers it while the bar's stderr is not, so the line lands in order.
    """

    def __init__(self, quiet: bool = False):
        self.quiet, self.bar = quiet, None  # bar: the loop's tqdm, set once drawn
        self.ended_at = None  # the bar's count when its line was last ended

    def __call__(self, *parts) -> None:
        if self.quiet:
            return
        text, bar = " ".join(str(x) for x in parts), self.bar
        drawn = bar is not None and not bar.disable
        if not drawn or (sys.stdout.isatty() and getattr(bar.fp, "isatty", lambda: False)()):
            tqdm.write(text)
        else:
            if self.ended_at != bar.n:  # the bar has been redrawn since its line was last ended
                bar.fp.write("\n")
                bar.fp.flush()
                self.ended_at = bar.n
            print(text)
        sys.stdout.flush()


def format_duration(seconds: float) -> str:
    """Seconds as "42 s", "13 min 5 s" or "2 h 7 min"."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


class Pace:
    """The loop's steps/s once compiled, and the time the steps left will take, re-estimated as the run goes.

    The first step of a run includes compilation, so a rate counted from the
    start (tqdm's) gives an ETA far too long at first. A timed window opens
    `settle` plain steps after the first step, and again after any step that
    also evaluated, sampled or saved, and closes `window` plain steps later
    (the first runs after a compilation still fault fresh memory in while the
    heap grows to its size, `sedd.kernels.keep_freed_memory`); the next
    window opens where one closes. The first window's pace is said once, as
    a line; a shared host's pace then changes (docs/studies/default_run.md,
    "The time left a run prints"), so every later window is folded into a moving average of the seconds a step takes, the newest
    window weighted `weight`, and `left` re-estimates the time of the steps
    left from it. The device is waited on at the windows' ends only.

    n_iters is the run's last step; active False (a quiet run): no line, no waits; clock: seconds now
    (a fake one in tests).
    """

    def __init__(
        self,
        n_iters: int,
        window: int = PACE_STEPS,
        active: bool = True,
        settle: int = PACE_SETTLE,
        weight: float = PACE_WEIGHT,
        clock=time.perf_counter,
    ):
        self.n_iters, self.window, self.settle, self.weight, self.clock = n_iters, window, settle, weight, clock
        self.active, self.said = active, not active
        self.opens_after = None  # the step after which the next window opens
        self.opened = None  # (step, seconds) at which the window opened
        self.seconds_per_step = None  # the moving average, once a window has closed

    def update(self, step: int, state: dict, busy: bool) -> str | None:
        """After `step`, which compiled, evaluated, sampled or saved if `busy`; the line when the first window
        closes with steps left to predict."""
        if not self.active:
            return None
        if busy or self.opens_after is None:
            self.opens_after, self.opened = step + self.settle, None
            if self.opens_after + self.window >= self.n_iters:  # no step left to time and predict
                return None
        if self.opened is None:
            if step >= self.opens_after and step + self.window < self.n_iters:
                jax.block_until_ready(state["step"])
                self.opened = (step, self.clock())
            return None
        start, opened_at = self.opened
        if step - start < self.window:
            return None
        jax.block_until_ready(state["step"])
        now = self.clock()
        per_step = (now - opened_at) / (step - start)
        mean = self.seconds_per_step
        self.seconds_per_step = per_step if mean is None else self.weight * per_step + (1 - self.weight) * mean
        self.opened = (step, now) if step + self.window < self.n_iters else None
        if self.said or step >= self.n_iters:
            return None
        self.said = True
        left = self.n_iters - step
        return (
            f"speed: {1 / per_step:.3g} steps/s (steps {start + 1}-{step}, compilation excluded); the "
            f"{left:,} steps left take about {format_duration(left * per_step)}, evaluations and the final "
            "bound not counted (re-estimated at each evaluation)"
        )

    def left(self, step: int) -> str | None:
        """The time the steps after `step` will take at the recent pace, as a line; None before a window closed."""
        if not self.active or self.seconds_per_step is None or step >= self.n_iters:
            return None
        left = self.n_iters - step
        return (
            f"speed: {1 / self.seconds_per_step:.3g} steps/s lately; the {left:,} steps left take about "
            f"{format_duration(left * self.seconds_per_step)}, evaluations and the final bound not counted"
        )


class MetricsWriter:
    """What a loop logs: one JSON object per logged step appended to `path` (a run's metrics.jsonl), and
    TensorBoard event files in <workdir>/tensorboard where tensorboardX is installed. Inactive on processes
    other than 0."""

    def __init__(self, path: Path, workdir: Path, active: bool = True):
        self.path = path
        self.file = files.open_append(path, workdir) if active else None  # never a FIFO, a link, another's file
        self.tb = None
        if active:
            try:
                from tensorboardX import SummaryWriter  # optional dependency: pip install tensorboardX
            except ImportError:  # no writer installed: metrics.jsonl only
                SummaryWriter = None
            with files.disk_errors(workdir / "tensorboard", "made"):
                self.tb = SummaryWriter(str(workdir / "tensorboard")) if SummaryWriter else None

    def write(self, row: dict) -> None:
        if self.file is None:
            return
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        if self.tb is not None:
            for k, v in row.items():
                if k != "step":
                    self.tb.add_scalar(k, v, row["step"])

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()
