"""One validation layer for the numbers and paths `sedd` is given: on the command line, in a run's files.

Every number an option of `sedd sample`, `sedd eval`, `sedd distill` or `sedd serve` takes has
a ``Bound`` here (its type, finite, its range and why), every path an option
names a kind (a run directory to read, one to write, an output file), and
``check_args`` checks them all before any work: a value out of bounds is one
line and exit code 2 (``OneLineParser`` makes argparse's own refusals, such as
`--steps nan`, one line too). ``tests/test_hostile_options_and_streams.py`` walks every
option of every subcommand's parser, so an option added without a bound fails
there.

``memory_estimate`` is what sampling a run's config takes; ``check_memory``
refuses a received run (its ``data.seq_len``) or a ``--num_samples`` whose
estimate is over this machine's memory, before anything is built.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import re
import stat
import sys
from pathlib import Path

import jax

from sedd import config as config_lib
from sedd import files

MAX_SEED = 2**63  # jax.random.key takes a C long: 2**63 and above overflow
MAX_STEPS = 1 << 16  # a run's sampling.steps (sedd.runs.SIZE_BOUNDS) and serve's --max_steps
MAX_ROWS = 1 << 16  # samples drawn at once, before the memory estimate of the run's own sizes
MAX_LENGTH = 1 << 20  # --max_length, in tokens: 8 times the longest run length (131,072)
MAX_SECONDS = 86_400.0  # any timeout: a day
MAX_TEXT = 1 << 20  # characters of a --prefix, --suffix or --infill (a model's length is at most 131,072 tokens)
MAX_CONFIG_SEED = 2**32 - 1  # a config's seeds: numpy's and jax's generators take a uint32 whole
MAX_CPU_DEVICES = 1 << 12  # mesh.cpu_devices: jax's own limit is far past any CPU (10**30 printed its signature)
MAX_DRAFTS = 64  # drafts a round (sedd.speculative.MAX_DRAFTS): a target's cache keeps room for k + 1 past the text
MAX_DRAFT_HEAD = 1 << 12  # model.draft_head, a draft head's width N: 6 N^2 + 2 N V weights, a fraction of a call


def shown(value) -> str:
    """A value as a message quotes it: repr, but an integer of more than 24 digits by its size (`a 400-digit
    number`), and any repr cut at 80 characters: a refusal is one short line whatever it was given."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**24:
        digits = len(str(abs(value))) if abs(value) < 10**4000 else int(abs(value).bit_length() * 0.30103) + 1
        return f"{'a negative ' if value < 0 else 'a '}{digits}-digit number"
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def short_numbers(text: str) -> str:
    """text with each run of more than 24 digits named by its size (`<a 400-digit number>`), for one-line errors."""
    return re.sub(r"\d{25,}", lambda m: f"<a {len(m.group())}-digit number>", text)


def one_line(e: BaseException, limit: int = 300) -> str:
    """An exception as one line of at most about `limit` characters: its type and message, the message's
    whitespace collapsed; TensorStore's dump of its spec (a bound method's repr over many lines) cut off, the
    array it names kept ("Encountered error while reading array index: ... (the array ema.layers.0...)")."""
    text, _, spec = " ".join(str(e)[:20_000].split()).partition(" See full TensorStore details")
    arrays = re.findall(r"'path': '([^'/][^']*)'", spec)
    return f"{type(e).__name__}: {text[:limit]}" + (f" (the array {arrays[-1].rstrip('/')})" if arrays else "")


MAX_LINE = 1000  # characters of a line of a message shown to the user


def clipped(message: str) -> str:
    """A message as it is shown (an error line, a warning, an HTTP error): ``short_numbers``, and each line of it
    over ``MAX_LINE`` characters cut in the middle, its length named: its start (what is wrong) and end (what
    was expected) kept. A value a message echoes (a 5,000-character SEDD_COMPUTE_DTYPE, a list of 18 kB of
    characters a run cannot write) is then never shown whole."""
    keep = MAX_LINE // 2 - 40
    return "\n".join(
        line if len(line) <= MAX_LINE else f"{line[:keep]} ... ({len(line):,} characters) ... {line[-keep:]}"
        for line in short_numbers(message).split("\n")
    )


@dataclasses.dataclass(frozen=True)
class Bound:
    """A number's type and range: an integer (or a finite float) in [low, high] (low excluded when `open_low`,
    high when `open_high`); `label`, when given, is the name a refusal gives the value (else the option's)."""

    low: float
    high: float
    integer: bool = True
    open_low: bool = False
    why: str = ""
    label: str = ""
    open_high: bool = False

    def check(self, name: str, value) -> None:
        """Raise ValueError (one line naming `name`) unless value is a number of this bound."""
        number = isinstance(value, (int,) if self.integer else (int, float)) and not isinstance(value, bool)
        if number and (isinstance(value, int) or math.isfinite(value)):  # isfinite(10**400) is an OverflowError
            above = self.low < value if self.open_low else self.low <= value
            if above and (value < self.high if self.open_high else value <= self.high):
                return
        what = "an integer" if self.integer else "a finite number"
        left, right = "(" if self.open_low else "[", ")" if self.open_high else "]"
        why = f" ({self.why})" if self.why else ""
        low, high = (f"{int(x)}" if self.integer else f"{x:g}" for x in (self.low, self.high))
        raise ValueError(f"{self.label or name} must be {what} in {left}{low}, {high}{right}{why}, got {shown(value)}")


def draft_k_bound(most: int = MAX_DRAFTS, why: str = "sedd.speculative.MAX_DRAFTS") -> Bound:
    """The bound of draft_k, at most `most` (`why` names what sets it): the command line's and
    ``sedd.drafts.check_k``'s, one message."""
    return Bound(1, most, why=f"drafts a round, at most {why}", label="draft_k")


SEED = Bound(0, MAX_SEED - 1, why="jax.random.key takes [0, 2**63)")
CLI_BOUNDS: dict[str, dict[str, Bound]] = {
    "sample": {
        "steps": Bound(1, MAX_STEPS, why="a run's sampling.steps is at most 65,536"),
        "num_samples": Bound(1, MAX_ROWS, why="then also the memory estimate of the run's sizes"),
        "seed": SEED,
        "temperature": Bound(0, 2, integer=False, why="0 = argmax; as sedd serve's temperature"),
        "top_p": Bound(0, 1, integer=False, open_low=True),
        "max_length": Bound(1, MAX_LENGTH, why="tokens of text; omit it for the model's length"),
        "draft_k": draft_k_bound(),
    },
    "eval": {
        "num_t": Bound(1, 1 << 16),
        "batch_size": Bound(1, MAX_ROWS),
        "max_batches": Bound(0, 2**31 - 1, why="0 = the whole split"),
        "seed": SEED,
        "code_samples": Bound(0, MAX_ROWS, why="0 = none: completions of held-out code"),
        "prompt_chars": Bound(1, MAX_LENGTH, why="characters of a code prompt, fewer than the run's length"),
    },
    "serve": {
        "port": Bound(1, 65535, why="a TCP port"),
        "step": Bound(0, 2**31 - 1, why="a training step"),
        "max_steps": Bound(1, MAX_STEPS, why="a run's sampling.steps is at most 65,536"),
        "max_n": Bound(1, 4096),
        "max_batch": Bound(1, 4096),
        "max_queue": Bound(1, 1 << 20),
        "max_programs": Bound(1, 4096),
        "timeout": Bound(0, MAX_SECONDS, integer=False, open_low=True),
        "header_timeout": Bound(0, MAX_SECONDS, integer=False, open_low=True),
        "body_timeout": Bound(0, MAX_SECONDS, integer=False, open_low=True),
        "send_timeout": Bound(0, MAX_SECONDS, integer=False, open_low=True),
        "window_ms": Bound(0, 60_000, integer=False, why="milliseconds a batch waits for more requests"),
        "max_body": Bound(1, 1 << 30, why="bytes"),
        "warmup_steps": Bound(1, MAX_STEPS),
        "draft_k": draft_k_bound(),
    },
    "train": {},
    "distill": {"rounds": Bound(1, 16, why="halvings of the teacher's sampling steps")},
}
"""The bound of every numeric option of each subcommand, by its argparse dest (None = the default, always allowed)."""

PATHS: dict[str, dict[str, str]] = {
    "sample": {"workdir": "run", "output": "output", "draft": "draft"},
    "eval": {"workdir": "run", "judge": "run"},
    "serve": {"workdir": "run", "draft": "draft"},
    "train": {"workdir": "new_run", "config": "config"},
    "convert": {"src": "source", "dst": "new_run", "tokenizer_path": "source"},
    "distill": {"teacher": "run", "workdir": "new_run"},
}
"""The kind of each path option: a run directory to read, one that training creates or resumes, an output
file, a config file (or a shipped config's name), a source to read (a regular file or a folder)."""

POSITIONAL = {"convert": ("src", "dst")}
"""The path arguments given by position, named in capitals (SRC) rather than as an option (--src)."""

TEXTS = {"sample": ("prefix", "suffix", "infill")}


def check_args(command: str, args: argparse.Namespace) -> None:
    """Check every number and path of a parsed command line before any work.

    Raises:
      ValueError: one line naming the option, its bounds and the value.
      LookupError: an option of a numeric type with no bound here (a bug: every option has one).
    """
    bounds, paths = CLI_BOUNDS.get(command, {}), PATHS.get(command, {})
    for dest, value in vars(args).items():
        flag = dest.upper() if dest in POSITIONAL.get(command, ()) else f"--{dest}"
        if dest in bounds:
            if value is not None:
                bounds[dest].check(flag, value)
        elif dest in paths:
            if value:
                check_path(flag, value, paths[dest])
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            raise LookupError(f"sedd {command} {flag} is a number without a bound in sedd.validate.CLI_BOUNDS")
    for dest in TEXTS.get(command, ()):
        text = getattr(args, dest, "") or ""
        if len(text) > MAX_TEXT:
            raise ValueError(f"--{dest} holds {len(text)} characters; at most {MAX_TEXT} are read")
    for run in (getattr(args, dest, "") for dest in ("workdir", "draft")) if getattr(args, "output", "") else ():
        if run and run != "ngram":
            check_output_outside("--output", args.output, run)


def check_output_outside(flag: str, path: str, run: str) -> None:
    """Raise ValueError when the output file `path` resolves (links followed) to a file sedd wrote in the run
    directory `run` (``sedd.files.RUN_NAMES``): `sedd sample --output RUN/config.json` overwrote the run's config."""
    out, home = Path(path).expanduser().resolve(), Path(run).expanduser().resolve()
    if home in out.parents and (name := out.relative_to(home).parts[0]) in files.RUN_NAMES:
        raise ValueError(
            f"{flag} {path} is {out}, inside the run's own {name}: the samples would overwrite what the "
            f"run {run} needs; write them elsewhere"
        )


FETCH = (
    "`huggingface-cli download louaaron/sedd-small --local-dir sedd-small` (the authors' weights) and "
    "`huggingface-cli download gpt2 vocab.json merges.txt --local-dir gpt2` (GPT-2's tokenizer)"
)
"""How `sedd convert`'s files are fetched (docs/pretrained.md, section 1): named where one is missing."""


def check_path(flag: str, path: str, kind: str) -> None:
    """Raise ValueError unless `path` can be what `kind` says, before any work (nothing is opened or made).

    run: an existing directory. new_run: a directory, or absent with a parent
    directory. output: a writable regular file, or absent in a writable
    directory (not a directory, a FIFO that would block, a device such as
    /dev/full). config: a regular file when it exists (else a shipped
    config's name, looked up later).
    draft: "ngram", or a run directory (a smaller AR run or a block run that drafts).
    source: an existing regular file or folder (not a FIFO that would block
    or a device such as /dev/full, which reads without end).
    """
    if kind == "draft":
        if path != "ngram":
            check_path(flag, path, "run")
        return
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise ValueError(f"{flag} {path}: {e.strerror or e}") from None
    if kind == "source":
        if st is None:  # `sedd convert sedd-small ...` as docs/pretrained.md writes it, before fetching the files
            raise ValueError(
                f"{flag} {path} does not exist. sedd downloads nothing: fetch the files first, as "
                f"docs/pretrained.md (section 1) says: {FETCH}"
            )
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            raise ValueError(f"{flag} {path} is neither a regular file nor a folder (a FIFO, a device, ...)")
        return
    if kind == "config":
        shipped = not p.suffix and path in config_lib.shipped_configs()  # a name config_path resolves first
        if st is not None and not stat.S_ISREG(st.st_mode) and not shipped:
            raise ValueError(f"{flag} {path} is not a regular file (a config file, or a shipped config's name)")
        return
    if kind in ("run", "new_run"):
        if st is not None and not stat.S_ISDIR(st.st_mode):
            raise ValueError(f"{flag} {path} is not a run directory (not a folder)")
        if st is None and kind == "run":
            raise ValueError(f"{flag} {path} is not a run directory (it does not exist); train one with `sedd train`")
        return
    if st is not None:  # output
        if not stat.S_ISREG(st.st_mode):
            what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, a device, ...)"
            raise ValueError(f"{flag} {path} is {what}; the samples are written to a regular file")
        if not os.access(p, os.W_OK):
            raise ValueError(f"{flag} {path} cannot be written (permission denied)")
        return
    parent = p.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {path}: its folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: its folder {parent} cannot be written")


class OneLineParser(argparse.ArgumentParser):
    """argparse's refusals (`--steps nan`: not an int) as one line, `prog: error: ...`, and exit code 2."""

    def error(self, message: str):
        print(f"{self.prog}: error: {clipped(message)} ({self.prog} --help shows the options)", file=sys.stderr)
        sys.exit(2)


# --------------------------------------------------------------------------- memory


def weight_count(config) -> int:
    """The network's weights from the config's sizes, about: the embedding and the output (the padded
    vocabulary), per layer attention (4 H^2), MLP (2 r H^2) and adaLN (6 C H), and a draft head's 6 N^2 + 2 N V +
    N H (``sedd.kinds.draft_head``)."""
    m = config.model
    vocab = -(-(config.vocab_size + 1) // m.vocab_multiple) * m.vocab_multiple  # model.padded, without the model
    n = m.draft_head
    head = 6 * n * n + 2 * n * config.vocab_size + n * m.hidden_size
    return (
        2 * vocab * m.hidden_size
        + m.n_layers * ((4 + 2 * m.mlp_ratio) * m.hidden_size**2 + 6 * m.cond_dim * m.hidden_size)
        + head
    )


def memory_estimate(config, rows: int = 1) -> int:
    """Bytes of memory drawing `rows` sequences of the config's length takes, about (float32).

    The weights (three copies while they are restored and placed; ``weight_count``) and per row
    one layer's attention scores and softmax (2 n_heads L^2: quadratic in the length), the
    scores of the output (3 x L x padded vocabulary, and a draft head's 2 k of them in training) and the
    activations (16 x L x hidden_size); checked against a measured peak in issue 53
    (docs/reliability.md).
    """
    m, L = config.model, config.data.seq_len
    vocab = -(-(config.vocab_size + 1) // m.vocab_multiple) * m.vocab_multiple
    outputs = 3 + (2 * m.draft_k if m.draft_head else 0)
    per_row = 2 * m.n_heads * L * L + outputs * L * vocab + 16 * L * m.hidden_size  # scores and their softmax
    return 4 * (3 * weight_count(config) + rows * per_row)


def available_memory(devices: bool = True) -> int:
    """Bytes this machine can give a computation: the default device's limit, else (or with devices=False, which
    starts no backend) the physical memory."""
    return (device_limit() if devices else None) or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def device_limit() -> int | None:
    """The default device's own memory in bytes (an accelerator's), None where it has none of its own (a CPU)."""
    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # noqa: BLE001  no device statistics on this backend: the host's memory
        stats = {}
    return int(stats["bytes_limit"]) if stats.get("bytes_limit") else None


def check_memory(config, rows: int = 1, what: str = "") -> None:
    """Raise ValueError when drawing `rows` sequences of the config would need more than this machine has.

    The message gives the estimate (``memory_estimate``) and the memory found.
    """
    need, have = memory_estimate(config, rows), available_memory()
    if need > have:
        m = config.model
        raise ValueError(
            f"{what}data.seq_len = {config.data.seq_len} with model.n_heads = {m.n_heads}, "
            f"hidden_size = {m.hidden_size} and vocab_size = {config.vocab_size}, {rows} sequence(s) "
            f"at once, needs about {need / 2**30:.1f} GiB (attention is quadratic in the length); "
            f"this machine has {have / 2**30:.1f} GiB"
        )


# --------------------------------------------------------------------------- a config about to be trained


TRAINING_BOUNDS = {
    "training.n_iters": Bound(1, 2**31 - 1, why="batches to train on"),
    "training.batch_size": Bound(1, 2**31 - 1, why="sequences a step, then this machine's memory"),
    "training.accum_steps": Bound(1, 2**31 - 1, why="batches an update, at most training.n_iters"),
    "training.max_to_keep": Bound(1, 2**31 - 1, why="the newest checkpoints kept; 0 would delete every one"),
    "training.keep_period": Bound(0, 2**31 - 1, why="0 = none"),
    "training.eval_batches": Bound(1, 2**31 - 1),
    "training.eval_samples": Bound(0, MAX_ROWS, why="0 = none, then this machine's memory"),
    "optim.warmup": Bound(0, 2**31 - 1, why="optimizer updates; 0 = none"),
    "optim.grad_clip": Bound(0, math.inf, integer=False, why="a global norm; 0 = off"),
    "data.markov.num_tokens": Bound(1, 2**40, why="tokens drawn, then this machine's memory"),
    "seed": Bound(0, MAX_CONFIG_SEED, why="a uint32: it seeds the network, the data order and the keys"),
    "optim.lr": Bound(0, math.inf, integer=False, open_low=True, why="the peak learning rate"),
    "optim.beta1": Bound(0, 1, integer=False, open_high=True, why="Adam's first-moment decay"),
    "optim.beta2": Bound(0, 1, integer=False, open_high=True, why="Adam's second-moment decay"),
    "optim.eps": Bound(0, math.inf, integer=False, open_low=True),
    "optim.weight_decay": Bound(0, math.inf, integer=False),
    "optim.muon_lr_scale": Bound(0, math.inf, integer=False, open_low=True),
    "optim.adaln_lr_scale": Bound(0, math.inf, integer=False, open_low=True),
    "training.ema": Bound(0, 1, integer=False, open_high=True, why="the EMA's decay cap; 0 = the weights"),
    "training.loss_chunk": Bound(0, 2**31 - 1, why="positions a chunk of the output layer; 0 = all at once"),
    "training.sampling_eps": Bound(0, 1, integer=False, open_high=True, why="t ~ U[sampling_eps, 1]"),
    "training.t_power": Bound(0, 1, integer=False, open_high=True, why="0 = uniform t, as SEDD"),
    "training.draft_weight": Bound(0, math.inf, integer=False, why="the drafts' share of a spec run's loss"),
    "data.markov.vocab_size": Bound(2, 1 << 20),
    "data.markov.order": Bound(0, 64, why="tokens of context; V^order contexts at most 2^20"),
    "data.markov.alpha": Bound(0, math.inf, integer=False, open_low=True, why="a Dirichlet concentration"),
    "mesh.cpu_devices": Bound(0, MAX_CPU_DEVICES, why="devices this CPU is split into; 0 = auto"),
    "mesh.num_processes": Bound(0, 1 << 20, why="0 = detected by jax"),
    "mesh.process_id": Bound(-1, 1 << 20, why="-1 = detected by jax"),
}
"""What a config about to be trained must hold beside the sizes of a run's config (``sedd.runs.check_config``):
each value that sizes an allocation or that a step reads, so that none fails after compiling or training."""
MARKOV_BYTES_PER_TOKEN = 32  # the stream's uniforms (8), its tokens (4, twice), the packed rows; at least


def check_training(config) -> None:
    """Check the keys of ``TRAINING_BOUNDS`` before anything is read, built or compiled (no device is touched:
    `sedd train` splits its CPU after this), and a Markov corpus's tokens against the host's memory.

    Raises:
      ValueError: one line naming the key, its bound and the value.
    """
    t = config.training
    for key, bound in TRAINING_BOUNDS.items():
        bound.check(key, functools.reduce(getattr, key.split("."), config))
    if t.accum_steps > t.n_iters:
        raise ValueError(
            f"training.accum_steps = {shown(t.accum_steps)} is more than training.n_iters = "
            f"{shown(t.n_iters)}: no update would ever be applied"
        )
    tokens, have = config.data.markov.num_tokens, available_memory(devices=False)
    if config.data.name == "markov" and (need := tokens * MARKOV_BYTES_PER_TOKEN) > have:
        raise ValueError(
            f"data.markov.num_tokens = {shown(tokens)} needs about {need / 2**30:,.1f} GiB; this machine "
            f"has {have / 2**30:,.1f} GiB"
        )


def check_training_memory(config) -> None:
    """A step's rows and an evaluation's samples against this process's memory, before anything is built or
    compiled (after the processes have connected and the data is read: config.vocab_size is known).

    Each process takes training.batch_size / processes rows of a step; its need is at least ``memory_estimate``
    of them plus four more copies of the weights (gradient, EMA, two moments), and an evaluation's
    ``memory_estimate`` of training.eval_samples rows. An accelerator brings its own memory (its limit times this
    process's devices), CPU devices share the host's. A lower bound: what it refuses cannot run here.

    Raises:
      ValueError: one line naming the key, the sizes and the memory.
    """
    t, limit = config.training, device_limit()
    have = limit * jax.local_device_count() if limit else available_memory(devices=False)
    weights = memory_estimate(config, 0) // 3
    for key, value, rows, extra in (
        ("training.batch_size", t.batch_size, -(-t.batch_size // jax.process_count()), 4 * weights),
        ("training.eval_samples", t.eval_samples, t.eval_samples, 0),
    ):
        need = memory_estimate(config, rows) + extra
        if need > have:
            m = config.model
            raise ValueError(
                f"{key} = {shown(value)}: {rows:,} sequences of data.seq_len = {config.data.seq_len} "
                f"tokens (model.n_heads = {m.n_heads}, hidden_size = {m.hidden_size}) need at least "
                f"{need / 2**30:,.1f} GiB (attention is quadratic in the length); this process has "
                f"{have / 2**30:,.1f} GiB"
            )
