"""Hostile input, second round (issue 53): each finding reproduced with a file or request the test writes.

Finding 2: a received run resumed never writes outside itself. Finding 7 and
the table-driven test: every number and path of every `sedd` subcommand is
checked before any work. Finding 1: a tokenizer with a catastrophic regex.
Findings 4 and 6: sizes and values of a received run's config. Finding 3:
streams nobody reads.
"""

import json
import os
import shutil

import pytest

from sedd import cli, runs


def _tiny_args(data_dir: str) -> list[str]:
    """The command line of the session's tiny run (tests/conftest.py)."""
    return ["--config", "tiny", f"--config.data.data_dir={data_dir}", "--config.training.n_iters=4",
            "--config.training.ckpt_every=2", "--config.training.eval_every=4", "--config.model.n_blocks=1"]


def _listing(folder) -> list:
    return sorted((str(p.relative_to(folder)), p.stat().st_size) for p in folder.rglob("*"))


# --------------------------------------------------------------------------- finding 2: resume stays inside the run


@pytest.fixture
def received(tiny_run, tmp_path):
    """A copy of the tiny run whose newest checkpoint (4) is corrupt and holds a planted file; and a folder outside."""
    workdir = tmp_path / "received"
    shutil.copytree(tiny_run[0], workdir)
    for f in (workdir / runs.CHECKPOINTS / "4").rglob("*"):
        if f.is_file():
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    (workdir / runs.CHECKPOINTS / "4" / "planted.txt").write_text("planted")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "mine.txt").write_text("the user's own file")
    return workdir, outside, tiny_run[1]


@pytest.mark.parametrize("link", ["checkpoints_unreadable", "checkpoints/4", "metrics.jsonl"])
def test_a_resumed_run_whose_special_entries_are_links_is_refused_and_nothing_outside_changes(received, capsys,
                                                                                              link):
    workdir, outside, data_dir = received
    target = outside
    if link == "checkpoints/4":  # the checkpoint itself a link: orbax would read, delete or move through it
        shutil.copytree(workdir / link, outside / "4")
        shutil.rmtree(workdir / link)
        target = outside / "4"
    elif link == "metrics.jsonl":  # appended to by training
        (workdir / link).unlink()
        target = outside / "mine.txt"
    os.symlink(target, workdir / link)
    before, inside = _listing(outside), _listing(workdir)
    assert cli.main(["train", "--workdir", str(workdir), *_tiny_args(data_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sedd train: error: ") and "is a symbolic link" in err and err.count("\n") == 1, err
    assert _listing(outside) == before and (outside / "mine.txt").read_text() == "the user's own file"
    assert _listing(workdir) == inside


def test_the_quarantine_move_never_follows_a_link_out_of_the_run(received):
    """The library call: restore_newest with a quarantine folder that is a link refuses, nothing moved."""
    workdir, outside, _ = received
    os.symlink(outside, workdir / "checkpoints_unreadable")
    before = _listing(outside)
    with pytest.raises(runs.RunError, match="is a symbolic link"):
        runs.move_inside(workdir / runs.CHECKPOINTS / "4", workdir / "checkpoints_unreadable")
    with pytest.raises(runs.RunError, match="not a folder of the run directory"):
        runs.move_inside(workdir / runs.CHECKPOINTS / "4", outside / "sub")
    assert _listing(outside) == before and (workdir / runs.CHECKPOINTS / "4" / "planted.txt").exists()
    (workdir / "checkpoints_unreadable").unlink()  # a real folder: the move happens, inside the run
    dest = runs.move_inside(workdir / runs.CHECKPOINTS / "4", workdir / "checkpoints_unreadable")
    assert dest == workdir / "checkpoints_unreadable" / "4" and (dest / "planted.txt").exists()
