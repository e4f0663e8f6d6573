"""How a study asks a run to write texts: by what its kind does (``sedd.kinds.Kind``), never by its name.

A kind says whether it samples by denoising steps (``diffuses``), how many
steps write one token a step over a length (a diffusing kind's
``one_token_steps``: L for SEDD, b for a block model, which takes its steps a
block), and a short name for tables (``label``). A run that does not diffuse
is a causal LM (an AR run, a spec run's causal half): given no options it
writes one token a call on its KV cache, at any length; its options (a
draft, a spec run's layout) choose its speculative rounds.
"""

from __future__ import annotations

from typing import Callable

from sedd import runs, sampling

from sedd.kinds import causal
from sedd.kinds.capabilities import Diffuses


def by_blocks(kind, length: int) -> bool:
    """Whether a run of this kind denoises `length` positions a block at a time (block diffusion, b < L).

    Such a run takes its steps per block and writes past its length block by
    block; a whole-sequence denoiser (SEDD) takes its steps for all positions.
    """
    return isinstance(kind, Diffuses) and kind.one_token_steps(length) < length


def steps_of(run: runs.Run, steps: int | None) -> int | None:
    """`steps`, or where None the steps that write one token a step (a block's for a block model; None for AR)."""
    return steps or (run.kind.one_token_steps(run.seq_len) if isinstance(run.kind, Diffuses) else None)


def writer(
    run: runs.Run,
    sampler: str | None,
    options: dict,
    steps: int | None,
    batch: int,
    length: int,
    key,
    max_length: bool = True,
) -> Callable[[], sampling.Samples]:
    """A function of no arguments that writes `batch` unprompted texts of `length` tokens with the run.

    Args:
      run: a loaded run of any kind.
      sampler, options: a diffusion run's sampler and its options; for a run that does not diffuse, the
        options of its ``Run.sample`` (a draft, draft_k, a spec run's layout, ...), none for the causal LM's
        plain KV-cached loop (a spec run's causal half alone, too).
      steps: a diffusion run's steps (per block for a block model); None: one token a step (``steps_of``).
      batch, length: the texts' count and tokens.
      key: the random key of every call (each call writes the same texts).
      max_length: a diffusion run writes `length` tokens in windows (``max_length``); False: its own L.
    Returns:
      () -> ``sampling.Samples`` with stats (None for the plain AR loop, whose calls are `length`).
    """
    kind = run.kind
    if not (isinstance(kind, Diffuses) or options):  # the causal LM's own loop, one token a call, at any length
        return lambda: sampling.Samples(causal.ancestral(key, run.net.graphdef, run.net.state, batch, length))
    if not isinstance(kind, Diffuses):  # its drafts, or a spec run's own rounds: its length L
        return lambda: run.sample(key, batch, return_stats=True, **options)
    extra = {"max_length": length} if max_length else {}
    return lambda: kind.sample(
        key, run.net, batch, steps_of(run, steps), sampler, return_stats=True, **extra, **options
    )
