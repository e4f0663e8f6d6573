"""The figures of a trained run: its likelihood on a split of a dataset, and the judge of its samples.

One floor above ``sedd.evaluate`` (pure math on score functions and
batches) and ``sedd.runs`` (a run directory): what ``sedd eval`` and the end
of ``sedd train`` report. Each run's figure is its kind's
(``sedd.kinds.Kind.likelihood``): the score-entropy bound of a diffusion
model, with its standard error, or the exact NLL of an AR baseline; the data
a received run is evaluated on, followed only as far as this user prepared it
(``eval_data``).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from sedd import code_measures, evaluate, runs, sharding
from sedd import config as config_lib
from sedd.data import (
    BUILDERS,
    OutOfVocabulary,
    check_characters,
    check_data_dir,
    default_data_dir,
    load_dataset,
    read_documents,
)
from sedd.data.builders import MANIFEST
from sedd.kinds import capabilities


def load_judge(workdir: str | Path, tokenizer=None) -> runs.Run:
    """A run whose likelihood is exact (an AR baseline, a spec run's causal half), as a judge of samples.

    Raises:
      FileNotFoundError: not a trained run.
      ValueError: the run's likelihood is a bound, not exact, or its
        vocabulary differs from `tokenizer` (samples would be scored as other tokens).
    """
    judge = runs.load(workdir)
    if not isinstance(judge.kind, capabilities.Exact):
        raise ValueError(
            f"the judge {workdir} is a model.kind={judge.kind.name!r} run, whose likelihood is a "
            "bound; a judge's must be exact: an AR baseline (train one with --config.model.kind=ar) "
            "or a spec run"
        )
    if tokenizer is not None:
        check_same_vocabulary(tokenizer, judge.tokenizer, what=f"the judge {workdir}")
    return judge


def judge_nll(judge: runs.Run) -> Callable:
    """The exact NLL of `judge` (``load_judge``) as ``sedd.evaluate.generative_perplexity`` takes it: x0 int[B, L]
    -> float32[B] nats per sequence (its kind's ``sequence_nll``), ValueError for a token id the judge cannot score
    (outside [0, V), e.g. a MASK left in a sample) or samples longer than its length."""
    score = judge.kind.sequence_nll(judge.net)
    vocab, length = judge.config.vocab_size, judge.seq_len

    def nll(x0):
        x0 = np.asarray(x0)
        if x0.min() < 0 or x0.max() >= vocab:
            raise ValueError(f"samples hold ids outside the judge's vocabulary [0, {vocab})")
        if x0.shape[1] > length:
            raise ValueError(f"samples of length {x0.shape[1]} exceed the judge's length {length}")
        return score(jnp.asarray(x0, jnp.int32))

    return nll


def check_same_vocabulary(tokenizer, other, what: str = "the judge") -> None:
    """Raise ValueError unless two tokenizers map ids to the same strings."""
    if tokenizer.to_dict() != other.to_dict() or tokenizer.vocab_size != other.vocab_size:
        raise ValueError(
            f"{what} has another vocabulary ({other.to_dict().get('name')}, {other.vocab_size} ids) than "
            f"the model ({tokenizer.to_dict().get('name')}, {tokenizer.vocab_size} ids); token ids would "
            "mean different strings. Train the judge on the same data and tokenizer."
        )


def evaluate_run(
    workdir: str | Path,
    split: str | None = None,
    num_t: int = 64,
    batch_size: int = 32,
    max_batches: int | None = 8,
    seed: int = 0,
    data: dict | None = None,
    progress: bool = True,
    step: int | None = None,
    **kwargs,
) -> dict:
    """The likelihood figures of a trained run on a split of a dataset (``sedd eval``).

    The figure of the run's kind (EMA weights): the bound of
    ``sedd.evaluate.likelihood_bound`` for a diffusion run, the exact NLL for
    an AR run. On synthetic data the true entropy of the data
    (``true_nats_per_token``) is added.

    Args:
      split: None: "validation" where the data has one, else its evaluation split.
      data: overrides of the run's data config (e.g. {"name": "text", "path": "other.txt"}: zero-shot,
        with the run's tokenizer).
      step: evaluate this checkpoint instead of the newest.
    Returns:
      ``Run.likelihood``'s figures and step.
    """
    run = runs.load(workdir, step=step)
    dataset = run_data(run, data)
    if split is None:
        split = "validation" if "validation" in dataset.splits else [s for s in dataset.splits if s != "train"][0]
    out = run.likelihood(dataset, split, num_t, batch_size, max_batches, seed, progress, **kwargs)
    out["step"] = run.step  # the checkpoint evaluated (the newest readable one unless step was given)
    return out


def run_data(run: runs.Run, data: dict | None = None):
    """The dataset of a run's data section, with overrides (`data`), read with the run's tokenizer."""
    dcfg = ml_collections.ConfigDict(run.config.data.to_dict())
    for k, v in (data or {}).items():
        dcfg[k] = v
    try:
        if data:  # other text: refused, where the run cannot read it, before anything is prepared from it
            check_characters(dcfg, run.tokenizer)
        dataset = load_dataset(dcfg, tokenizer=run.tokenizer)
    except OutOfVocabulary as e:
        if not data:  # the run's own data: a corpus edited since the run was trained
            raise
        raise ValueError(
            f"{dcfg.path or dcfg.name}: {e}. This run reads and writes only those characters: give "
            "it a text made of them (its own kind of text), or train a run on this one (sedd train "
            f"--config.data.path={dcfg.path or '...'})"
        ) from None
    if dataset.tokenizer.to_dict() != run.tokenizer.to_dict():
        check_same_vocabulary(run.tokenizer, dataset.tokenizer, what="the evaluation data")
    return dataset


def code_figures(
    run: runs.Run,
    dataset,
    num_prompts: int = 32,
    prompt_chars: int = 48,
    seed: int = 0,
    judge: runs.Run | None = None,
    min_chars: int = code_measures.MIN_CHARS,
    steps: int | None = None,
    sampler: str | None = None,
    memorisation: code_measures.Memorisation | None = None,
    **options,
) -> tuple[dict, list[str]]:
    """The measures of code (``sedd.code_measures``) on completions of held-out code, and on the code itself.

    num_prompts windows of the run's length L that start at a top-level
    statement of the validation files (``code_measures.prompts``): the run
    completes each from its first prompt_chars characters. Reported for the
    completions (``samples_*``) and, as their ceiling, for the held-out
    windows themselves (``data_*``): the parse rate (of the windows with a
    complete top-level statement), that share, the share of lines that
    tokenise, the share of characters in verbatim copies of >= min_chars
    characters of the training split; with judge (an AR run of the same
    data), its NLL of the completions in nats per character.
    memorisation: the table of the training split's windows, built once for
    many calls (``code_measures.Memorisation``). Also: the completions'
    network calls (``nfe``) and the tokens each row
    writes a call (an AR run's calls include one a prompt token). Returns
    (the figures, the completions' texts).
    """
    documents = read_documents(dataset.builder, "validation")
    pairs = code_measures.prompts(documents, num_prompts, run.seq_len, prompt_chars, seed)
    mask = np.zeros((num_prompts, run.seq_len), bool)
    tokens = np.zeros((num_prompts, run.seq_len), np.int32)
    for i, (prompt, _) in enumerate(pairs):
        ids = run.tokenizer.encode(prompt)
        mask[i, : len(ids)], tokens[i, : len(ids)] = True, ids
    if len(set(mask.sum(1).tolist())) != 1:
        raise ValueError(
            f"the prompts are {sorted(set(mask.sum(1).tolist()))} tokens long: an AR run takes prompts "
            "of one length (a character tokenizer gives them)"
        )
    out = run.sample(
        jax.random.key(seed),
        num_prompts,
        steps,
        sampler,
        fixed_mask=jnp.asarray(mask),
        fixed_tokens=jnp.asarray(tokens),
        return_stats=True,
        **options,
    )
    texts = [run.decode(row) for row in out.tokens]
    memo = memorisation or code_measures.Memorisation("\x00".join(read_documents(dataset.builder, "train")), min_chars)
    result = {"prompts": num_prompts, "prompt_chars": prompt_chars, "min_chars": memo.min_chars}
    for name, batch in (("samples", texts), ("data", [p + c for p, c in pairs])):
        figures = code_measures.parse_figures(batch)
        result.update({f"{name}_{k}": figures[k] for k in ("parse_rate", "complete_share", "tokenise_rate")})
        result[f"{name}_memorised_share"] = memo.share([t[prompt_chars:] for t in batch])
    stats = out.stats or {}
    nfe = int(stats["nfe"]) if "nfe" in stats else None  # the batch's calls: its slowest row's
    row_nfe = float(np.mean(stats["nfe_per_sample"])) if "nfe_per_sample" in stats else nfe
    written = run.seq_len - int(mask[0].sum())  # tokens each row writes after its prompt
    result.update(nfe=nfe, row_nfe=row_nfe, tokens_per_call=written / row_nfe if row_nfe else None)
    if judge is not None:
        check_same_vocabulary(run.tokenizer, judge.tokenizer)
        quality = evaluate.generative_perplexity(judge_nll(judge), np.asarray(out.tokens))
        result.update(
            judge_nats_per_char=quality["judge_nats_per_token"] / dataset.chars_per_token,
            entropy_bits=quality["entropy_bits"],
        )
    return result, texts


def split_cpu_for_eval(workdir: str | Path, batch_size: int) -> int:
    """Split this CPU into devices as `sedd train` does (``sedd.sharding.split_cpu``), for batches of batch_size.

    The bound's batches are split by rows over the devices (``Run.place_rows``),
    each row's figures computed as on one device, so the bound is the one
    device's up to the order of its sums, in about the time `sedd train` took
    for it. The run's mesh.cpu_devices decides; auto (0), or a count that does
    not divide batch_size or exceeds the cores, takes the largest divisor of
    batch_size that fits the cores (at most ``MAX_AUTO_CPU_DEVICES``). Before
    any device is used; returns the count set, 0 if none.
    """
    config = runs.read_config(workdir)
    config.training.batch_size = batch_size
    want = config.mesh.cpu_devices
    # A received run's count is not trusted: a huge one would make as many devices, rows that do not divide
    # would run on every device, and a negative one is no reason to refuse the bound.
    if want < 0 or (want > 1 and (want > sharding.available_cores() or batch_size % want)):
        config.mesh.cpu_devices = 0
    return sharding.split_cpu(config)


def eval_data(workdir: str | Path, overrides: list[str]) -> dict:
    """The data section `sedd eval` evaluates on: the run's, with `--config.data.*` overrides, made safe to follow.

    A run directory may come from someone else, and its data.path and
    data.data_dir name files to read and a folder to write token caches in.
    A value the command line does not give is followed only as far as this
    user's own preparation of the data reaches:

    - data.data_dir: the run's when it is a folder owned by this user that
      already holds sedd's preparation of the dataset
      (``<data_dir>/<builder name>``, as `sedd train` leaves it); else this
      user's default (``sedd.data.default_data_dir``), with a warning.
    - data.path: the run's only when that folder holds a preparation of the
      same path (its ``sedd_manifest.json`` names it): the file was read
      before, by this user; else refused, naming the flag that reads it.

    Raises:
      ValueError: the run names a data.path this policy does not follow.
    """
    config = runs.read_config(workdir)
    if overrides:  # --config.data.path=other.txt: the bound on other text, zero-shot
        config = config_lib.override(config, overrides)
    data = config.data.to_dict()
    given = config_lib.given_keys(overrides)
    if data["name"] == "markov":  # drawn from the config's chain: no file is read or written
        return data
    if "data.data_dir" in given:  # before the run is loaded
        check_data_dir(data["data_dir"])
    name = "text" if data["name"] == "shakespeare" and data["path"] else data["name"]
    builder = BUILDERS[name].name if name in BUILDERS else None  # an unknown name is load_dataset's error
    folder = Path(data["data_dir"] or default_data_dir()).expanduser() / str(builder)
    if "data.data_dir" not in given and data["data_dir"] and not (builder and _owned_folder(folder)):
        warnings.warn(
            f"the run's data.data_dir {data['data_dir']!r} holds no preparation of {name!r} of yours; "
            f"using {default_data_dir()} instead (--config.data.data_dir=DIR to choose)",
            stacklevel=2,
        )
        data["data_dir"] = ""
        folder = Path(default_data_dir()).expanduser() / str(builder)
    if data["path"] and "data.path" not in given and not _prepared_from(folder, data["path"]):
        raise ValueError(
            f"the run names data.path={data['path']!r}, which was not prepared in {folder}; sedd eval "
            "reads a file a run names only where this user prepared it before. Pass "
            "--config.data.path=... to evaluate on that file or another"
        )
    return data


def _owned_folder(path: Path) -> bool:
    """Whether path is a folder of this user (any folder where the OS has no owners)."""
    return path.is_dir() and (not hasattr(os, "getuid") or path.stat().st_uid == os.getuid())


def _prepared_from(folder: Path, path: str) -> bool:
    """Whether a preparation in folder (``<config>/<version>/sedd_manifest.json``) read `path`."""
    want = Path(path).expanduser().resolve()
    for manifest in folder.glob(f"*/*/{MANIFEST}") if _owned_folder(folder) else ():
        try:
            if Path(json.loads(manifest.read_text())["path"]).resolve() == want:
                return True
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return False
