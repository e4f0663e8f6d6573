"""Finding and reading a source: its files (`locate`), config (`read_original_config`), weights (`read_source`)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Mapping

from sedd import files
from sedd.convert.duo import lightning_source
from sedd.convert.limits import MAX_TEXT_BYTES, ConversionError, brief
from sedd.convert.mdlm import HF_GENERIC, HF_METADATA
from sedd.convert.original import config_from_original
from sedd.convert.safetensors_file import load_safetensors
from sedd.convert.source import Source, ema_weights, state_dict_of, training_step
from sedd.convert.torch_zip import load_torch


def read_original_config(path: str | Path) -> dict:
    """The sections of config.json (JSON) or .hydra/config.yaml (YAML) that the conversion reads.

    Returns:
      {"tokens", "model", "graph", "noise"} and training.ema where present, each
      value a scalar: what converted.json keeps of the original's config.
    Raises:
      ConversionError: too large, not JSON / YAML, a YAML alias, or a section
        that is not a mapping of scalars.
    """
    path = Path(path)
    try:  # a regular file of bounded size (not a FIFO, not /dev/zero): sedd.files
        text = files.read_text(path, MAX_TEXT_BYTES)
    except UnicodeDecodeError as e:
        raise ConversionError(f"{path} is not UTF-8 text: {e}") from None
    except files.UnsafeFile as e:
        raise ConversionError(f"{e} (a config has at most {MAX_TEXT_BYTES:,} bytes)") from None
    if path.suffix in (".yaml", ".yml"):
        data = _load_yaml(text, path)
    else:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise ConversionError(f"{path} is not JSON: {brief(str(e))}") from None
    if not isinstance(data, dict):
        raise ConversionError(f"{path} does not hold a config mapping")
    if set(data) == {"config"} and isinstance(data["config"], dict):  # a mixin wrapping its init kwargs
        data = data["config"]
    if "model_type" in data:  # a Hugging Face config of MDLM / BD3-LM: flat; its code-loading fields dropped
        kept = {key: value for key, value in data.items() if key not in HF_METADATA | HF_GENERIC}
        generic = sorted(set(data) & HF_GENERIC)
        if generic:
            print(
                f"sedd convert: note: {path} holds transformers' own config field(s) {generic}, not fields of "
                "the model: ignored",
                file=sys.stderr,
            )
    else:
        kept = {key: data[key] for key in ("tokens", "model", "graph", "noise") if key in data}
    if isinstance(data.get("training"), dict) and "ema" in data["training"]:
        kept["training"] = {"ema": data["training"]["ema"]}
    scalar = (str, int, float, bool, type(None))
    for name, value in kept.items():
        fields = value.items() if isinstance(value, dict) else [("", value)]
        for key, v in fields:
            if not isinstance(v, scalar):
                where = f"{name}.{key}" if key else name
                raise ConversionError(f"{where} in {path} is a {type(v).__name__}, not a number, string or bool")
    return kept


def _load_yaml(text: str, path: Path):
    """YAML with PyYAML's safe loader, aliases refused: Hydra writes none, and a few of them nest into gigabytes."""
    try:
        import yaml  # optional dependency: only Hydra run directories need it
    except ImportError as e:
        raise ImportError(f"reading {path} needs PyYAML: pip install pyyaml") from e

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise ConversionError(
                    f"{path}: a YAML alias (*{brief(event.anchor)}) at line "
                    f"{event.start_mark.line + 1}; a Hydra config has none, and aliases are "
                    "refused (a few can expand to gigabytes)"
                )
            return super().compose_node(parent, index)

    try:
        return yaml.load(text, NoAliasLoader)  # noqa: S506 (a SafeLoader)
    except ConversionError:
        raise
    except (yaml.YAMLError, RecursionError, ValueError, OverflowError) as e:
        raise ConversionError(f"{path} is not YAML a config can hold: {' '.join(str(e).split())[:300]}") from None


def _newest_snapshot(folder: Path) -> Path | None:
    found = [
        (int(m[1]), p) for p in folder.glob("checkpoint_*.pth") if (m := re.fullmatch(r"checkpoint_(\d+)\.pth", p.name))
    ]
    return max(found)[1] if found else None


def locate(src: str | Path) -> tuple[Path, Path]:
    """(config file, weights file) of a published folder, a training run directory, or a weights file.

    A folder: model.safetensors (preferred: no pickle) or pytorch_model.bin
    beside config.json; else .hydra/config.yaml with
    checkpoints-meta/checkpoint.pth (the newest, as the original's
    load_model_local), else the highest checkpoints/checkpoint_N.pth. A file:
    its folder's config.json, or the run directory's .hydra/config.yaml above it.

    Raises:
      FileNotFoundError: saying which files were looked for.
    """
    src = Path(src).expanduser()
    if src.is_file():
        for config in (src.parent / "config.json", src.parent.parent / ".hydra" / "config.yaml"):
            if config.is_file():
                return config, src
        raise FileNotFoundError(f"no config.json beside {src} and no .hydra/config.yaml above it")
    if not src.is_dir():
        what = "neither a regular file nor a folder" if src.exists() else "no such file or folder"
        raise FileNotFoundError(f"{src}: {what}")
    for weights in ("model.safetensors", "pytorch_model.bin"):
        if (src / weights).is_file():
            if not (src / "config.json").is_file():
                raise FileNotFoundError(f"{src / weights} has no config.json beside it")
            return src / "config.json", src / weights
    hydra = src / ".hydra" / "config.yaml"
    if hydra.is_file():
        meta = src / "checkpoints-meta" / "checkpoint.pth"
        weights = meta if meta.is_file() else _newest_snapshot(src / "checkpoints")
        if weights is None:
            raise FileNotFoundError(
                f"{src} has .hydra/config.yaml but neither checkpoints-meta/checkpoint.pth "
                "nor checkpoints/checkpoint_N.pth"
            )
        return hydra, weights
    raise FileNotFoundError(
        f"{src} holds neither the published files (config.json + pytorch_model.bin or model.safetensors) nor "
        "an original training run (.hydra/config.yaml + checkpoints-meta/checkpoint.pth or "
        "checkpoints/checkpoint_N.pth)"
    )


def read_source(src: str | Path, ema: bool = True) -> Source:
    """The config and weights of a source (see `locate`), EMA weights by default for a training checkpoint.

    The config is read and checked first, so that every size in it is bounded
    before the weights are read against it. A .ckpt file is a DUO Lightning
    checkpoint (`sedd.convert.duo.lightning_source`), its config inside it.
    """
    if Path(src).expanduser().suffix == ".ckpt" and Path(src).expanduser().is_file():
        return lightning_source(Path(src).expanduser(), ema)
    config_file, weights_file = locate(src)
    config = read_original_config(config_file)
    n_blocks = config_from_original(config).model.n_layers
    if weights_file.suffix == ".safetensors":
        return Source(config, config_file, weights_file, load_safetensors(weights_file), None, 0, "published")
    obj = load_torch(weights_file)
    if not (isinstance(obj, Mapping) and "model" in obj and "ema" in obj):  # a bare state dict
        return Source(config, config_file, weights_file, state_dict_of(obj, str(weights_file)), None, 0, "published")
    model = state_dict_of(obj["model"], f"{weights_file}['model']")
    step = training_step(obj.get("step", 0), str(weights_file))
    weights = ema_weights(obj["ema"], model, n_blocks, str(weights_file)) if ema else model
    return Source(config, config_file, weights_file, weights, model, step, "ema" if ema else "model")
