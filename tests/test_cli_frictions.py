"""The command line's small frictions a newcomer met (issue 62, item 5), each held fixed.

- `sedd sample --help` names every registered sampler (it lacked `dilated`);
- `sedd sample --animate` into a file or a pipe writes plain frames, no clear-screen codes;
- `sedd train`'s lines (the `speed:` line among them) land on lines of their own, not inside the progress
  bar's line, where the output goes to a file or a pipe;
- `sedd train`'s closing `sedd sample --prefix` hint prompts with the run's own text, not the plays' "ROMEO:"
  (issue 71: a run of code was told to start its samples with ROMEO:);
- `sedd eval --config.data.path=OTHER` on a text the run's characters cannot write says which characters,
  clipped, and what would work (issue 71: any Markdown file is refused), before anything is prepared from it
  (issue 84); the README's zero-shot line reads a text the package ships;
- `--config tiny` (or `code`) names the shipped config even where the working directory holds a folder of
  that name, as `sedd.config.config_path` reads it (it was refused as "not a regular file").
"""

import io
import re
from pathlib import Path

import pytest
from tqdm.auto import tqdm

from sedd import cli, data, runs, sampling, validate
from sedd import progress
from sedd.data import load_dataset, save_tokenizer

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_sample_help_names_every_registered_sampler(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["sample", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help at spaces
    missing = [name for name in sampling.SAMPLERS if not re.search(rf"\b{name}\b", text)]
    assert not missing, f"`sedd sample --help` does not name {missing}: {text}"


def test_animate_into_a_file_writes_plain_frames(tiny_run, monkeypatch, capsys):
    """Where stdout is not a terminal (capsys's is not), the frames come one after another, labelled, with no
    ANSI escape and no waiting between them."""
    workdir, _ = tiny_run
    waits = []
    monkeypatch.setattr(cli.time, "sleep", waits.append)
    assert not cli.sys.stdout.isatty()
    assert cli.main(["sample", "--workdir", str(workdir), "--num_samples", "1", "--animate"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out, repr(out[:200])
    labels = [line for line in out.splitlines() if re.fullmatch(r"\[step \d+/\d+\]", line)]
    assert labels == [f"[step {k}/8]" for k in range(9)], labels  # the tiny config's 8 steps
    assert waits == []


class _Stream(io.StringIO):
    """A stream that says whether it is a terminal."""

    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def _say_around_a_bar(monkeypatch, tty: bool) -> str:
    """What a shared stdout/stderr shows when `sedd train`'s say speaks between the bar's redraws."""
    stream = _Stream(tty)
    monkeypatch.setattr(progress.sys, "stdout", stream)
    say = progress.BarLines()
    with tqdm(total=30, file=stream, mininterval=0, miniters=1, desc="train", ncols=60) as bar:
        say.bar = bar
        bar.update(15)
        say("speed: 1.7 steps/s (steps 6-15, compilation excluded)")
        bar.update(5)
        say("[step 20] speed: 1.7 steps/s lately")
        say("[step 20] 'a sample'")
        bar.update(10)
    say("after the bar")
    return stream.getvalue()


@pytest.mark.parametrize("tty", [False, True], ids=["file", "terminal"])
def test_train_says_its_lines_on_lines_of_their_own(monkeypatch, tty):
    """Into a file (`sedd train > log 2>&1`, `| tee log`) each line said starts a line and ends it, the bar's
    carriage-return redraws kept off it, and lines said one after another hold no blank between them; on a
    terminal tqdm clears the bar, writes the line and redraws the bar below it."""
    out = _say_around_a_bar(monkeypatch, tty)
    said = [
        "speed: 1.7 steps/s (steps 6-15, compilation excluded)",
        "[step 20] speed: 1.7 steps/s lately",
        "[step 20] 'a sample'",
        "after the bar",
    ]
    physical = out.split("\n")
    for line in said:
        shown = [row.rsplit("\r", 1)[-1] for row in physical if line in row]  # what a terminal leaves of the row
        assert shown == [line], (line, out)
    if not tty:
        for line in said:
            assert line in physical, (line, out)  # its own line in the file: no bar text or \r beside it
        assert f"\n{said[1]}\n{said[2]}\n" in out, out  # one line after another, no blank between
    assert out.index(said[0]) < out.index("20/30") < out.index(said[1]) < out.index("30/30") < out.index(said[3])


CODE = "import os\n\n\ndef parse_header(line):\n    # ROMEO: a name here, not a play\n    return line.split()\n"


@pytest.mark.parametrize(
    "config, files, prefix",
    [
        ("tiny", {"prog.txt": CODE * 20}, "'import os'"),  # the default config on one's own text: its opening
        ("code", {"a.py": CODE * 20, "b.py": CODE}, r"'def parse_header(line):\n    '"),  # a code run: a function body
    ],
    ids=["own-text", "code"],
)
def test_the_closing_hint_prompts_with_the_runs_own_text(config, files, prefix, tmp_path, monkeypatch, capsys):
    """The `more: sedd sample ...` line after training suggests a prefix from the run's data, written so that
    the shell and `--prefix` read it back; the plays' "ROMEO:" only for the plays (these files can write it)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, text in files.items():
        (corpus / name).write_text(text)
    workdir = tmp_path / "run"

    def trained(config, workdir, split_cpu):  # what train.train leaves that the hint reads: the tokenizer
        workdir.mkdir()
        save_tokenizer(load_dataset(config.data).tokenizer, workdir / runs.TOKENIZER)
        bound = {"bits_per_char": 3.0, "nats_per_token": 2.1, "stderr_nats_per_token": 0.01, "exact": False}
        return {"step": 1, "bound": bound, "unigram_entropy_bits": 4.0, "samples": []}

    monkeypatch.setattr(cli.train, "train", trained)
    path = corpus / "prog.txt" if config == "tiny" else corpus
    assert (
        cli.main(
            [
                "train",
                "--config",
                config,
                "--workdir",
                str(workdir),
                f"--config.data.path={path}",
                f"--config.data.data_dir={tmp_path / 'data'}",
            ]
        )
        == 0
    )
    more = [line for line in capsys.readouterr().out.splitlines() if line.startswith("more: ")]
    assert more == [f"more: sedd sample --workdir {workdir} --prefix {prefix} --seed 1"], more
    assert cli.unescape(prefix[1:-1]) in CODE  # read back as the text it was taken from


def test_zero_shot_eval_on_a_text_outside_the_vocabulary_says_what_would_work(tiny_run, tmp_path, capsys):
    workdir, _ = tiny_run
    notes = tmp_path / "notes.md"
    notes.write_text(("# A `sedd eval` of 100% | 50% ~ <b> " + "".join(chr(0x4E00 + i) for i in range(40)) + "\n") * 20)
    assert (
        cli.main(
            [
                "eval",
                "--workdir",
                str(workdir),
                f"--config.data.path={notes}",
                f"--config.data.data_dir={tmp_path / 'data'}",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"sedd eval: error: {notes}: characters ['#', '%', '<', '>', '`', '|', '~', '一'"), err
    assert "... (47 in all)]" in err and chr(0x4E00 + 39) not in err, err  # clipped, with the count
    assert "give it a text made of them" in err and f"sedd train --config.data.path={notes}" in err, err
    assert "preparing" not in capsys.readouterr().out and not list((tmp_path / "data").rglob("*array_record*"))


def test_the_readmes_zero_shot_line_reads_a_text_the_package_ships(tiny_run, tmp_path, capsys):
    """`sedd eval --config.data.path=sedd/data/corpus/cc0.txt --split train`, as the README gives it (from the clone's
    root), on a run of the plays' characters: the bound of CC0's legal English (issue 84: `other.txt` was no file)."""
    workdir, _ = tiny_run
    line = next(x for x in README.read_text().splitlines() if x.startswith("sedd eval ") and "zero-shot" in x)
    path = re.search(r"--config\.data\.path=(\S+)", line)[1]
    assert (ROOT / path).is_file() and (Path(data.__file__).parent / "corpus" / Path(path).name).is_file(), path
    args = ["eval", "--workdir", str(workdir), f"--config.data.path={ROOT / path}", "--split", "train"]
    small = ["--num_t", "2", "--batch_size", "4", "--max_batches", "1", f"--config.data.data_dir={tmp_path}"]
    assert "--split train" in line and cli.main(args + small) == 0, capsys.readouterr().err[-2000:]
    figures = {k.strip(): v for k, v in (x.split(":", 1) for x in capsys.readouterr().out.splitlines() if ":" in x)}
    assert figures["split"].strip() == "train" and float(figures["bits_per_char"]) > 0, figures


def test_a_shipped_configs_name_beside_a_folder_of_that_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "code").mkdir()  # a project's own code/ folder, or a run trained with --workdir tiny
    (tmp_path / "tiny").mkdir()
    (tmp_path / "mine").mkdir()
    for name in ("code", "tiny"):
        validate.check_path("--config", name, "config")
    with pytest.raises(ValueError, match="--config mine is not a regular file"):
        validate.check_path("--config", "mine", "config")
