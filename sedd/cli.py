"""The `sedd` command: train | distill | sample | eval | convert | serve. Thin: it parses and calls library functions.

sedd train  [--config FILE|NAME] [--workdir DIR] [--config.section.key=value ...]
sedd sample --workdir DIR [--steps N] [--sampler P] [--num_samples K] [--seed S]
            [--prefix TEXT] [--suffix TEXT] [--infill TEMPLATE [--blank C]] [--temperature T] [--top_p P]
            [--output FILE[.jsonl]] [--animate]
sedd distill --teacher RUN --workdir DIR [--rounds R] [--config.section.key=value ...]
sedd eval   --workdir DIR [--split S] [--num_t N] [--max_batches K] [--config.data.path=... ...]
            [--code_samples K [--prompt_chars P] [--judge AR_RUN]]
sedd convert SRC DST [--no_ema] [--tokenizer_path PATH] [--dtype D]   (SEDD's, MDLM's, BD3-LM's, DUO's weights)
sedd serve  --workdir DIR [--host 127.0.0.1] [--port 8000] [...]       (needs sedd-jax[serve])
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
import warnings
from pathlib import Path

import jax
import numpy as np

from sedd import config as config_lib
from sedd import convert, distill, files, figures, kernels, runs, sampling, train, validate
from sedd.data import load_tokenizer, sample_prompt
from sedd.data.tokenizers import EOS_TEXT
from sedd.kinds import capabilities
from sedd.sampling import text_conditioning


def _train(args, overrides: list[str]) -> int:
    config = config_lib.load_config(args.config, overrides)
    runs.check_config(config, f"--config {args.config}" + " and its overrides" * bool(overrides))  # before any work
    workdir = Path(args.workdir or Path("checkpoints") / Path(args.config).stem)
    print(f"run directory: {workdir}")
    result = train.train(config, workdir, split_cpu=True)  # connects the processes, then splits this CPU
    if result.get("stopped"):  # saved and stopping: a late second Ctrl-C must not interrupt the exit
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        return 0
    bound, t = result["bound"], config.training
    unit = "char" if "bits_per_char" in bound else "token"
    per = bound[f"bits_per_{unit}"] / bound["nats_per_token"]  # bits per nat of this unit
    entropy = result.get(f"unigram_entropy_bits_per_{unit}", result["unigram_entropy_bits"])
    print()
    if bound["exact"]:  # a model with an exact likelihood (the AR baseline) reports its NLL
        print(f"step {result['step']}: validation NLL {bound[f'bits_per_{unit}']:.3f} bits/{unit}", end="")
    else:
        print(
            f"step {result['step']}: validation bound {bound[f'bits_per_{unit}']:.3f} "
            f"+- {2 * bound['stderr_nats_per_token'] * per:.3f} bits/{unit} (2 standard errors; an upper bound "
            f"on the NLL of the data)",
            end="",
        )
    print(
        f", against {entropy:.3f} bits/{unit} for the unigram law of the training data.\n"
        f"`sedd eval --workdir {workdir} --batch_size {t.batch_size} --max_batches {t.eval_batches}` "
        f"computes the same figure."
    )
    for i, s in enumerate(result["samples"]):  # marked as `sedd sample` marks them
        print(f"--- sample {i}\n{s}")
    _explain_separator(result["samples"])
    try:  # a prompt from the run's own data that its vocabulary can write (the plays: ROMEO:)
        prompt = sample_prompt(config.data, load_tokenizer(workdir / runs.TOKENIZER))
    except (ValueError, OSError):  # the data moved since: the hint goes without a prompt
        prompt = ""
    prefix = " --prefix '" + escape(prompt).replace("'", "'\\''") + "'" if prompt else ""
    print(f"\nmore: sedd sample --workdir {workdir}{prefix} --seed 1")
    return 0


def _distill(args, overrides: list[str]) -> int:
    config = distill.distill_config(args.teacher, overrides, args.rounds)
    runs.check_config(config, f"--teacher {args.teacher}" + " and the overrides" * bool(overrides))
    d = config.distill
    print(
        f"run directory: {args.workdir}\nteacher: {d.teacher} (step {d.teacher_step}, {d.teacher_steps} steps); "
        f"{d.rounds} round(s) of {d.round_steps} steps, divergence {d.divergence}: "
        + " -> ".join(str(d.teacher_steps >> r) for r in range(d.rounds + 1))
        + " sampling steps"
    )
    result = distill.distill(config, args.workdir, split_cpu=True)
    if result.get("stopped"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        return 0
    bound = result["bound"]
    unit = "char" if "bits_per_char" in bound else "token"
    print()
    for r in result["rounds"]:
        minutes = "?" if r["minutes"] is None else f"{r['minutes']:.1f}"
        print(
            f"round {r['round']}: {r['steps']} steps, {minutes} min, divergence "
            f"{r['loss_nats_per_token']:.4f} nats/token (last logged)"
        )
    print(
        f"step {result['step']}: validation bound {bound[f'bits_per_{unit}']:.3f} bits/{unit}; the student samples "
        f"with {config.sampling.steps} steps by default"
    )
    for i, s in enumerate(result["samples"]):
        print(f"--- sample {i}\n{s}")
    print(f"\nmore: sedd sample --workdir {args.workdir} --seed 1")
    return 0


def animation_labels(frames: int, every: int, steps: int) -> list[str]:
    """The label of each of `frames` trajectory frames kept every `every` of `steps` sampler steps.

    One sampler run keeps steps // every + 1 states: the start, then the
    state after every `every` steps; frame n shows step n * every of the run.
    A block run's trajectory is that for each block in turn (steps per
    block), then the finished text.
    """
    per = steps // every + 1
    if frames == per:
        return [f"[step {n * every}/{steps}]" for n in range(frames)]
    blocks = (frames - 1) // per
    if frames < per or (frames - 1) % per:  # a shape neither of the above: count the frames
        return [f"[frame {n}/{frames - 1}]" for n in range(frames)]
    return [f"[block {n // per + 1}/{blocks}, step {n % per * every}/{steps}]" for n in range(frames - 1)] + [
        f"[{blocks} blocks of {steps} steps: done]"
    ]


def _animate(run: runs.Run, trajectory, every: int, steps: int, delay: float) -> None:
    """Redraw the first sample in place as it is denoised (masks as sampling.MASK_CHAR, not --infill's blank "_"),
    each frame labelled with its step.

    On a terminal each frame clears the screen and waits `delay` seconds; where stdout is a file or a pipe the
    frames are written one after another as plain text, at once (clear-screen codes would land in the file).
    """
    mask_id = run.graph.dim - 1 if run.graph.absorb else -1
    live = sys.stdout.isatty()
    for label, frame in zip(animation_labels(len(trajectory), every, steps), trajectory):
        ids = np.asarray(frame[0]).tolist()
        text = "".join(sampling.MASK_CHAR if i == mask_id else run.tokenizer.decode([i]) for i in ids)
        sys.stdout.write(("\x1b[2J\x1b[H" if live else "") + label + "\n" + text + "\n")
        sys.stdout.flush()
        if live:
            time.sleep(delay)


def _sample(args) -> int:
    if args.num_samples > 1:  # (one sequence is runs.load's check)
        validate.check_memory(runs.read_config(args.workdir), args.num_samples, f"--num_samples {args.num_samples}: ")
    run = runs.load(args.workdir)
    key = jax.random.key(args.seed)
    options = {k: v for k, v in (("temperature", args.temperature), ("top_p", args.top_p)) if v != 1.0}
    if args.max_length is not None:
        options["max_length"] = args.max_length
    if args.stop:
        options["stop"] = True
    if args.draft:  # speculative sampling of an AR run: prompt lookup, a smaller AR run's or a block run's drafts
        options["draft"] = args.draft if args.draft == "ngram" else runs.load(args.draft)
    if args.draft_k is not None:  # the run's kind and the drafter check it (refused without a draft)
        options["draft_k"] = args.draft_k
    patterns = tuple(name for name in ("suffix", "infill") if getattr(args, name))
    capabilities.check_given(run.kind, steps=args.steps, sampler=args.sampler, patterns=patterns)
    layout = None if args.layout == "auto" else args.layout
    given = dict(options, layout=layout, return_trajectory=args.animate or None)  # all checked before timing
    if line := capabilities.tune(run.kind, run.net, given, args.workdir, args.num_samples, progress=True):
        print(line, file=sys.stderr, flush=True)  # its sampling's settings: the fastest here unless asked
    if args.animate:
        steps = args.steps if args.steps is not None else run.config.sampling.steps
        mask, tokens = run_conditioning(run, args)
        if mask is not None:
            options.update(fixed_mask=mask, fixed_tokens=tokens)
        every = max(1, steps // 64)  # 65 to 128 frames from 64 steps up, shown in about 4 s in all
        out = run.sample(
            key, args.num_samples, args.steps, args.sampler, return_trajectory=True, trajectory_every=every, **options
        )
        _animate(run, out.trajectory, every, steps, 4.0 / len(out.trajectory))
        texts = [run.decode(row) for row in out.tokens]
        calls, stats = None, None
    else:
        texts, stats = run.generate(
            key,
            args.num_samples,
            args.steps,
            args.sampler,
            prefix=args.prefix,
            suffix=args.suffix,
            infill=args.infill,
            blank=args.blank,
            return_stats=True,
            **options,
        )
        calls = network_calls(stats, args.num_samples)
    if args.output:  # checked before sampling (sedd.validate.check_path); a disk may still fill
        if args.output.endswith(".jsonl"):  # one JSON string per line: splits back into samples whatever they hold
            out = "".join(
                json.dumps({"sample": i, "text": t} | ({} if calls is None else calls_of_text(stats, calls, i))) + "\n"
                for i, t in enumerate(texts)
            )
        else:
            out = "".join(f"--- sample {i}\n{t}\n" for i, t in enumerate(texts))
        try:
            files.write_text(args.output, out, Path(args.output).parent)  # a temporary file renamed over it
        except (OSError, files.UnsafeFile) as e:
            raise ValueError(f"writing the samples to {args.output} failed: {e}") from None
        print(f"wrote {len(texts)} samples to {args.output}")
    else:
        for i, t in enumerate(texts):
            print(f"--- sample {i}\n{t}")
    if calls is not None:
        print(calls_line(stats, calls, infill=bool(args.infill), stop=args.stop), file=sys.stderr)
    _explain_separator(texts)
    return 0


def network_calls(stats: dict | None, rows: int) -> np.ndarray | None:
    """int[rows]: the network calls each text took (a drafter's counted too), from a sampler's stats; None
    where the sampler counts none."""
    if not stats or "nfe_per_sample" not in stats:
        return None
    calls = np.broadcast_to(np.asarray(stats["nfe_per_sample"]), (rows,)).astype(np.int64)
    return calls + np.broadcast_to(np.asarray(stats.get("draft_calls", 0)), (rows,)).astype(np.int64)


def calls_of_text(stats: dict, calls: np.ndarray, i: int) -> dict:
    """The `--output FILE.jsonl` figures of text i: its network calls, its tokens, those the model wrote (not the
    prompt's, the suffix's or the template's), and tokens written a call."""
    written = int(stats["written_per_sample"][i])
    return {
        "network_calls": int(calls[i]),
        "tokens": int(stats["tokens_per_sample"][i]),
        "tokens_written": written,
        "tokens_per_call": round(written / max(int(calls[i]), 1), 4),
    }


def calls_line(stats: dict, calls: np.ndarray, infill: bool = False, stop: bool = False) -> str:
    """`sedd sample`'s line of network calls: a text's calls (a drafter's included), its tokens and, where a prompt
    or a template gave some, how many of them the model wrote; tokens written a call (over all the texts).

    The tokens are the texts' as printed (with stop, each up to its first end-of-text token), the calls those
    each text needed (``Run.generate``'s stats): a prompt's tokens are not counted as written, nor a template's
    given characters. Without a prompt and a stop: "network calls: 32.0 a text of 32 tokens, 1.00 tokens a call".
    """

    def mean(a) -> str:  # a count the texts share as it is, else its mean
        a = np.asarray(a)
        return f"{int(a[0])}" if (a == a[0]).all() else f"{a.mean():.1f}"

    tokens, written = np.asarray(stats["tokens_per_sample"]), np.asarray(stats["written_per_sample"])
    line = f"network calls: {calls.mean():.1f} a text of {mean(tokens)} tokens"
    if stop:
        line += f" (up to its first {EOS_TEXT})"
    if (written == tokens).all():
        line += f", {written.sum() / max(calls.sum(), 1):.2f} tokens a call"
    else:
        line += (
            f", {mean(written)} of them written ({mean(tokens - written)} given by the "
            f"{'template' if infill else 'prompt'}): {written.sum() / max(calls.sum(), 1):.2f} tokens written a call"
        )
    if calls.min() != calls.max():
        line += f" ({calls.min()}-{calls.max()} calls)"
    drafter = np.broadcast_to(np.asarray(stats.get("draft_calls", 0)), calls.shape)  # a small drafter's cost less
    if drafter.any():
        target = calls - drafter
        line += (
            f"; the target's {target.mean():.1f} ({written.sum() / max(target.sum(), 1):.2f} tokens a call), "
            f"the drafter's {drafter.mean():.1f}"
        )
    return line


KEEPS_FREED_MEMORY = ("train", "distill", "eval")
"""The commands that keep freed memory (``kernels.keep_freed_memory``): their steps fault large buffers in. Not
sample and serve: one malloc arena makes a decoding loop's threads wait on each other (docs/studies/speculative.md
measures it), and their buffers are small."""


ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def escape(text: str) -> str:
    """The inverse of `unescape`: a prompt as one shell line (newlines, tabs and backslashes written out)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


def unescape(text: str) -> str:
    r"""A prompt as typed in a shell: \n, \t and \\ read as a newline, a tab and a backslash (as printf
    does); any other backslash is kept. So `--prefix 'def f(x):\n    '` starts a function body."""
    return re.sub(r"\\([nt\\])", lambda m: ESCAPES[m.group(1)], text)


def _explain_separator(texts: list[str]) -> None:
    if any(EOS_TEXT in t for t in texts):
        print(f"({EOS_TEXT} is the separator between training documents: the model ended one and began another)")


def run_conditioning(run: runs.Run, args):
    """fixed_mask / fixed_tokens of the CLI's --prefix / --suffix / --infill."""
    return text_conditioning(
        run.tokenizer,
        args.max_length or run.seq_len,
        args.num_samples,
        args.prefix,
        args.suffix,
        args.infill,
        args.blank,
    )


def _eval(args, overrides: list[str]) -> int:
    data = figures.eval_data(args.workdir, overrides)
    if n := figures.split_cpu_for_eval(args.workdir, args.batch_size):  # stderr: stdout is the table of figures
        print(
            f"this CPU as {n} devices, each batch split over them as in sedd train (mesh.cpu_devices)", file=sys.stderr
        )
    result = figures.evaluate_run(
        args.workdir,
        split=args.split,
        num_t=args.num_t,
        batch_size=args.batch_size,
        max_batches=args.max_batches or None,
        seed=args.seed,
        data=data,
    )
    if args.code_samples:  # completions of held-out code: do they parse, how much is copied
        run = runs.load(args.workdir)
        judge = figures.load_judge(args.judge, run.tokenizer) if args.judge else None
        code, _ = figures.code_figures(
            run, figures.run_data(run, data), args.code_samples, args.prompt_chars, args.seed, judge
        )
        result.update(code)
    for k, v in result.items():
        print(f"{k:>24}: {v:.4f}" if isinstance(v, float) else f"{k:>24}: {v}")
    return 0


def _add_eval(sub) -> None:
    """`sedd eval`'s options."""
    p = sub.add_parser(
        "eval",
        help="likelihood bound of a trained run",
        description="The likelihood bound of a trained run on a split of its data, or on other "
        "data with --config.data.name=... --config.data.path=... (zero-shot). A run's own data.path "
        "and data_dir are followed only where this user prepared that data (docs/reliability.md).",
    )
    p.add_argument("--workdir", required=True, help="run directory of a trained model")
    p.add_argument("--split", default=None, help="validation (default where the data has it), test or train")
    p.add_argument("--num_t", type=int, default=64, help="points of the t grid of the bound")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--max_batches", type=int, default=8, help="0 = the whole split")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--code_samples",
        type=int,
        default=0,
        help="also complete this many windows of held-out code "
        "from their first --prompt_chars characters: the share that parses, of lines that tokenise, of "
        "characters copied from training (docs/code.md)",
    )
    p.add_argument("--prompt_chars", type=int, default=48, help="characters of each code prompt")
    p.add_argument(
        "--judge",
        default="",
        help="with --code_samples: an AR run of the same data that scores the completions (nats/char)",
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `sedd` console script: parse argv, run the command, return the exit code.

    Called as the command (argv None), a refusal ends the process at once once its line is written: a
    checkpoint that failed to restore leaves orbax's and TensorStore's reads pending, and Python's exit
    then printed a traceback of each ("Event loop is closed", 1,600 lines under a memory cap, issue 63).
    A failed command has nothing left to save (saves are synchronous; metrics.jsonl is flushed a line).
    """
    code = _command(argv)
    if argv is None and code == 2:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _add_train(sub) -> None:
    """`sedd train`'s options."""
    p = sub.add_parser(
        "train",
        help="train (or resume) a model",
        description="Train or resume. Override any config field with --config.section.key=value.",
    )
    p.add_argument(
        "--config",
        default=config_lib.DEFAULT_CONFIG,
        help=f"a config file, or a shipped config's name ({', '.join(config_lib.shipped_configs())})",
    )
    p.add_argument("--workdir", default=None, help="run directory (default: checkpoints/<config name>)")


def _add_distill(sub) -> None:
    """`sedd distill`'s options."""
    p = sub.add_parser(
        "distill",
        help="a student that samples in fewer steps (distillation through time)",
        description="Self-distillation through time (SDTT): each round a student whose one step "
        "matches two of its teacher's, halving the sampling steps; a run directory like any other "
        "(docs/distillation.md). Override any config field with --config.section.key=value "
        "(distill.round_steps, distill.divergence, optim.lr, ...).",
    )
    p.add_argument("--teacher", required=True, help="run directory of the trained teacher (absorbing graph)")
    p.add_argument("--workdir", required=True, help="run directory of the distillation (resumed if it exists)")
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"halvings of the teacher's sampling steps (default {distill.DEFAULT_ROUNDS}: 8x fewer)",
    )


def _add_sample(sub) -> None:
    """`sedd sample`'s options."""
    p = sub.add_parser("sample", help="write text with a trained model")
    p.add_argument("--workdir", required=True, help="run directory of a trained model")
    p.add_argument("--steps", type=int, default=None, help="reverse steps (default: the config's)")
    p.add_argument(
        "--sampler",
        default=None,
        help="a sampler of sedd.sampling.SAMPLERS: "
        + ", ".join(sampling.SAMPLERS)
        + " (default: the config's); on the absorbing graph "
        "with log-linear noise analytic and euler are one kernel and draw the same text",
    )
    p.add_argument("--num_samples", type=int, default=4)
    p.add_argument("--seed", type=int, default=0, help="the same seed gives the same samples")
    escapes = r" (\n, \t and \\ are a newline, a tab and a backslash)"
    p.add_argument("--prefix", default="", type=unescape, help="text the samples start with" + escapes)
    p.add_argument("--suffix", default="", type=unescape, help="text the samples end with" + escapes)
    p.add_argument(
        "--infill", default="", type=unescape, help="a template whose --blank characters are filled in" + escapes
    )
    p.add_argument("--blank", default="_", help="the character of an infill template to fill in (default: _)")
    p.add_argument("--temperature", type=float, default=1.0, help="on the denoiser's p(x0); 0 = argmax (default 1)")
    p.add_argument("--top_p", type=float, default=1.0, help="nucleus of the denoiser's p(x0) (default 1: off)")
    p.add_argument(
        "--output",
        default="",
        help="write the samples to this file: FILE.jsonl one JSON object per "
        'line ({"sample": i, "text": ...}); any other name, text with a \'--- sample i\' line before each',
    )
    p.add_argument(
        "--max_length",
        type=int,
        default=None,
        help="tokens of text (default: the model's length); past it a SEDD run draws overlapping "
        "windows, a block run more blocks",
    )
    p.add_argument(
        "--stop",
        action="store_true",
        help="end each text at its first <|endoftext|> (a block run stops drawing once every text has one)",
    )
    p.add_argument(
        "--animate",
        action="store_true",
        help="show the denoising of the first sample, redrawn "
        "in place on a terminal; into a file or pipe, its frames one after another",
    )
    p.add_argument(
        "--draft",
        default="",
        help="an AR run only: speculative sampling, the run's own law in fewer "
        "calls, with drafts from 'ngram' (prompt lookup), a smaller AR run's or a block-diffusion run's "
        "directory (one block of --draft_k <= its block size a call)",
    )
    p.add_argument(
        "--draft_k",
        type=int,
        default=None,
        help="drafts a round with --draft (default 4), or of a run's own drafts (at most its model.draft_k)",
    )
    p.add_argument(
        "--layout",
        default=None,
        help="a spec run's round, 'K,GROUPS' (K drafts a round, draft groups for the outcomes 0 .. GROUPS - 1), "
        "or an AR run's with a draft head, 'K' (K head drafts); '0': no drafts, the causal LM alone "
        "(docs/speculative.md); or 'auto' (the default: the fastest on this device, timed once and kept "
        "in the run's layouts.json)",
    )


def _command(argv: list[str] | None) -> int:
    """`main` without the exit: the command's exit code."""
    parser = validate.OneLineParser(prog="sedd", description="Score Entropy Discrete Diffusion in JAX")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train(sub)
    _add_distill(sub)
    _add_sample(sub)
    _add_eval(sub)
    sub.add_parser(
        "convert", add_help=False, help="the original PyTorch SEDD weights -> a run directory (`sedd convert --help`)"
    )
    sub.add_parser(
        "serve",
        add_help=False,
        help="an OpenAI-style completions server with a playground page (`sedd serve --help`; needs sedd-jax[serve])",
    )

    args, rest = parser.parse_known_args(argv)
    try:  # every number and path, before any work (sedd serve and sedd convert check their own)
        validate.check_args(args.command, args)
    except ValueError as e:
        print(f"sedd {args.command}: error: {validate.clipped(str(e))}", file=sys.stderr)
        return 2
    warnings.showwarning = _show_warning
    if args.command == "convert":
        return convert.main(rest)
    if args.command in KEEPS_FREED_MEMORY:  # before JAX's CPU backend starts its threads
        kernels.keep_freed_memory()
    if args.command == "serve":
        try:
            from sedd import serve  # optional dependency: Starlette and uvicorn come with sedd-jax[serve]
        except ImportError as e:  # the distribution is sedd-jax: PyPI's `sedd` is an unrelated package
            print(
                f"sedd serve: error: it needs the serve extra: pip install 'sedd-jax[serve]' "
                f"(pip install -e '.[serve]' in a clone) ({e})",
                file=sys.stderr,
            )
            return 2
        return serve.main(rest)
    try:
        if args.command == "train":
            return _train(args, rest)
        if args.command == "distill":
            return _distill(args, rest)
        if args.command == "eval":
            return _eval(args, rest)
        if rest:
            parser.error(f"unrecognised arguments: {' '.join(rest)}")
        return _sample(args)
    except (ValueError, KeyError, FileNotFoundError, RuntimeError, FloatingPointError, files.DiskError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"sedd {args.command}: error: {validate.clipped(str(msg))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # outside a training loop (which saves and stops instead): nothing to save
        print(f"\nsedd {args.command}: interrupted", file=sys.stderr)
        return 130


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """Our own warnings as one line, `sedd: warning: ...`; others as Python shows them."""
    if Path(filename).resolve().is_relative_to(Path(__file__).resolve().parent):
        print(f"sedd: warning: {validate.clipped(str(message))}", file=file or sys.stderr)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


if __name__ == "__main__":
    sys.exit(main())
