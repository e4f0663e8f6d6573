"""Experiment configs: `get_config()` files, command-line overrides, validation.

A config is an ``ml_collections.ConfigDict`` with the sections model / graph /
noise / data / training / optim / sampling / mesh; the shipped ones live in
``experiments/configs/`` and every field there carries a comment.
Overrides use ml_collections' flag style, ``--config.training.n_iters=100``.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import json
import sys
from pathlib import Path

import ml_collections

CONFIG_DIR = Path(__file__).resolve().parent.parent / "experiments" / "configs"
DEFAULT_CONFIG = "shakespeare_char"


def shipped_configs() -> list[str]:
    """Names of the configs in experiments/configs (empty outside a source checkout)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.py")) if CONFIG_DIR.is_dir() else []


def load_config(name_or_path: str = DEFAULT_CONFIG) -> ml_collections.ConfigDict:
    """Run `get_config()` of a config file, given its path or a shipped config's name."""
    path = Path(name_or_path)
    if not path.suffix:
        path = CONFIG_DIR / f"{name_or_path}.py"
    if not path.is_file():
        raise FileNotFoundError(
            f"no config file {name_or_path!r}; give a path to a .py file with get_config(), "
            f"or one of the shipped configs {shipped_configs()}"
        )
    # Configs build on their siblings (`import shakespeare_char`).
    sys.path.insert(0, str(path.resolve().parent))
    try:
        spec = importlib.util.spec_from_file_location(f"_sedd_config_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    if not hasattr(module, "get_config"):
        raise ValueError(f"config file {path} defines no get_config()")
    return module.get_config()


def _all_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    keys = []
    for k, v in config.items():
        if isinstance(v, ml_collections.ConfigDict):
            keys += _all_keys(v, f"{prefix}{k}.")
        else:
            keys.append(f"{prefix}{k}")
    return keys


def _parse_value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare string such as --config.data.path=/tmp/my.txt


def apply_override(config: ml_collections.ConfigDict, key: str, text: str) -> None:
    """Set config[key] (dotted) from the string `text`, keeping the field's type.

    Raises:
      KeyError: the key does not exist (with the closest existing keys).
      ValueError: the value does not fit the field's type.
    """
    known = _all_keys(config)
    if key not in known:
        close = difflib.get_close_matches(key, known, n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise KeyError(f"unknown config key {key!r}{hint} (known keys: {', '.join(known)})")
    *parents, leaf = key.split(".")
    node = config
    for p in parents:
        node = node[p]
    old = node[leaf]
    value = _parse_value(text)
    if isinstance(old, str):
        value = text  # "1e-3" for a string field stays a string
    elif isinstance(old, bool) and not isinstance(value, bool):
        raise ValueError(f"config key {key!r} expects true/false (True/False), got {text!r}")
    elif isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    try:
        node[leaf] = value
    except TypeError as e:
        raise ValueError(
            f"config key {key!r} expects a {type(old).__name__} (now {old!r}), got {text!r}"
        ) from e


def apply_overrides(config: ml_collections.ConfigDict, args: list[str]) -> ml_collections.ConfigDict:
    """Apply `--config.a.b=value` (or `--config.a.b value`) arguments in order."""
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--config."):
            raise ValueError(f"unexpected argument {arg!r}; overrides look like --config.training.n_iters=100")
        if "=" in arg:
            key, text = arg[len("--config."):].split("=", 1)
        else:
            if i + 1 >= len(args):
                raise ValueError(f"{arg} needs a value")
            key, text = arg[len("--config."):], args[i + 1]
            i += 1
        apply_override(config, key, text)
        i += 1
    return config


def to_json(config: ml_collections.ConfigDict) -> str:
    """The config as indented JSON with sorted keys (the run directory's config.json)."""
    return json.dumps(config.to_dict(), indent=2, sort_keys=True)


def from_json(text: str) -> ml_collections.ConfigDict:
    """The inverse of ``to_json``: a ConfigDict from its JSON text."""
    return ml_collections.ConfigDict(json.loads(text))
