"""Fuzzed prompts through the library and the CLI: every case is a valid sample or a clear error.

Random Unicode (including lone surrogates and characters outside the vocabulary),
empty strings, all-blank templates, prompts at, one under and past the model's
length, infill with prefix, odd blank characters. "Valid" means: the prompt is
kept verbatim where the text says it is, and the sample has the model's length.
"Clear" means a ValueError whose message names the problem. Anything else (another
exception, a hang) fails the test.
"""

import json
import random
import time

import jax
import pytest

from sedd import cli, runs
from sedd.data.tokenizers import EOS_TEXT

CASES = 300
SEED = 20261130


def random_text(rng: random.Random, alphabet: str, n: int) -> str:
    pools = [alphabet, alphabet, alphabet + " \n", "é中\u200b\U0001f600\ufffd\x00\ud800", "_"]
    return "".join(rng.choice(rng.choice(pools)) for _ in range(n))


def random_case(rng: random.Random, alphabet: str, length: int) -> dict:
    """One request: a prefix/suffix pair or an infill template, lengths around the model's."""

    def size():
        return rng.choice(
            [0, 0, 1, 2, rng.randint(0, length), length - 1, length, length + 1, rng.randint(length, 3 * length)]
        )

    if rng.random() < 0.35:
        template = random_text(rng, alphabet, size())
        if rng.random() < 0.3:
            template = "_" * size()  # all blanks
        case = {"infill": template, "blank": rng.choice(["_", "_", "*", "", "ab", "é"])}
        if rng.random() < 0.1:
            case["prefix"] = random_text(rng, alphabet, 2)  # infill with a prefix: refused
        return case
    return {"prefix": random_text(rng, alphabet, size()), "suffix": random_text(rng, alphabet, size())}


def check_sample(text: str, case: dict, length: int, decode_prompt) -> None:
    """A valid sample: the model's length in tokens, the prompt kept verbatim where the case puts it."""
    if case.get("infill"):
        template, blank = case["infill"], case["blank"]
        text = text.replace(EOS_TEXT, "\x00")  # a generated document separator is one position
        assert len(text) == len(template)
        for got, want in zip(text, template):
            assert want == blank or got == want, (text, template)
    else:
        prefix, suffix = decode_prompt(case.get("prefix", "")), decode_prompt(case.get("suffix", ""))
        assert text.startswith(prefix) and text.endswith(suffix), (text, case)


def test_fuzzed_prompts_through_the_library(tiny_run):
    workdir, _ = tiny_run
    run = runs.load(workdir)
    alphabet = "".join(run.tokenizer.chars)
    rng = random.Random(SEED)
    outcomes = {"sample": 0, "error": 0}
    start = time.monotonic()
    for i in range(CASES):
        case = random_case(rng, alphabet, run.seq_len)
        try:
            texts = run.generate(jax.random.key(i), 1, 2, **case)
        except ValueError as e:
            msg = str(e)
            assert len(msg) > 20, (case, msg)  # says what was wrong, not a bare value
            outcomes["error"] += 1
            continue
        assert len(texts) == 1
        check_sample(texts[0], case, run.seq_len, lambda s: run.tokenizer.decode(run.tokenizer.encode(s)) if s else "")
        outcomes["sample"] += 1
    assert time.monotonic() - start < 300, "fuzzing hung or crawled"
    assert outcomes["sample"] > CASES // 4 and outcomes["error"] > CASES // 10, outcomes  # both paths exercised


@pytest.mark.slow  # a fuzz through the command (the library's fuzz above stays): behind -m slow to keep the default suite within 900 CPU s
def test_fuzzed_prompts_through_the_cli(tiny_run, capsys):
    workdir, _ = tiny_run
    alphabet = "".join(runs.load(workdir).tokenizer.chars)
    rng = random.Random(SEED + 1)
    for i in range(24):
        case = random_case(rng, alphabet, 32)
        args = ["sample", "--workdir", str(workdir), "--num_samples", "1", "--steps", "2", "--seed", str(i)]
        for k, v in case.items():
            args += [f"--{k}", v]
        try:
            code = cli.main(args)
        except SystemExit as e:  # argparse: an argument that looks like an option
            code = e.code
        out, err = capsys.readouterr()
        assert code in (0, 2), (case, code, err)
        if code == 0:
            assert "--- sample 0" in out, out
        else:
            assert err.strip() and "Traceback" not in err, (case, err)


def test_samples_written_to_a_file_split_back_into_the_samples(tiny_run, tmp_path, capsys):
    """--output FILE.jsonl: one JSON object per sample, whatever blank lines or separators the samples hold."""
    workdir, _ = tiny_run
    args = ["sample", "--workdir", str(workdir), "--num_samples", "3", "--steps", "2", "--seed", "3"]
    assert cli.main(args) == 0
    printed = [s.split("\n", 1)[1].rstrip("\n") for s in capsys.readouterr().out.split("--- sample ")[1:]]
    assert cli.main(args + ["--output", str(tmp_path / "s.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [r["sample"] for r in rows] == [0, 1, 2]
    assert [r["text"] for r in rows] == [p.split("\n(" + EOS_TEXT)[0] for p in printed]
    assert f"wrote 3 samples to {tmp_path / 's.jsonl'}" in capsys.readouterr().out
