"""Experiment configs: `get_config()` files and `--config.a.b=value` overrides.

A config is an ``ml_collections.ConfigDict`` with the sections model / graph /
noise / data / training / optim / sampling / mesh. The shipped ones are the
modules of ``sedd.configs`` (found by name from any install); any other file
with a ``get_config()`` works too. Overrides go through ml_collections' own
flag parser on a locked config, which checks each value against the field's
type and answers a misspelt key with "did you mean".

A run directory's config.json is upgraded once, by ``migrate``, where it is
read (``sedd.runs.read_config``), so the rest of sedd reads every key as a
plain attribute and a missing key is an error, never a silent default.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import json
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import ml_collections
from absl import flags
from ml_collections import config_flags

DEFAULT_CONFIG = "shakespeare_char"


def shipped_configs() -> list[str]:
    """Names of the configs shipped in ``sedd.configs``."""
    files = importlib.resources.files("sedd.configs").iterdir()
    return sorted(f.name[:-3] for f in files if f.name.endswith(".py") and not f.name.startswith("_"))


def config_path(name_or_path: str = DEFAULT_CONFIG) -> Path:
    """The file of a shipped config's name, or the given path to a config file.

    Raises:
      FileNotFoundError: neither a shipped name nor an existing file.
    """
    path = Path(name_or_path)
    if not path.suffix and name_or_path in shipped_configs():
        path = Path(str(importlib.resources.files("sedd.configs") / f"{name_or_path}.py"))
    if not path.is_file():
        raise FileNotFoundError(
            f"no config file {name_or_path!r}; give a path to a .py file with get_config(), "
            f"or one of the shipped configs {shipped_configs()}"
        )
    return path


def _run_config_file(path: Path) -> ml_collections.ConfigDict:
    spec = importlib.util.spec_from_file_location(f"_sedd_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ValueError(f"config file {path} defines no get_config()")
    return module.get_config()


def override(config: ml_collections.ConfigDict, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
    """A copy of `config` with `--config.a.b=value` (or `--config.a.b value`) arguments applied.

    Raises:
      KeyError: a key that does not exist, with the closest existing key.
      ValueError: a value that does not fit the field's type, or an argument
        that is not a config override.
    """
    argv = ["sedd", *overrides]
    value_next = False  # after `--config.a.b`, its value
    for arg in overrides:
        if value_next:
            value_next = False
        elif arg.startswith("--config.") and arg != "--config.":
            value_next = "=" not in arg
        else:  # absl would take it as a positional argument and drop it without a word
            raise ValueError(f"unexpected argument {arg!r}; overrides look like --config.training.n_iters=100")
    values = flags.FlagValues()
    try:
        config_flags.DEFINE_config_dict(
            "config", ml_collections.ConfigDict(config.to_dict()), flag_values=values, lock_config=True, sys_argv=argv
        )
        values(argv)
    except (AttributeError, KeyError) as e:  # a missing key; ml_collections names the closest one
        raise KeyError(_unknown_key_message(config, overrides, str(e))) from None
    except flags.Error as e:
        raise ValueError(str(e)) from None
    given, now = set(given_keys(overrides)), values.config.to_dict()
    for key, (before, where, value) in MOVED.items():  # the old key of a moved meaning, given alone
        if where is not None and before in given and key not in given and _get(now, where) == value:
            raise ValueError(
                f"--config.{before} is not what a {where}={value!r} run reads: its meaning moved to "
                f"{key} (give --config.{key}={_get(now, before)!r})"
            )
    return values.config


def given_keys(overrides: Sequence[str]) -> list[str]:
    """The keys `--config.a.b=value` (or `--config.a.b value`) arguments set, in order: ["a.b", ...]."""
    return [arg[len("--config.") :].split("=")[0] for arg in overrides if arg.startswith("--config.")]


def _unknown_key_message(config, overrides: Sequence[str], error: str) -> str:
    """ "unknown config key 'a.bb'; did you mean 'a.b'?" from ml_collections' hint."""
    keys = given_keys(overrides)
    for key in keys:
        renamed = [new for new, (before, where, _) in MOVED.items() if before == key and where is None]
        if renamed:
            return f"config key {key!r} is now {renamed[0]!r}"
        node, parts = config, key.split(".")
        for i, part in enumerate(parts):
            if not isinstance(node, ml_collections.ConfigDict) or part not in node:
                hint = re.search(r'Did you mean "([^"]+)" instead of "([^"]+)"', error)
                if hint and hint[2] == part:
                    return f"unknown config key {key!r}; did you mean {'.'.join([*parts[:i], hint[1]])!r}?"
                return f"unknown config key {key!r}"
            node = node[part]
    return f"unknown config key among {keys}"


def load_config(name_or_path: str = DEFAULT_CONFIG, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
    """Run `get_config()` of a shipped config (by name) or a config file, then apply overrides."""
    config = _run_config_file(config_path(name_or_path))
    return override(config, overrides) if overrides else config


def to_json(config: ml_collections.ConfigDict) -> str:
    """The config as indented JSON with sorted keys (the run directory's config.json)."""
    return json.dumps(config.to_dict(), indent=2, sort_keys=True)


def from_json(text: str) -> ml_collections.ConfigDict:
    """The inverse of ``to_json``: a ConfigDict from its JSON text."""
    return ml_collections.ConfigDict(json.loads(text))


BEFORE_IT_EXISTED: dict[str, Any] = {
    "data.documents": "file",  # 5b0c4df: a .txt file was one document
    "model.time_conditioning": True,  # d359873: the network always saw sigma
    "model.vocab_multiple": 1,  # the vocabulary tables unpadded (their shapes in the checkpoints)
    "model.normalize": False,  # 0847391: the unnormalized score output
    "optim.adaln_lr_scale": 1.0,  # 0847391: the adaLN kernels at AdamW's full rate
    "optim.optimizer": "adamw",  # f517b71: AdamW for every parameter
    "training.t_power": 0.0,  # 8f7e58b: t uniform on [sampling_eps, 1]
    "distill.target": "law",  # sedd distill's first runs matched the teacher's two-step law
    "model.draft_head": 0,  # a run had no draft head before it could have one
    "model.token_shift": False,  # a block network read its own position's token before it could read the one before
}
"""What a run written before a key existed did, for the keys added since the first configs (4cea325)
that change what is trained or sampled; each is pinned even where it is today's default, so a new
default never changes an old run. Any other missing key takes the shipped default: mesh.* choose
devices and processes, not what is computed (runs before mesh.cpu_devices used one CPU device, runs
before mesh.distributed one process), data.markov.* came with data.name = "markov", and
optim.muon_lr_scale is read only by Muon, which the shipped configs offered from that key on."""


MOVED: dict[str, tuple[str, str | None, Any]] = {
    "model.draft_k": ("model.block_size", "model.kind", "spec"),  # until 2026-12-05
    "model.n_layers": ("model.n_blocks", None, None),  # until 2026-12-06: the original's name
    "sampling.sampler": ("sampling.predictor", None, None),  # until 2026-12-06: one word for samplers
}
"""key -> (the key its value was kept in before, and the key and value of the runs that kept it there, None:
every run): a spec run's drafts a round were its model.block_size until they got a key of their own
(block_size now means a block run's block length only); the network's transformer layers were
model.n_blocks, the original's name, until "block" came to mean block diffusion's alone; a run's sampler was its
sampling.predictor until "sampler" became the one word for them."""

KIND_MOVED: dict[str, tuple[str, str]] = {"spec": ("model.draft_head", "ar")}  # until 2026-12-07
"""model.kind -> (a key, a kind): a saved run of that kind with the key set is of the other kind: a spec run with
a draft head had no draft half, and is the AR run with a head it was (``sedd.kinds.draft_head``)."""

RENAMED_VALUES: dict[str, dict[Any, Any]] = {"model.remat": {"blocks": "layers"}}  # until 2026-12-06
"""key -> {a value saved runs may hold: its name today}."""


def _get(tree: Mapping[str, Any], key: str):
    """tree's value at the dotted `key`; None where a part is missing."""
    for part in key.split("."):
        tree = tree.get(part) if isinstance(tree, Mapping) else None
    return tree


def moved(saved: Mapping[str, Any], config: dict, default: Mapping[str, Any]) -> None:
    """Fill in `config` (today's keys) each ``MOVED`` key that `saved` kept in another key; that key, whose value
    was the moved meaning's, gets its `default` (the shipped config's)."""
    for key, (before, where, value) in MOVED.items():
        if (
            _get(saved, key) is None
            and _get(saved, before) is not None
            and (where is None or _get(saved, where) == value)
        ):
            section, name = key.rsplit(".", 1)
            config[section][name] = _get(saved, before)
            section, name = before.rsplit(".", 1)
            if _get(default, before) is not None:  # the key lives on, with another meaning
                config[section][name] = _get(default, before)
    for key, renamed in RENAMED_VALUES.items():
        section, name = key.rsplit(".", 1)
        if isinstance(config[section][name], str) and config[section][name] in renamed:
            config[section][name] = renamed[config[section][name]]


def migrate(saved: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """A saved config (a run directory's config.json) with the keys of today's configs.

    Each key of the shipped default config that `saved` lacks (the run was
    written before the key existed) gets its ``BEFORE_IT_EXISTED`` value, else
    its shipped default; a key whose meaning moved out of another takes its value (``moved``);
    a spec run with a draft head, which drafted with the head alone, is the AR run with a head it was
    (``sedd.kinds.draft_head``; its checkpoint's unused MASK row is dropped by ``sedd.checkpoints.restore``).
    Keys only in `saved` (since removed) are dropped;
    vocab_size, filled in from the data at training, is kept. The values
    `saved` has are kept as they are. saved: nested dicts or a ConfigDict.
    """
    if isinstance(saved, ml_collections.ConfigDict):
        saved = saved.to_dict()

    def fill(have: Mapping[str, Any], default: dict, prefix: str) -> dict:
        out = {}
        for key, value in default.items():
            if isinstance(value, dict):
                section = have.get(key)
                out[key] = fill(section if isinstance(section, Mapping) else {}, value, f"{prefix}{key}.")
            else:
                out[key] = have[key] if key in have else BEFORE_IT_EXISTED.get(f"{prefix}{key}", value)
        return out

    default = load_config(DEFAULT_CONFIG).to_dict()
    config = fill(saved, default, "")
    moved(saved, config, default)
    for kind, (key, now) in KIND_MOVED.items():
        if config["model"]["kind"] == kind and _get(config, key):
            config["model"]["kind"] = now
    if "vocab_size" in saved:
        config["vocab_size"] = saved["vocab_size"]
    return ml_collections.ConfigDict(config)


MAY_CHANGE_ON_RESUME = (
    "training.n_iters",
    "training.log_every",
    "training.eval_every",
    "training.ckpt_every",
    "training.max_to_keep",
    "training.keep_period",
    "training.eval_batches",
    "training.eval_samples",
    "sampling.*",
    "mesh.*",
    "data.data_dir",
    "model.dtype",
)
"""Config keys a resumed run may change: when and what it logs, evaluates and saves, how long it
runs, the mesh it runs on and its compute precision (parameters are float32 in any), where the
prepared data lives. Any other key (the model, the
graph, the noise, the data, the optimizer, the batch, the seed) is part of what was trained."""


def flat(d: dict, prefix: str = "") -> dict:
    """A nested dict as one level of dotted keys: {"model.n_layers": 4, ...}."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_changes(saved: dict, current: dict) -> list[tuple[str, Any, Any]]:
    """(key, saved value, current value) for every key of `current` that differs from `saved`.

    `saved` is read as today's keys (``migrate``): a key absent from it (a run written
    before the key existed) counts as what such runs did, its ``BEFORE_IT_EXISTED``
    value, else its shipped default, and a key whose meaning moved out of another
    (``MOVED``) its value there. Keys only in `saved` (since removed) and vocab_size
    (filled in from the data) are ignored.
    """
    saved, current = flat(migrate(saved).to_dict()), flat(current)
    missing = object()
    return [
        (key, "(absent)" if was is missing else was, now)
        for key, now in sorted(current.items())
        if key != "vocab_size" and (was := saved.get(key, missing)) != now
    ]
