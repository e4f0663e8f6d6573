"""A source -> a run directory: `convert` (dst written whole or not at all) and the `sedd convert` command."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import uuid
from pathlib import Path

import jax.numpy as jnp

from sedd import config as config_lib
from sedd import checkpoints, files, runs, validate
from sedd.convert.bd3lm import scalar_buffer
from sedd.convert.fields import GPT2_TOKENS
from sedd.convert.limits import MAX_TOKENIZER_BYTES, ConversionError, brief
from sedd.convert.original import config_from_original
from sedd.convert.read import read_source
from sedd.convert.source import scheme_of
from sedd.convert.weights import convert_params, count_parameters
from sedd.data import GPT2Tokenizer, save_tokenizer

TOKENIZER_DIR = "gpt2"  # where a converted run keeps its copy of the tokenizer files
PROVENANCE = "converted.json"


def _tokenizer_files(path: Path) -> list[Path]:
    """The GPT-2 tokenizer files at path (a tokenizer.json, or a folder with one or with vocab.json + merges.txt)."""
    if path.is_file():
        return [path]
    if (path / "tokenizer.json").is_file():
        return [path / "tokenizer.json"]
    if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
        return [path / "vocab.json", path / "merges.txt"]
    return []


def _read_gpt2(path: Path, pad: bool = False) -> GPT2Tokenizer:
    """GPT2Tokenizer of path, any failure to parse its files a ConversionError."""
    try:
        return GPT2Tokenizer(str(path), pad=pad)
    except (FileNotFoundError, ImportError):
        raise
    except ValueError as e:  # our check of its steps (check_pipeline): a bounded message, kept whole
        raise ConversionError(f"{path}: not a readable GPT-2 tokenizer: {e}") from None
    except Exception as e:  # the tokenizers package raises a bare Exception for a malformed file
        raise ConversionError(f"{path}: not a readable GPT-2 tokenizer: {brief(str(e))}") from None


def _check_destination(dst: Path) -> None:
    if dst.exists() and not dst.is_dir():
        raise ConversionError(f"{dst} exists and is not a directory; choose a new directory (it was left as it is)")
    held = sorted(p.name for p in dst.iterdir()) if dst.is_dir() else []
    if held:
        raise ConversionError(
            f"{dst} already holds {brief(held)}; choose a new or empty directory (it was left as it is)"
        )


def _checked_tokenizer_files(src: str | Path, tokenizer_path: str | Path | None) -> tuple[list[Path], Path | None]:
    """(GPT-2's tokenizer files, the folder they are read inside): --tokenizer_path's, else those inside src (beside
    a weights file), each a regular file of bounded size and the tokenizer readable.

    Raises:
      FileNotFoundError: no tokenizer files there (nothing is downloaded).
      ConversionError: a file refused (a link out of src, not a regular file, too large).
    """
    tok_src = Path(tokenizer_path or src).expanduser()
    if not tokenizer_path and tok_src.is_file():  # a weights file: look beside it
        tok_src = tok_src.parent
    tok_files = _tokenizer_files(tok_src)
    if not tok_files:
        raise FileNotFoundError(
            f"no GPT-2 tokenizer files at {tok_src}: pass --tokenizer_path pointing to GPT-2's tokenizer.json, or "
            "to a folder holding vocab.json and merges.txt (the files of the Hugging Face `gpt2` repository); "
            "nothing is downloaded"
        )
    # Files found inside SRC are read only inside it (no link out, as a run's); a --tokenizer_path the user
    # names may be a link (a Hugging Face cache's snapshot links to its blobs). Regular files of bounded size.
    tok_root = None if tokenizer_path else tok_src
    for f in tok_files:
        try:
            files.read_bytes(f, MAX_TOKENIZER_BYTES, root=tok_root)
        except files.UnsafeFile as e:
            raise ConversionError(
                f"{e} (GPT-2's tokenizer files are far under {MAX_TOKENIZER_BYTES:,} bytes)"
            ) from None
    _read_gpt2(tok_files[0] if len(tok_files) == 1 else tok_src)  # readable, or a clear error
    return tok_files, tok_root


def convert(
    src: str | Path, dst: str | Path, ema: bool = True, tokenizer_path: str | Path | None = None, dtype: str = "float32"
) -> dict:
    """Writes the run directory `dst` (new, or empty) from the checkpoint at `src`: the `sedd convert` command.

    src: a published folder, an original training run directory, or a weights file (`read.locate`); ema: a
    training checkpoint's EMA weights (as the original samples) or its raw weights; tokenizer_path: GPT-2's
    tokenizer.json, or a folder with it or with vocab.json + merges.txt (default: those inside src), copied into
    dst/gpt2; dtype: the compute dtype of the config. Returns converted.json's dict: parameters, step, weights
    (published / ema / model), source files. dst is written whole or not at all: into a folder beside it,
    renamed to dst once everything was read, checked and written.

    Raises:
      ConversionError, UnsafePickleError, FileNotFoundError, ImportError.
    """
    dst = Path(dst).expanduser().absolute()
    if not Path(src).expanduser().exists():
        raise FileNotFoundError(
            f"no such source {src}: give the published folder (config.json + "
            "pytorch_model.bin or model.safetensors) or an original training run directory; "
            f"sedd downloads nothing: {validate.FETCH} (docs/pretrained.md)"
        )
    _check_destination(dst)
    tok_files, tok_root = _checked_tokenizer_files(src, tokenizer_path)

    source = read_source(src, ema)
    tok_dir = dst / TOKENIZER_DIR
    config = config_from_original(source.config, str(tok_dir), dtype)
    scheme = scheme_of(source.config)
    read = lambda sd: convert_params(sd, config, scheme.prefix, scheme.fold_sigma, scheme.buffers)  # noqa: E731
    weights = read(source.weights)
    raw = weights if source.raw is None or source.raw is source.weights else read(source.raw)
    summary = {
        "source": str(Path(src).absolute()),
        "config_file": str(source.config_file.absolute()),
        "weights_file": str(source.weights_file.absolute()),
        "weights": source.kind,
        "step": source.step,
        "parameters": count_parameters(weights),
        "family": scheme.family,
        "original_config": source.config,
    }
    if scheme.fold_sigma:
        summary["folded"] = "the source feeds sigma = 0: its sigma embedding is folded into the adaLN biases"
    for name in scheme.buffers:  # BD3-LM's clipped schedule: kept for the record (our bound runs t over [eps, 1])
        summary[name] = scalar_buffer(source.weights, name)

    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.parent / f".{dst.name}.converting-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        (tmp / TOKENIZER_DIR).mkdir()
        for f in tok_files:  # a lone JSON file is GPT-2's tokenizer.json, whatever its name
            files.copy(
                f,
                tmp / TOKENIZER_DIR / ("tokenizer.json" if len(tok_files) == 1 else f.name),
                MAX_TOKENIZER_BYTES,
                root=tok_root,
            )
        tokenizer = _read_gpt2(tmp / TOKENIZER_DIR, pad=config.vocab_size == GPT2_TOKENS + 1)
        tokenizer.path = str(tok_dir)  # where the copy is once tmp is renamed to dst
        save_tokenizer(tokenizer, tmp / runs.TOKENIZER)
        files.write_text(tmp / runs.CONFIG, config_lib.to_json(config), tmp)
        files.write_text(tmp / PROVENANCE, json.dumps(summary, indent=2, sort_keys=True, default=str), tmp)
        state = {"step": jnp.asarray(source.step, jnp.int32), "params": raw, "ema": weights}
        manager = checkpoints.checkpoint_manager(tmp, config)
        files.save_checkpoint(manager, source.step, state)  # a SHA-256 of each array, verified at every load
        manager.wait_until_finished()
        manager.close()
        try:
            os.rename(tmp, dst)  # atomic; replaces an empty dst, refuses one that gained files meanwhile
        except OSError as e:
            raise ConversionError(
                f"{dst} could not take the converted run ({e.strerror}); it was left as it is"
            ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def _parser() -> argparse.ArgumentParser:
    p = validate.OneLineParser(
        prog="sedd convert",
        description="Convert PyTorch weights into a run directory for sedd sample / eval / serve: the original "
        "SEDD's (the published folder with config.json + pytorch_model.bin or model.safetensors, or "
        "an original training run directory), MDLM's and BD3-LM's Hugging Face folders, or a DUO "
        "Lightning checkpoint (.ckpt). torch is not needed; see docs/pretrained.md.",
    )
    p.add_argument("src", help="published folder, original training run directory, a weights file, or a DUO .ckpt")
    p.add_argument("dst", help="the new run directory")
    p.add_argument("--no_ema", action="store_true", help="a training checkpoint's raw weights instead of its EMA")
    p.add_argument(
        "--tokenizer_path",
        default=None,
        help="GPT-2's tokenizer.json, or a folder with vocab.json + merges.txt (default: inside SRC)",
    )
    p.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="compute dtype of the converted model (bfloat16 as the original on GPUs)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """`sedd convert SRC DST [--no_ema] [--tokenizer_path PATH] [--dtype D]`; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        validate.check_args("convert", args)  # paths of the right kind (no FIFO, no device) before any work
        summary = convert(args.src, args.dst, ema=not args.no_ema, tokenizer_path=args.tokenizer_path, dtype=args.dtype)
    except (ValueError, FileNotFoundError, ImportError, OSError) as e:
        print(f"sedd convert: error: {validate.clipped(str(e))}", file=sys.stderr)
        return 2
    print(
        f"converted {summary['weights_file']} ({summary['weights']} weights, step {summary['step']}, "
        f"{summary['parameters']:,} parameters) to {args.dst}"
    )
    print(f"next: sedd sample --workdir {args.dst} --prefix 'Hello'")
    return 0
