"""Layouts of a round, timed on the device that samples and kept in the run directory (layouts.json).

A kind that tunes (``sedd.kinds.capabilities.Tunes``: the spec kind's draft
groups, an AR run's draft head) has a few candidate layouts of its rounds,
each a program of its own whose speed depends on the device, its CPU, the
compute dtype and the batch as much as on the run. ``choose`` times the
candidates end to end (``time_layouts``: the network, the loop, how often
this run's drafts are kept), keeps the fastest in the run's layouts.json
under this ``device_key``, and reads it back the next time.

An entry is used only when it names one of the run's own candidates, timed
beside all of them; anything else (a file sedd did not write, an entry of
another run or an older sedd, a link or a FIFO at its name) is timed again
and written over: what the file holds never stops a run from sampling, and
what sedd writes there it reads again. A layout asked for on the command
line is the kind's to check, and is never stored.

A layout is a value with ``name`` (its spelling in the file), ``k`` (drafts
a round; 0: none) and ``positions`` (a call's).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from sedd import files, kernels

LAYOUTS_FILE = "layouts.json"
"""The layouts chosen for a run, by device and batch, in its run directory (``choose``)."""


def device_key(dtype, batch: int) -> str:
    """What a layout's speed depends on besides the run: the device, its CPU, the compute dtype, the batch."""
    dev = jax.devices()[0]
    return f"{dev.platform} {dev.device_kind} | {kernels.cpu_model()} | {jnp.dtype(dtype).name} | batch {batch}"


def time_layouts(
    sample: Callable, layouts: Sequence, length: int, batch: int, *, rounds: int = 5, progress: bool = False
) -> list[dict]:
    """Each layout's tokens/s on this device: texts of `length` at `batch`, timed interleaved, the median of rounds
    (each compiled first, not timed). End to end, so it picks what is fastest here whatever makes it so.

    Args:
      sample: (layout, seed) -> (tokens, stats): `batch` texts of `length` in that layout, stats with
        "nfe_per_sample" (the network calls of each text).
    Returns:
      [{"layout": its name, "positions": a call's, "tokens_per_s", "tokens_per_call"}], fastest first.
    """

    def run(layout, seed):
        tokens, stats = sample(layout, seed)
        return jax.block_until_ready(tokens), float(np.mean(np.asarray(stats["nfe_per_sample"])))

    for layout in tqdm(layouts, desc="compiling the layouts to time", disable=not progress, leave=False):
        run(layout, 0)
    seconds, calls = {lay: [] for lay in layouts}, {lay: [] for lay in layouts}
    for r in range(rounds):
        for layout in layouts if r % 2 == 0 else layouts[::-1]:
            t = time.perf_counter()
            calls[layout].append(run(layout, r + 1)[1])
            seconds[layout].append(time.perf_counter() - t)
    rows = [
        {
            "layout": lay.name,
            "positions": lay.positions,
            "tokens_per_s": batch * length / float(np.median(seconds[lay])),
            "tokens_per_call": length / float(np.mean(calls[lay])),
        }
        for lay in layouts
    ]
    return sorted(rows, key=lambda row: -row["tokens_per_s"])


def _stored(saved: Any, where: str, candidates: Sequence) -> tuple[Any, list] | None:
    """(layout, timed rows) of the file's entry for `where` when it names one of `candidates` and times them all."""
    entry = saved.get(where) if isinstance(saved, dict) else None
    if not isinstance(entry, dict):
        return None
    rows = (
        [row for row in entry.get("timed", []) if isinstance(row, dict)] if isinstance(entry.get("timed"), list) else []
    )
    named = {lay.name: lay for lay in candidates}
    layout = named.get(entry.get("layout")) if isinstance(entry.get("layout"), str) else None
    return (layout, rows) if layout is not None and set(named) <= {row.get("layout") for row in rows} else None


def _against_no_drafts(layout, rows: list, candidates: Sequence) -> str:
    """How the layout's tokens/s compare with no drafts' in the timed rows ("" where either is missing)."""
    speed = {row.get("layout"): row.get("tokens_per_s") for row in rows}
    none = next((lay.name for lay in candidates if not lay.k), None)
    mine, alone = speed.get(layout.name), speed.get(none)
    ok = all(isinstance(v, (int, float)) and v > 0 for v in (mine, alone))
    return f", {mine / alone:.2f}x the tokens/s of no drafts" if ok and layout.k else ""


def choose(
    candidates: Sequence, sample: Callable, *, length: int, batch: int, dtype, workdir=None, progress: bool = False
) -> tuple[Any, str]:
    """The fastest of `candidates` on this device at this batch (``time_layouts`` with `sample`), kept in
    workdir/layouts.json and read back for the same ``device_key`` (without a workdir nothing is kept).

    Returns:
      (the layout, a line saying what was chosen, against no drafts, from what).
    """
    where = device_key(dtype, batch)
    path = None if workdir is None else Path(workdir) / LAYOUTS_FILE
    saved, again = {}, ""
    if path is not None and (path.exists() or path.is_symlink()):
        try:
            saved = files.read_json(path, 1 << 20, root=workdir)  # a file nested 200,000 deep too
        except (ValueError, RecursionError, OSError, files.UnsafeFile) as e:
            saved, again = {}, f"; {path} was not a layouts file sedd wrote ({str(e)[:200]}): timed again"
        if found := _stored(saved, where, candidates):
            layout, rows = found
            return layout, (
                f"layout {layout}{_against_no_drafts(layout, rows, candidates)}, chosen earlier on this device ({path})"
            )
        if not again and isinstance(saved, dict) and where in saved:
            again = f"; {path} named another layout for this device, not one of this run's: timed again"
    rows = time_layouts(sample, candidates, length, batch, progress=progress)
    layout, kept = next(lay for lay in candidates if lay.name == rows[0]["layout"]), ""
    if path is not None:
        saved = dict(saved) if isinstance(saved, dict) else {}
        saved[where] = {"layout": layout.name, "timed": rows}
        try:  # a run directory one may read but not write (a received run) still samples, timed each time
            files.write_text(path, json.dumps(saved, indent=1) + "\n", workdir)  # no link followed, nothing opened
        except (OSError, files.UnsafeFile) as e:
            kept = f" (not kept in {path}: {getattr(e, 'strerror', None) or e})"
    table = ", ".join(
        f"{r['layout']}: {r['tokens_per_s']:,.0f} tokens/s ({r['tokens_per_call']:.2f} a call)" for r in rows
    )
    return layout, (
        f"layout {layout}{_against_no_drafts(layout, rows, candidates)}, the fastest here at batch {batch}: "
        f"{table}{kept}{again}"
    )


def settle(
    asked, candidates: Sequence, speculate: Callable, net, length: int, batch: int, workdir=None, progress=False
) -> tuple[Any, str]:
    """(layout, line) of a kind that tunes: `asked` (a layout given for one call, already checked against the run:
    used, never stored), else ``choose`` among `candidates`, each timed with speculate(key, graphdef, state,
    batch, length, layout) -> (tokens, stats) on the network `net` (a ``sedd.kinds.Net``)."""
    if asked is not None:
        return asked, f"layout {asked}, as asked"

    def sample(layout, seed):
        return speculate(jax.random.key(seed), net.graphdef, net.state, batch, length, layout)

    return choose(
        candidates, sample, length=length, batch=batch, dtype=net.model.dtype, workdir=workdir, progress=progress
    )
