"""The per-sequence loss and gradient norm of the score-entropy loss against t, on a trained run.

  python experiments/grad_vs_t.py --workdir RUN [--times 0.001,0.01,0.1,0.3,0.9]

The draw of t that gives the training gradient its least variance is
q(t) ~ sqrt(E[|grad l|^2 | t]) (importance sampling; `training.t_power`,
docs/math.md). This prints that RMS, and the loss's, at a few times, for
the first `--sequences` sequences of the validation split of the run's
data, each noised `--draws` times.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sedd import losses, runs
from sedd.data import load_dataset


def sequences(run: runs.Run, n: int) -> jax.Array:
    """int32[n, L]: the first n sequences of the validation split of the run's own data."""
    dataset = load_dataset(run.config.data, tokenizer=run.tokenizer)
    split = "validation" if "validation" in dataset.splits else [s for s in dataset.splits if s != "train"][0]
    rows = np.concatenate([np.asarray(b) for b, _ in zip(dataset.eval_batches(n, split=split), range(1))])
    return jnp.asarray(rows[:n], jnp.int32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    p.add_argument("--times", default="0.001,0.003,0.01,0.03,0.1,0.3,0.6,0.9")
    p.add_argument("--sequences", type=int, default=16)
    p.add_argument("--draws", type=int, default=8)
    args = p.parse_args()
    run = runs.load(args.workdir, ema=False, step=args.step)  # the weights the optimizer moves
    x0 = sequences(run, args.sequences)

    def loss(params, key, x, t):
        model = nnx.merge(run.graphdef, params, run.rest)
        score = lambda x_t, sigma: model(x_t, sigma, deterministic=True)  # noqa: E731
        return losses.loss_fn(key, score, run.graph, run.noise, x[None], t=t[None])[0]

    per_seq = jax.jit(jax.vmap(jax.value_and_grad(loss), in_axes=(None, 0, 0, None)))
    norm = jax.vmap(lambda g: jnp.sqrt(sum(jnp.sum(jnp.square(v.astype(jnp.float32))) for v in jax.tree.leaves(g))))
    print(f"{run.seq_len} tokens a sequence, step {run.step}; nats per sequence")
    print("t        loss mean  loss rms   |grad| mean  |grad| rms")
    for t in (float(s) for s in args.times.split(",")):
        ls, gs = [], []
        for d in range(args.draws):
            value, grads = per_seq(run.params, jax.random.split(jax.random.key(d), len(x0)), x0, jnp.float32(t))
            ls.append(np.asarray(value))
            gs.append(np.asarray(norm(grads)))
        ls, gs = np.concatenate(ls), np.concatenate(gs)
        print(
            f"{t:<8g} {ls.mean():9.1f} {np.sqrt(np.mean(ls**2)):9.1f} {gs.mean():12.1f} {np.sqrt(np.mean(gs**2)):11.1f}"
        )


if __name__ == "__main__":
    main()
