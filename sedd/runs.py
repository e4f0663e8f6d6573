"""A run directory, and a trained model loaded from it for inference.

A run directory holds everything needed to resume training or to use the model:

  config.json      the resolved config (with config.vocab_size filled in)
  tokenizer.json   the tokenizer (a character vocabulary is built from the data)
  metrics.jsonl    one JSON object per logged step (units in the key names)
  checkpoints/     orbax checkpoints of the train state (``sedd.checkpoints``), each a dict: step, params,
                   opt_state, ema, key, bad_step; and a SHA-256 of each array (``sedd.files.CHECKSUMS``)
  checkpoints_unreadable/  checkpoints a resumed run could not read, set aside (never deleted)
  layouts.json     the round layout a run that tunes chose by device (``sedd.kinds.layouts``)

A distillation (``sedd.distill``) is such a directory too; ``lineage`` says which
round a checkpoint is, and loaded, it samples with that round's steps.

``load(workdir)`` restores the parameters alone (the EMA by default) from an
abstract target: it never builds an optimizer or a train state. A run's
config.json is migrated to today's keys once, where it is read.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from sedd import config as config_lib
from sedd import checkpoints, files, kinds, lock, sampling, validate
from sedd import sharding as sharding_lib
from sedd.data import tokenizer_from_dict
from sedd.model import DDiT

CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
METRICS = "metrics.jsonl"
CHECKPOINTS = checkpoints.FOLDER


# --------------------------------------------------------------------------- the directory


class RunError(ValueError):
    """A run directory that cannot be used as it is (a received one may be tampered with): answered in one line;
    a bug in sedd raises anything else."""


MAX_CONFIG_BYTES = 256 << 10  # config.json (a trained run's is ~2 kB)
MAX_TOKENIZER_BYTES = 64 << 20  # tokenizer.json, and each GPT-2 file it names (GPT-2's tokenizer.json is 1.4 MB)
SIZE_BOUNDS = {
    "model.hidden_size": (1, 1 << 14),
    "model.cond_dim": (1, 1 << 14),
    "model.n_layers": (1, 256),
    "model.n_heads": (1, 256),
    "model.mlp_ratio": (1, 64),
    "data.seq_len": (1, 1 << 17),
    "vocab_size": (2, 1 << 20),
    "sampling.steps": (1, 1 << 16),
    "model.vocab_multiple": (1, 1 << 12),
    "distill.rounds": (0, 16),
    "distill.round_steps": (1, 1 << 30),
    "distill.teacher_steps": (0, 1 << 16),
    "model.draft_head": (0, validate.MAX_DRAFT_HEAD),
}
"""[low, high] of each size a run's config gives, checked before anything is built from it (the
bounds of ``sedd.convert`` for the same sizes; sedd-medium has hidden_size 1024, 24 blocks, 16 heads,
length 1024, GPT-2's 50,257 tokens)."""
VALUE_BOUNDS = {
    "noise.sigma_min": validate.Bound(0, 1e4, integer=False, open_low=True),
    "noise.sigma_max": validate.Bound(0, 1e4, integer=False, open_low=True, why="SEDD's configs take 20"),
    "noise.eps": validate.Bound(0, 1, integer=False, open_low=True),
    "sampling.eps": validate.Bound(0, 1, integer=False, open_low=True),
    "model.dropout": validate.Bound(0, 1, integer=False),
    "data.markov.seed": validate.Bound(0, validate.MAX_CONFIG_SEED, why="a uint32: it seeds the chain's table"),
}
"""Bounds of the floats of a run's config that the sampler computes with (any other float must be finite)."""
MAX_PARAMETERS = 1 << 33  # the network's weights, estimated from the sizes above (GPT-2 XL has 1.6e9)


def read_config(workdir: str | Path) -> ml_collections.ConfigDict:
    """The config.json of a run directory, migrated to today's keys (``sedd.config.migrate``) and checked.

    Every value must have the type of the shipped config's value of its key (an integer for a float),
    and every size of ``SIZE_BOUNDS`` lie in its bounds, before anything is built from it; else a
    RunError naming the key (FileNotFoundError: not a run directory).
    """
    path = Path(workdir) / CONFIG
    if not path.exists():
        raise FileNotFoundError(f"{workdir} is not a run directory (no {CONFIG}); train one with `sedd train`")
    try:
        saved = json.loads(_read_bounded(path, MAX_CONFIG_BYTES))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise RunError(f"{path}: not a readable config: {type(e).__name__}: {str(e)[:200]}") from None
    if not isinstance(saved, dict):
        raise RunError(f"{path}: a config is a JSON object of sections, not a {type(saved).__name__}")
    config = config_lib.migrate(saved)
    _check_config(config, path)
    return config


def _read_bounded(path: Path, limit: int) -> str:
    """``sedd.files.read_text`` of a file of its run directory, at most `limit` bytes; RunError for what it refuses
    (a link out of the run, a FIFO, a device, a folder, a larger file)."""
    try:
        return files.read_text(path, limit, root=path.parent)
    except files.UnsafeFile as e:
        raise RunError(str(e)) from None


def check_config(config: ml_collections.ConfigDict, where: str) -> None:
    """The checks of ``read_config`` on a config about to be trained (vocab_size, not known yet, taken as 2),
    then ``sedd.validate.check_training``'s and ``sedd.kinds.check_config``'s; RunError prefixed by `where`."""
    config = ml_collections.ConfigDict({"vocab_size": 2, **config.to_dict()})  # a known vocab_size wins
    _check_config(config, where)
    try:
        validate.check_training(config)
        kinds.check_config(config)
    except ValueError as e:
        raise RunError(f"{where}: {e}") from None


def _check_config(config: ml_collections.ConfigDict, path: Path | str) -> None:
    """Raise RunError naming the first key whose value has the wrong type or lies outside its bounds."""
    default = config_lib.flat(config_lib.load_config(config_lib.DEFAULT_CONFIG).to_dict())
    values = config_lib.flat(config.to_dict())
    for key, value in values.items():
        want = type(default.get(key, 0 if key == "vocab_size" else value))
        ok = isinstance(value, want) and (want is bool or not isinstance(value, bool))
        if want is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif want in (list, tuple):  # JSON has lists where a ConfigDict has tuples
            ok = isinstance(value, (list, tuple))
        if not ok:
            raise RunError(
                f"{path}: {key} = {value!r} is a {type(value).__name__}; a run's config holds a {want.__name__} there"
            )
        if isinstance(value, float) and not math.isfinite(value):  # JSON's NaN and Infinity parse
            raise RunError(f"{path}: {key} = {value!r} is not a finite number")
    if "vocab_size" not in values:
        raise RunError(f"{path}: vocab_size is missing (a trained run's config holds it)")
    for key, (low, high) in SIZE_BOUNDS.items():
        if not low <= values[key] <= high:
            raise RunError(f"{path}: {key} = {values[key]} is outside [{low}, {high}]")
    for key, bound in VALUE_BOUNDS.items():
        try:
            if key in values:
                bound.check(key, values[key])
        except ValueError as e:
            raise RunError(f"{path}: {e}") from None
    rules = config.mesh.rules
    try:  # pairs [logical name, mesh axes]; a received [5] was a TypeError from deep inside the mesh code
        if not all(isinstance(r, (list, tuple)) and len(r) == 2 and isinstance(r[0], str) for r in rules):
            raise ValueError("each rule is a pair [logical name, mesh axes]")
        sharding_lib.make_rules(rules)
    except (TypeError, ValueError) as e:
        raise RunError(f"{path}: mesh.rules = {rules!r}: {e}") from None
    m, estimate = config.model, validate.weight_count(config)
    if estimate > MAX_PARAMETERS:
        raise RunError(
            f"{path}: model.n_layers = {m.n_layers}, hidden_size = {m.hidden_size}, mlp_ratio = "
            f"{m.mlp_ratio}, cond_dim = {m.cond_dim}, draft_head = {m.draft_head} and vocab_size = "
            f"{config.vocab_size} make about {estimate:.2e} weights; at most {MAX_PARAMETERS:.2e} are built"
        )


def read_tokenizer(workdir: str | Path, vocab_size: int):
    """The tokenizer.json of a run directory; RunError where it cannot be read or built, or its vocabulary is
    not the model's (config vocab_size). A GPT-2 tokenizer's files are bounded too (``MAX_TOKENIZER_BYTES``)."""
    path = Path(workdir) / TOKENIZER
    try:
        saved = json.loads(_read_bounded(path, MAX_TOKENIZER_BYTES))
        if not (isinstance(saved, dict) and isinstance(saved.get("name"), str)):
            raise RunError('a tokenizer is a JSON object with a "name"')
        tokenizer = tokenizer_from_dict(saved)
    except FileNotFoundError as e:
        raise RunError(f"{path}: {e}") from None
    except Exception as e:  # noqa: BLE001  the tokenizers package raises a bare Exception for a bad file
        message = (
            e.args[0]
            if isinstance(e, RunError) and e.args
            else f"{type(e).__name__}: {str(e)[: 600 if isinstance(e, ValueError) else 200]}"
        )  # ours are bounded
        raise RunError(f"{path}: not a tokenizer this package can read: {message}") from None
    if tokenizer.vocab_size != vocab_size:
        raise RunError(
            f"{path}: the tokenizer has {tokenizer.vocab_size} tokens and the model (config.json "
            f"vocab_size) {vocab_size}; ids would mean other strings"
        )
    return tokenizer


RUN_FOLDERS = (CHECKPOINTS, "checkpoints_unreadable", "tensorboard")
RUN_ENTRIES = (CONFIG, TOKENIZER, METRICS, *RUN_FOLDERS, lock.LOCK)
"""What a run directory holds that training writes, moves or deletes: no symbolic link, the folders folders."""


def check_run_links(workdir: str | Path) -> None:
    """Refuse (RunError naming the link) a run directory whose entries of ``RUN_ENTRIES``, or a checkpoint, are
    symbolic links: training writes, deletes and moves them, and through a link each would reach outside the
    run. The run directory itself may be a link: the command line names it."""
    workdir = Path(workdir)
    ckpts = workdir / CHECKPOINTS
    found = [workdir / n for n in RUN_ENTRIES]
    if ckpts.is_dir() and not ckpts.is_symlink():
        found += sorted(ckpts.iterdir())
    for path in found:
        if path.is_symlink():
            raise RunError(
                f"{path} is a symbolic link (to {os.readlink(path)}); a run directory's files and "
                "checkpoints are written, moved and deleted in place, so links out of it are refused. "
                "Replace the link by a folder (or move the run away) and run again; nothing was touched"
            )
        if path.name in (CONFIG, TOKENIZER, METRICS) and path.exists() and not path.is_file():  # a FIFO blocked
            raise RunError(
                f"{path} is not a regular file (a FIFO, a device or a folder); a run's files are read and "
                "written only as regular files; nothing was touched"
            )
        if path.name in RUN_FOLDERS:
            files.check_folder(path)


def check_compatible(workdir: str | Path, config) -> None:
    """A run directory that exists must be resumed with the config it was trained with, but for the keys of
    ``sedd.config.MAY_CHANGE_ON_RESUME``; a ValueError names every other key that differs."""
    if not (Path(workdir) / CONFIG).exists():
        return
    saved = json.loads(_read_bounded(Path(workdir) / CONFIG, MAX_CONFIG_BYTES))
    refused = [
        c
        for c in config_lib.config_changes(saved, config.to_dict())
        if not any(fnmatch.fnmatchcase(c[0], k) for k in config_lib.MAY_CHANGE_ON_RESUME)
    ]
    if refused:
        lines = "\n".join(f"  {k}: saved {a!r}, now {b!r}" for k, a, b in refused)
        raise ValueError(
            f"{workdir} holds a run trained with a different config; these keys cannot change on resume:\n"
            f"{lines}\nResume with the config and overrides the run was started with (only "
            f"{', '.join(config_lib.MAY_CHANGE_ON_RESUME)} may change), or use a new --workdir. "
            "The run directory was left as it is."
        )


def inference_mesh(config) -> jax.sharding.Mesh:
    """The run's mesh when these devices can form it, else all devices on the data axis."""
    try:
        return sharding_lib.make_mesh(config.mesh)
    except ValueError:
        return sharding_lib.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})


# --------------------------------------------------------------------------- a loaded run


@dataclasses.dataclass
class Run:
    """A trained model with everything needed to use it: its config, tokenizer and kind (``sedd.kinds``: network,
    figure and sampler); the network split by ``nnx.split(model, nnx.Param, ...)`` into graphdef, params and rest;
    the training step of the weights, and the mesh of devices the parameters live on."""

    config: ml_collections.ConfigDict
    tokenizer: Any
    kind: kinds.Kind
    graphdef: Any
    params: Any
    rest: Any
    step: int
    mesh: jax.sharding.Mesh

    @property
    def net(self) -> kinds.Net:
        """The network as (graphdef, params, rest)."""
        return kinds.Net(self.graphdef, self.params, self.rest)

    @property
    def model(self) -> DDiT:
        """The network with these parameters (dropout off)."""
        return nnx.merge(self.graphdef, self.params, self.rest)

    @property
    def graph(self):
        """The forward graph of a diffusion run (AttributeError for a kind without one)."""
        return self.kind.graph

    @property
    def noise(self):
        """The noise schedule of a diffusion run (AttributeError for a kind without one)."""
        return self.kind.noise

    @property
    def seq_len(self) -> int:
        """L, the length the model was trained on."""
        return self.config.data.seq_len

    def row_sharding(self, rows: int) -> jax.sharding.Sharding | None:
        """How B = rows sequences split over the mesh's batch axes; None when B does not divide."""
        return sharding_lib.rows_sharding(rows, self.mesh, sharding_lib.make_rules(self.config.mesh.rules))

    def place_rows(self, batch) -> jax.Array:
        """A [B, ...] batch on the mesh, its rows split over the batch axes where B divides."""
        return sharding_lib.place_global(batch, self.mesh, sharding_lib.make_rules(self.config.mesh.rules))

    def score_fn(self, x: jax.Array, sigma: jax.Array) -> jax.Array:
        """The log-score of the model: (x int32[B, L], sigma float[B]) -> float32[B, L, D]."""
        return kinds.params_score_fn(self.graphdef)((self.params, self.rest), x, sigma)

    def sample(
        self, key: jax.Array, num_samples: int, steps: int | None = None, sampler: str | None = None, **sampler_options
    ) -> sampling.Samples:
        """num_samples sequences drawn by the run's kind, as NumPy arrays in a ``sedd.sampling.Samples``.

        The options go to the kind's ``sample`` (docs/sampling.md, docs/speculative.md; a draft may be
        another ``Run``), the config's sampling section giving the defaults; stop=True ends the drawing
        once every text holds the tokenizer's end-of-text token. The rows are split over the mesh's data
        axis where num_samples divides. An option the kind cannot honour is a ValueError.
        """
        num_samples = _positive_int("num_samples", num_samples)
        if steps is not None:
            steps = _positive_int("steps", steps)
        if isinstance(sampler_options.get("draft"), Run):  # its kind's drafter, checked by this run's kind
            draft = sampler_options["draft"]
            sampler_options["draft"] = kinds.capabilities.drafter(draft.kind, draft.net)
        if sampler_options.pop("stop", False):  # end at the document separator
            if getattr(self.tokenizer, "eos_id", None) is None:
                raise ValueError(
                    f"stop=True ends a text at the tokenizer's end-of-text token, and the "
                    f"{self.tokenizer.name!r} tokenizer of this run has none"
                )
            sampler_options["stop_id"] = int(self.tokenizer.eos_id)
        net = self.net._replace(placement=self.row_sharding(num_samples))
        out = self.kind.sample(key, net, num_samples, steps, sampler, **sampler_options)
        return jax.tree.map(np.asarray, out)

    def generate(
        self,
        key: jax.Array,
        num_samples: int,
        steps: int | None = None,
        sampler: str | None = None,
        prefix: str | None = None,
        suffix: str | None = None,
        infill: str | None = None,
        blank: str = "_",
        **sampler_options,
    ) -> list[str]:
        """Texts written by the model, optionally around a prefix, a suffix or an infill template.

        Args:
          steps, sampler: as ``sample``'s (default: the config's).
          prefix, suffix: text the samples start / end with (the suffix ends
            the whole text, at max_length when that is given).
          infill: a template whose `blank` characters are generated
            (``sedd.sampling.text_conditioning``); the texts are cut to its length.
          sampler_options: more keyword options of ``sample``; with stop each
            text ends before its first end-of-text token.
        Returns:
          num_samples strings; with return_stats=True, (texts, stats): the sampler's stats ("nfe_per_sample": each
          row's calls), "tokens_per_sample" int[num_samples] (each text's tokens) and "written_per_sample" (those of
          them the model wrote: not the prompt's, the suffix's or the template's).
        """
        patterns = tuple(name for name, given in (("suffix", suffix), ("infill", infill)) if given)
        kinds.capabilities.check_given(self.kind, patterns=patterns)  # as sedd serve refuses them
        length = sampler_options.get("max_length") or self.seq_len
        prefix, suffix, infill = prefix or "", suffix or "", infill or ""
        mask, tokens = sampling.text_conditioning(self.tokenizer, length, num_samples, prefix, suffix, infill, blank)
        if mask is not None:
            sampler_options.update(fixed_mask=jnp.asarray(mask), fixed_tokens=jnp.asarray(tokens))
        stop = bool(sampler_options.get("stop"))
        ids = (out := self.sample(key, num_samples, steps, sampler, **sampler_options)).tokens
        ends = np.full(len(ids), len(infill) if infill else ids.shape[1])  # each text's tokens: [0, end)
        if stop:  # each text up to its first end-of-text token
            eos = ids == int(self.tokenizer.eos_id)
            ends = np.where(eos.any(1), np.minimum(eos.argmax(1), ends), ends)
        texts = [self.decode(row[:end]) for row, end in zip(ids, ends)]
        if not sampler_options.get("return_stats") or out.stats is None:  # (a kind may count no calls)
            return (texts, None) if sampler_options.get("return_stats") else texts
        given = np.zeros(ids.shape, bool) if mask is None else np.asarray(mask, bool)
        written = (np.arange(ids.shape[1])[None, :] < ends[:, None]) & ~given  # (B, L) the texts' positions, not given
        return texts, dict(out.stats, tokens_per_sample=ends.astype(np.int32), written_per_sample=written.sum(1))

    def decode(self, ids) -> str:
        """One sequence of token ids (int[L]) as text."""
        return self.tokenizer.decode(np.asarray(ids).reshape(-1))

    def likelihood(
        self,
        dataset,
        split: str = "validation",
        num_t: int = 64,
        batch_size: int = 32,
        max_batches: int | None = 8,
        seed: int = 0,
        progress: bool = True,
        **kwargs,
    ) -> dict:
        """Its kind's figures (``Kind.likelihood``) on `batch_size` x `max_batches` rows (None: all) of a split
        of `dataset` (read with its tokenizer), with "split", "kind", "num_t" (and "true_nats_per_token" for data
        of a known law): what ``sedd eval`` and the end of ``sedd.train.train`` report."""
        if split not in dataset.splits:
            raise ValueError(f"split {split!r} not in this data's splits {dataset.splits}; pass one of them")
        n_batches = -(-dataset.packed(split).num_sequences // batch_size)
        max_batches = n_batches if max_batches is None else min(max_batches, n_batches)  # a bar with a total
        batches = map(self.place_rows, dataset.eval_batches(batch_size, split=split))  # each device its rows
        out = self.kind.likelihood(
            jax.random.key(seed),
            self.net,
            batches,
            num_t,
            max_batches=max_batches,
            chars_per_token=dataset.chars_per_token,
            progress=progress,
            **kwargs,
        )
        out.update(split=split, kind=self.kind.name, num_t=num_t)
        if hasattr(dataset, "true_nats_per_token"):
            out["true_nats_per_token"] = dataset.true_nats_per_token()
        return out


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def from_parts(
    config, tokenizer, model_or_graphdef, params, rest=None, step: int = 0, mesh: jax.sharding.Mesh | None = None
) -> Run:
    """A Run around weights already in memory (during training, or in a notebook)."""
    if rest is None:
        model_or_graphdef, _, rest = nnx.split(model_or_graphdef, nnx.Param, ...)
    return Run(
        config=config,
        tokenizer=tokenizer,
        kind=kinds.get(config),
        graphdef=model_or_graphdef,
        params=params,
        rest=rest,
        step=int(step),
        mesh=mesh if mesh is not None else inference_mesh(config),
    )


def load(workdir: str | Path, ema: bool = True, step: int | None = None) -> Run:
    """The trained model of a run directory, for sampling and evaluation.

    Restores only the parameters (the EMA by default, as SEDD evaluates; else the raw ones) of `step`
    (default: the newest that reads whole, an unreadable one skipped with a RuntimeWarning), onto the
    run's mesh when these devices can form it, else onto all devices along the data axis.

    Raises:
      FileNotFoundError: not a run directory, no checkpoint yet, or no checkpoint of `step`.
      RunError: config.json or tokenizer.json cannot be read or is out of bounds.
      RuntimeError: the checkpoint is corrupt (its arrays' SHA-256 too) or does not fit the config.
      sedd.files.UnsafeFile: checkpoints/ holds a link, a FIFO or a device.
    """
    workdir = Path(workdir)
    config = read_config(workdir)
    tokenizer = read_tokenizer(workdir, config.vocab_size)
    try:  # a received run's length in bounds may still be quadratic memory past this machine's
        validate.check_memory(config, 1)
    except ValueError as e:
        raise RunError(f"{workdir / CONFIG}: {e}") from None
    manager = checkpoints.checkpoint_manager(workdir) if (workdir / CHECKPOINTS).is_dir() else None
    if not (steps := manager.all_steps() if manager else []):
        raise FileNotFoundError(f"{workdir} holds no checkpoint yet; train first with `sedd train`")
    if step is not None and step not in steps:
        raise FileNotFoundError(f"{workdir} has no checkpoint of step {step}; it has {sorted(steps)}")
    mesh = inference_mesh(config)
    graphdef, abstract, rest = kinds.abstract_network(kinds.get(config))
    shardings = sharding_lib.param_shardings(abstract, mesh, sharding_lib.make_rules(config.mesh.rules))
    target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings)
    which = "ema" if ema else "params"
    if step is None:  # the newest checkpoint that reads whole
        params, step = checkpoints.restore_newest(manager, {which: target})
        params = params[which]
    else:
        params = checkpoints.restore(manager, {which: target}, step)[which]
    if (line := lineage(config, step)) is not None:  # a distilled student samples with its round's steps
        config.sampling.steps = line["steps"]
    return from_parts(config, tokenizer, graphdef, params, rest, step, mesh)


def lineage(config, step: int) -> dict | None:
    """What a distilled run's checkpoint of `step` is (``sedd.distill``); None for a run `sedd train` wrote.

    Round r of R (distill.rounds) trains for distill.round_steps steps a student whose one step is its
    teacher's two, so it samples with N0 / 2^r steps (N0 = distill.teacher_steps); step k belongs to
    round ceil(k / round_steps), capped at R (step 0: the teacher itself).
    """
    d = config.distill
    if d.rounds < 1:
        return None
    r = min(-(-int(step) // d.round_steps), d.rounds)
    return {
        "teacher": d.teacher,
        "teacher_step": d.teacher_step,
        "round": r,
        "rounds": d.rounds,
        "steps": max(d.teacher_steps >> r, 1),
        "divergence": d.divergence,
        "target": d.target,
        "order": d.order,
    }
