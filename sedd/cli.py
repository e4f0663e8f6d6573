"""The `sedd` command: train | sample | eval | bench. Thin: it parses and calls library functions.

  sedd train  [--config FILE|NAME] [--workdir DIR] [--config.section.key=value ...]
  sedd sample --workdir DIR [--steps N] [--predictor P] [--num_samples K] [--seed S]
              [--prefix TEXT] [--suffix TEXT] [--infill TEMPLATE] [--output FILE] [--animate]
  sedd eval   --workdir DIR [--split S] [--num_t N] [--max_batches K] [--data.name=... --data.path=...]
  sedd eval   --workdir DIR --compare [--predictors euler,analytic] [--steps 8,16,...] [--judge DIR]
  sedd bench  train|sampler|ar|memory|all [--quick] [...]   (see `sedd bench all --help`)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np


def _train(args, overrides: list[str]) -> int:
    from sedd import config as config_lib
    from sedd import train as train_lib

    config = config_lib.load_config(args.config)
    config_lib.apply_overrides(config, overrides)
    workdir = Path(args.workdir or Path("checkpoints") / Path(args.config).stem)
    print(f"run directory: {workdir}")
    result = train_lib.train(config, workdir)
    if result.get("stopped"):
        return 0
    unit = "char" if "val_bits_per_char" in result else "token"
    bound = result[f"val_bits_per_{unit}"]
    print()
    entropy = result.get(f"unigram_entropy_bits_per_{unit}", result["unigram_entropy_bits"])
    print(f"step {result['step']}: validation bound {bound:.3f} bits/{unit}, against "
          f"{entropy:.3f} bits/{unit} for the unigram law of the training data "
          f"(perplexity bound {result['val_ppl_bound']:.2f} per token)")
    print("samples:")
    for s in result["samples"]:
        print("  " + s.replace("\n", "\n  "))
    print(f"\nmore: sedd sample --workdir {workdir} --prefix 'ROMEO:'")
    return 0


def conditioning(tokenizer, seq_len: int, num: int, prefix: str = "", suffix: str = "",
                 infill: str = "", blank: str = "_"):
    """fixed_mask, fixed_tokens (bool/int32[num, seq_len]) from text prompts, or (None, None).

    prefix fills the first positions, suffix the last; an infill template fills
    positions 0.. with its characters except `blank`, which marks free positions
    (character tokenizers only). Raises ValueError for characters outside the
    vocabulary or prompts longer than the model's sequence length.
    """
    if not (prefix or suffix or infill):
        return None, None
    mask = np.zeros(seq_len, bool)
    tokens = np.zeros(seq_len, np.int32)
    if infill:
        if prefix or suffix:
            raise ValueError("--infill cannot be combined with --prefix/--suffix (put them in the template)")
        if len(infill) > seq_len:
            raise ValueError(f"the infill template has {len(infill)} characters; the model's sequence length is {seq_len}")
        for i, ch in enumerate(infill):
            if ch != blank:
                ids = tokenizer.encode(ch)
                if len(ids) != 1:
                    raise ValueError("--infill needs a character-level tokenizer (char or byte with ASCII text)")
                mask[i], tokens[i] = True, ids[0]
    else:
        pre = np.asarray(tokenizer.encode(prefix), np.int32) if prefix else np.zeros(0, np.int32)
        suf = np.asarray(tokenizer.encode(suffix), np.int32) if suffix else np.zeros(0, np.int32)
        if len(pre) + len(suf) > seq_len:
            raise ValueError(
                f"prefix ({len(pre)} tokens) + suffix ({len(suf)} tokens) is longer than the "
                f"model's sequence length {seq_len}"
            )
        mask[: len(pre)], tokens[: len(pre)] = True, pre
        if len(suf):
            mask[seq_len - len(suf):], tokens[seq_len - len(suf):] = True, suf
    return np.broadcast_to(mask, (num, seq_len)), np.broadcast_to(tokens, (num, seq_len))


def _animate(tokenizer, trajectory, mask_id: int, delay: float) -> None:
    """Redraw the first sample in place as it is denoised (masks shown as '_')."""
    for n, frame in enumerate(trajectory):
        ids = [int(i) for i in frame[0]]
        text = "".join("_" if i == mask_id else tokenizer.decode([i]) for i in ids)
        sys.stdout.write("\x1b[2J\x1b[H" + f"[{n}/{len(trajectory) - 1}]\n" + text + "\n")
        sys.stdout.flush()
        time.sleep(delay)


def _sample(args) -> int:
    import jax

    from sedd import train as train_lib

    config, tokenizer, trainer, params = train_lib.load_run(args.workdir)
    steps = args.steps or config.sampling.steps
    mask, tokens = conditioning(tokenizer, config.data.seq_len, args.num_samples, args.prefix, args.suffix, args.infill)
    kwargs = dict(predictor=args.predictor or config.sampling.predictor)
    if mask is not None:
        kwargs.update(fixed_mask=jax.numpy.asarray(mask), fixed_tokens=jax.numpy.asarray(tokens))
    if args.animate:
        kwargs.update(return_trajectory=True, trajectory_every=max(1, steps // 64))
    out = train_lib.generate(trainer, params, jax.random.key(args.seed), args.num_samples, steps, **kwargs)
    if args.animate:
        out, trajectory = out
        _animate(tokenizer, np.asarray(trajectory), trainer.graph.dim - 1 if trainer.graph.absorb else -1, 4.0 / len(trajectory))
    texts = [train_lib.decode(tokenizer, s) for s in np.asarray(out)]
    body = "\n\n".join(texts) + "\n"
    if args.output:
        Path(args.output).write_text(body)
        print(f"wrote {len(texts)} samples to {args.output}")
    else:
        for i, t in enumerate(texts):
            print(f"--- sample {i}\n{t}")
    return 0


def _int_list(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--steps must be comma-separated integers, got {text!r}") from None


def _eval(args, overrides: list[str]) -> int:
    from sedd import evaluate

    if args.compare:
        rows = evaluate.compare_samplers(
            args.workdir, predictors=[p for p in args.predictors.split(",") if p],
            steps=_int_list(args.steps), num_samples=args.num_samples, judge=args.judge, seed=args.seed)
        print(Path(args.workdir, "compare_samplers.md").read_text())
        print(f"wrote {args.workdir}/compare_samplers.csv, .md, .png ({len(rows)} rows)")
        return 0
    data = {}
    for arg in overrides:  # --data.name=text --data.path=other.txt: zero-shot on other text
        if not arg.startswith("--data.") or "=" not in arg:
            raise ValueError(f"unexpected argument {arg!r}; data overrides look like --data.path=other.txt")
        key, value = arg[len("--data."):].split("=", 1)
        data[key] = value
    figures = evaluate.evaluate_run(args.workdir, split=args.split, num_t=args.num_t, batch_size=args.batch_size,
                                    max_batches=args.max_batches or None, seed=args.seed, data=data or None)
    for k, v in figures.items():
        print(f"{k:>24}: {v:.4f}" if isinstance(v, float) else f"{k:>24}: {v}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `sedd` console script: parse argv, run the command, return the exit code."""
    parser = argparse.ArgumentParser(prog="sedd", description="Score Entropy Discrete Diffusion in JAX")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train (or resume) a model", description="Train or resume. "
                       "Override any config field with --config.section.key=value.")
    p.add_argument("--config", default="shakespeare_char", help="a config file, or a shipped config's name")
    p.add_argument("--workdir", default=None, help="run directory (default: checkpoints/<config name>)")

    p = sub.add_parser("sample", help="write text with a trained model")
    p.add_argument("--workdir", required=True, help="run directory of a trained model")
    p.add_argument("--steps", type=int, default=None, help="reverse steps (default: the config's)")
    p.add_argument("--predictor", default=None, help="analytic or euler (default: the config's)")
    p.add_argument("--num_samples", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefix", default="", help="text the samples start with")
    p.add_argument("--suffix", default="", help="text the samples end with")
    p.add_argument("--infill", default="", help="a template whose '_' characters are filled in")
    p.add_argument("--output", default="", help="write the samples to this file")
    p.add_argument("--animate", action="store_true", help="show the denoising of the first sample")

    p = sub.add_parser("eval", help="likelihood bound of a trained run, or compare samplers (--compare)")
    p.add_argument("--workdir", required=True, help="run directory of a trained model")
    p.add_argument("--split", default="validation")
    p.add_argument("--num_t", type=int, default=64, help="points of the t grid of the bound")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--max_batches", type=int, default=8, help="0 = the whole split")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare", action="store_true", help="compare predictors x steps instead")
    p.add_argument("--predictors", default="euler,analytic")
    p.add_argument("--steps", default="8,16,32,64,128,256,1024")
    p.add_argument("--num_samples", type=int, default=16)
    p.add_argument("--judge", default=None, help="an AR run directory (default: WORKDIR/ar)")

    sub.add_parser("bench", help="speed and memory benchmarks (train | sampler | ar | memory | all)",
                   add_help=False)

    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        from sedd import bench

        return bench.main(rest)
    try:
        if args.command == "train":
            return _train(args, rest)
        if args.command == "eval":
            return _eval(args, rest)
        if rest:
            parser.error(f"unrecognised arguments: {' '.join(rest)}")
        return _sample(args)
    except (ValueError, KeyError, FileNotFoundError, RuntimeError, FloatingPointError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"sedd {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
