"""`bench.py rng`: dropout masks and race words, JAX's random bits against ``sedd.rng``'s."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from experiments.timing import format_table, interleaved, median, paired_ratio


def run_rng(quick: bool, args) -> dict:
    """Dropout masks and race words: JAX's random bits against ``sedd.rng``'s (every word of a block used).

    A dropout mask with its select, (8, 256, 256) as at the original SEDD's
    sizes, from ``jax.random.bernoulli``, ``jax.random.bits(..., uint16)`` and
    ``sedd.rng.uint16``; the two uint32 words per entry of an exponential race,
    (64, 32, 87) as in the load test of ``sedd serve``, from ``jax.random.bits``
    and ``sedd.rng.words``. Run under ``taskset -c 0`` for the cost on one core.
    """
    from sedd import rng  # noqa: PLC0415

    mask_shape, race_shape = ((2, 16, 32), (4, 8, 9)) if quick else ((8, 256, 256), (64, 32, 87))
    key, x, drop = jax.random.key(0), jnp.ones(mask_shape, jnp.float32), round(0.1 * 2**16)
    masks = {
        "bernoulli": lambda k, x: jnp.where(jax.random.bernoulli(k, 0.9, x.shape), x / 0.9, 0.0),
        "bits uint16": lambda k, x: jnp.where(jax.random.bits(k, x.shape, jnp.uint16) >= drop, x / 0.9, 0.0),
        "sedd.rng.uint16": lambda k, x: jnp.where(rng.uint16(k, x.shape) >= drop, x / 0.9, 0.0),
    }
    races = {
        "bits (2, ...) uint32": lambda k: jax.random.bits(k, (2, *race_shape), jnp.uint32),
        "sedd.rng.words": lambda k: rng.words(k, race_shape),
    }
    fns = {name: functools.partial(jax.jit(f), key, x) for name, f in masks.items()}
    fns |= {name: functools.partial(jax.jit(f), key) for name, f in races.items()}
    calls = 3 if quick else 30  # calls per timing: a mask is ~1 ms
    batched = {name: (lambda f=f: [f() for _ in range(calls)][-1]) for name, f in fns.items()}
    times = interleaved(batched, args.repeats)
    rows, results = [], []
    for name in fns:
        what = f"mask {mask_shape}" if name in masks else f"race words {race_shape}"
        ms = median(times[name]) / calls * 1e3
        base = "bits uint16" if name in masks else "bits (2, ...) uint32"
        speedup = paired_ratio(times[base], times[name])
        results.append({"what": what, "method": name, "ms": ms, "speedup_over_jax": speedup})
        rows.append([what, name, f"{ms:.3f}", f"{speedup:.2f}x"])
    table = format_table(["draw", "method", "ms a call", "vs jax.random.bits"], rows)
    return {"benchmark": "rng", "results": results, "table": table}
