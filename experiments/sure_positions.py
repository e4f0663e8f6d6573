"""How many tokens a call a parallel decoder could commit where an AR run is sure: a ceiling, on the run's own texts.

    python experiments/sure_positions.py RUN [RUN ...] [--samples 64] [--block 4 8 16] [--json FILE]

An AR run writes `--samples` texts of its length (temperature 1, its KV cache) and scores them: p_l is the
largest probability of its law for x_l given x_{<l}. A decoder that commits, each call, the first open
position and the positions after it while the AR law's largest probability there is >= tau (inside a block
of b) writes, on those texts,

    tokens a call = L / (number of calls),   a call starting at l, taking l+1 .. l+j while p_{l+1..l+j} >= tau

That is an upper bound for any left-to-right threshold decoder (``sampling.left_to_right``) whose network
has the AR run's quality, on average: its law for x_{l+1} is a marginal over x_l, and max_v E p(v | x_l)
<= E max_v p(v | x_l), no surer than the AR conditionals given x_l. Together with the cost of a call on b
positions against one (``bench.py speculative --cost_only``) it bounds the speed a block decoder can reach
at the AR run's quality on this machine (docs/benchmarks.md, "Why").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from sedd import runs
from sedd.kinds import causal

TAUS = (0.5, 0.7, 0.9, 0.99)


def largest_probs(run, samples: int, seed: int = 0) -> np.ndarray:
    """p_l = max_v p(x_l = v | x_{<l}) on `samples` texts the run writes: float[samples, L]."""
    x = causal.ancestral(jax.random.key(seed), run.net.graphdef, run.net.state, samples, run.seq_len)
    logits = causal.next_token_logits(run.model, jnp.asarray(x))
    return np.asarray(jax.nn.softmax(logits.astype(jnp.float32), -1).max(-1))


def tokens_a_call(p: np.ndarray, tau: float, block: int | None) -> float:
    """Tokens a call of the threshold decoder above on rows p [B, L] (blocks of `block` positions; None: one)."""
    calls = 0
    for row in p:
        length, l = len(row), 0
        while l < length:
            end = length if block is None else (l // block + 1) * block
            j = l + 1
            while j < min(end, length) and row[j] >= tau:
                j += 1
            calls, l = calls + 1, j
    return p.size / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="AR run folders")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--block", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    out = {}
    for path in args.runs:
        p = largest_probs(runs.load(path), args.samples)
        rows = {}
        for tau in TAUS:
            rows[str(tau)] = {"sure": float((p >= tau).mean())} | {
                f"b={b}": tokens_a_call(p, tau, b) for b in args.block
            }
            cells = "  ".join(f"b={b} {rows[str(tau)][f'b={b}']:.2f}" for b in args.block)
            print(f"{path}: tau {tau}: {rows[str(tau)]['sure']:.3f} of positions sure; tokens a call {cells}")
        out[path] = rows
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
