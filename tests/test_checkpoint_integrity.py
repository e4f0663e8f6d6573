"""A checkpoint is never lost, never read through a FIFO, and never loaded with other bytes than were saved.

Issue 72: `training.max_to_keep=0` deleted every checkpoint (orbax's LatestN(0));
a FIFO in a checkpoint's folder blocked `sedd sample` and a resume for ever;
64 bytes flipped in a checkpoint's data file loaded silently as other weights.
Each test makes its own copy of the session's tiny run (checkpoints of steps 2 and 4).
"""

import glob
import importlib.util
import json
import os
import shutil
import stat
import threading
import time
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest

from sedd import checkpoints, cli, files, runs


@pytest.fixture
def run_copy(tiny_run, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(tiny_run[0], workdir)
    return workdir


def _one_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith(f"sedd {command}: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.fixture
def unblock():
    """unblock(fifo, original): after 20 s, put the original file back in the FIFO's place and give whoever opened
    the FIFO its end of file, so that a command that opens it goes on (the test then fails on its assertion
    instead of hanging the suite). Cancelled at the test's end."""
    timers = []

    def put_back(fifo, original):
        fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # unblocks an open() waiting on the FIFO
        os.replace(original, fifo)  # later opens read the file
        os.close(fd)  # a reader of the FIFO reads its end

    def start(fifo, original):
        timer = threading.Timer(20, put_back, (fifo, original))
        timer.daemon = True
        timer.start()
        timers.append(timer)

    yield start
    for timer in timers:
        timer.cancel()


# --------------------------------------------------------------------------- max_to_keep


def test_max_to_keep_0_is_refused_before_any_work_and_the_checkpoints_stay(run_copy, tiny_run, capsys):
    """Was: a resume with max_to_keep=0 went from checkpoints ['20'] to [] and exited 0."""
    argv = [
        "train",
        "--config",
        "tiny",
        "--workdir",
        str(run_copy),
        f"--config.data.data_dir={tiny_run[1]}",
        "--config.training.n_iters=6",
        "--config.training.ckpt_every=2",
        "--config.training.eval_every=4",
        "--config.model.n_layers=1",
        "--config.training.max_to_keep=0",
    ]
    assert cli.main(argv) == 2
    assert "training.max_to_keep must be an integer in [1, " in _one_line(capsys, "train")
    assert sorted(os.listdir(run_copy / runs.CHECKPOINTS)) == ["2", "4"]


def test_the_manager_never_deletes_the_newest_checkpoint_whatever_max_to_keep_says(run_copy):
    """The deletion itself: a config that skipped the check (a library caller) still keeps the newest, whole one."""
    config = runs.read_config(run_copy)
    config.training.max_to_keep = 0
    manager = checkpoints.checkpoint_manager(run_copy, config)
    manager.save(6, args=ocp.args.Composite(state=ocp.args.PyTreeSave({"x": np.arange(3.0)})), force=True)
    manager.wait_until_finished()
    assert 6 in manager.all_steps() and (run_copy / runs.CHECKPOINTS / "6").is_dir()  # was: [] on disk


# --------------------------------------------------------------------------- FIFOs in a checkpoint


def _fifo_in_place_of(path, aside) -> str:
    """Move the file at path to `aside` (outside the run) and make a FIFO in its place."""
    shutil.move(path, aside)
    os.mkfifo(path)
    return str(path)


def _largest_data_file(workdir, step: int = 4):
    return max(glob.glob(f"{workdir}/{runs.CHECKPOINTS}/{step}/state/**/d/*", recursive=True), key=os.path.getsize)


@pytest.mark.parametrize("where", ["_CHECKPOINT_METADATA", "state/_METADATA", "data file"])
def test_a_fifo_in_a_checkpoint_is_refused_by_name_before_orbax_reads_it(run_copy, unblock, tmp_path, where):
    """Was: `sedd sample` blocked for ever (orbax opened the FIFO: its manager at start, or the restore)."""
    target = _largest_data_file(run_copy) if where == "data file" else run_copy / runs.CHECKPOINTS / "4" / where
    fifo = _fifo_in_place_of(Path(target), tmp_path / "original")
    unblock(fifo, tmp_path / "original")
    t0 = time.monotonic()
    with pytest.raises(files.UnsafeFile, match="is not a regular file or a folder \\(a FIFO\\)") as e:
        runs.load(run_copy)
    assert fifo in str(e.value) and time.monotonic() - t0 < 15
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # left as it was


def test_a_link_in_a_checkpoint_is_refused_and_a_resume_refuses_it_in_one_line(run_copy, tiny_run, capsys, tmp_path):
    """orbax follows links; a checkpoint holds none (a link out of the run would be read, or written by a resume)."""
    meta = run_copy / runs.CHECKPOINTS / "2" / "_CHECKPOINT_METADATA"
    shutil.move(meta, tmp_path / "elsewhere")
    meta.symlink_to(tmp_path / "elsewhere")
    argv = [
        "train",
        "--config",
        "tiny",
        "--workdir",
        str(run_copy),
        f"--config.data.data_dir={tiny_run[1]}",
        "--config.training.n_iters=6",
        "--config.training.ckpt_every=2",
        "--config.training.eval_every=4",
        "--config.model.n_layers=1",
    ]
    assert cli.main(argv) == 2
    assert f"{meta} is not a regular file or a folder (a symbolic link)" in _one_line(capsys, "train")


# --------------------------------------------------------------------------- checksums


def _flip(path, at: float, n: int = 64) -> None:
    data = bytearray(open(path, "rb").read())
    i = int(len(data) * at)
    data[i : i + n] = bytes(b ^ 0xFF for b in data[i : i + n])
    open(path, "wb").write(bytes(data))


def test_flipped_bytes_in_a_checkpoints_data_never_load_silently(run_copy, tmp_path):
    """Was: 64 bytes flipped in the largest data file loaded as other weights (245 values of a kernel, all
    finite); now each flip is refused at the restore (a SHA-256 of each array, or orbax's own error)."""
    from sedd import train

    trainer = train.Trainer(runs.read_config(run_copy))
    for at in (0.2, 0.4, 0.6, 0.8):  # where the bytes land (which array, compressed how) depends on orbax
        copy = tmp_path / f"flipped{at}"
        shutil.copytree(run_copy, copy)
        _flip(_largest_data_file(copy), at)
        with pytest.raises(RuntimeError, match="could not restore the checkpoint of step 4"):
            checkpoints.restore(checkpoints.checkpoint_manager(copy), trainer.abstract_state, 4)


def _tamper(workdir, step: int, prefix: str = "ema/") -> str:
    """Make one array's saved SHA-256 disagree with its bytes (what flipped bytes in it do), deterministically."""
    path = workdir / runs.CHECKPOINTS / str(step) / files.STEP_METADATA
    meta = json.loads(path.read_text())
    saved = meta["custom_metadata"][files.SAVED_WITH]
    name = sorted(k for k in saved if k.startswith(prefix))[0]
    saved[name]["sha256"] = "0" * 64
    path.write_text(json.dumps(meta))
    return name


def test_a_checkpoint_whose_arrays_differ_from_their_checksum_is_refused_by_name_everywhere(run_copy, capsys):
    """load (sample, eval and serve load through it): refused by name; resume: set aside, the previous one used."""
    from sedd import train

    name = _tamper(run_copy, 4)
    with pytest.raises(RuntimeError, match=f"step 4 .*{name} differs from the SHA-256 saved with it"):
        runs.load(run_copy, step=4)
    with pytest.warns(RuntimeWarning, match=f"skipped the checkpoint of step 4 .*{name} differs from the SHA-256"):
        assert runs.load(run_copy).step == 2
    if importlib.util.find_spec("starlette"):  # sedd serve --step 4: one line, exit 2, before it listens
        from sedd.serve import main as serve_main

        assert serve_main(["--workdir", str(run_copy), "--step", "4"]) == 2
        assert name in _one_line(capsys, "serve")
    trainer = train.Trainer(runs.read_config(run_copy))
    with pytest.warns(RuntimeWarning, match="SHA-256"):  # a resume: moved aside, never deleted
        _, step = checkpoints.restore_newest(
            checkpoints.checkpoint_manager(run_copy), trainer.abstract_state, quarantine=run_copy / train.UNREADABLE
        )
    assert step == 2 and (run_copy / train.UNREADABLE / "4" / files.STEP_METADATA).exists()


def _saved_before_checksums(workdir) -> None:
    """Make each checkpoint of a run one saved before sedd wrote checksums: orbax's step metadata without them."""
    for path in glob.glob(f"{workdir}/{runs.CHECKPOINTS}/*/{files.STEP_METADATA}"):
        meta = json.loads(Path(path).read_text())
        del meta["custom_metadata"][files.SAVED_WITH]
        Path(path).write_text(json.dumps(meta))


def test_a_checkpoint_saved_before_checksums_loads_with_a_note(run_copy):
    _saved_before_checksums(run_copy)
    with pytest.warns(RuntimeWarning, match="holds no SHA-256 of its arrays .*loaded without a check"):
        assert runs.load(run_copy).step == 4


# --------------------------------------------------------------------------- issue 83: checksums that stay, one line


def test_a_checkpoint_saved_with_checksums_loads_only_with_them(run_copy, tmp_path):
    """Was: with sedd_checksums.json removed, flipped bytes loaded with the note "saved before sedd wrote
    checksums". The SHA-256s are now in orbax's step metadata, written in the same rename as the checkpoint
    (nothing beside it to delete); a checkpoint without that metadata, which orbax always writes, is refused.
    A checkpoint of issue 72's sedd (its checksums in sedd_checksums.json) is verified against that file; one
    saved before either loads with its note."""
    step4 = run_copy / runs.CHECKPOINTS / "4"
    meta = json.loads((step4 / files.STEP_METADATA).read_text())
    assert sorted(meta["custom_metadata"][files.SAVED_WITH]) and not (step4 / files.CHECKSUMS).exists()
    copy = tmp_path / "no_metadata"
    shutil.copytree(run_copy, copy)
    (copy / runs.CHECKPOINTS / "4" / files.STEP_METADATA).unlink()
    _flip(_largest_data_file(copy), 0.5, 4)
    with pytest.raises(RuntimeError, match=f"{files.STEP_METADATA} is missing: orbax writes it into every"):
        runs.load(copy, step=4)
    # issue 72's layout: the digests in a file beside orbax's, verified against it, and its note once deleted
    digests = meta["custom_metadata"].pop(files.SAVED_WITH)
    (step4 / files.STEP_METADATA).write_text(json.dumps(meta))
    name = sorted(k for k in digests if k.startswith("ema/"))[0]
    digests[name]["sha256"] = "0" * 64
    (step4 / files.CHECKSUMS).write_text(json.dumps(digests))
    with pytest.raises(RuntimeError, match=f"{name} differs from the SHA-256 saved with it in .*{files.CHECKSUMS}"):
        runs.load(run_copy, step=4)
    (step4 / files.CHECKSUMS).unlink()
    with pytest.warns(RuntimeWarning, match="holds no SHA-256 of its arrays"):
        assert runs.load(run_copy, step=4).step == 4


def _all_checkpoints(workdir, change) -> None:
    for step in (2, 4):
        change(workdir / runs.CHECKPOINTS / str(step))


# A restore refused mid-read leaves TensorStore's reads pending; they finish on a loop orbax has closed ("Event loop is
# closed", reported as unraisable under whichever test runs then): orbax's, harmless here (test_faults.py says more).
CLOSED_LOOP = pytest.mark.filterwarnings(
    "ignore:(?s)Exception ignored in.*Event loop is closed:pytest.PytestUnraisableExceptionWarning"
)


@CLOSED_LOOP
@pytest.mark.parametrize(
    "damage, says",
    [
        (lambda s: (s / "state" / "_METADATA").unlink(), "state/_METADATA is missing: orbax writes it"),
        (lambda s: [os.truncate(f, 100) for f in glob.glob(f"{s}/state/ocdbt.process_0/d/*")], "Exception: "),
    ],
    ids=["state/_METADATA deleted", "a TensorStore read error"],
)
def test_unreadable_checkpoints_are_refused_in_one_line(run_copy, capsys, damage, says):
    """Was: a pytree structure error over five lines, or TensorStore's spec dumped over many."""
    _all_checkpoints(run_copy, damage)
    assert cli.main(["sample", "--workdir", str(run_copy), "--steps", "2", "--num_samples", "1"]) == 2
    err = _one_line(capsys, "sample")
    assert f"no checkpoint in {run_copy / runs.CHECKPOINTS} can be read (step 4: " in err and says in err, err
    assert "TensorStore({" not in err and "See full TensorStore details" not in err


@CLOSED_LOOP
def test_a_layouts_file_nested_200000_deep_is_named_and_timed_again(tiny_spec_run, tmp_path, capsys):
    """Was: "maximum recursion depth exceeded", without the file's name. The reader names the file in one line;
    a run holding such a layouts.json still samples: its layouts are timed again and the file rewritten."""
    deep = tmp_path / "layouts.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ValueError, match=f"{deep} is not JSON: RecursionError") as e:
        files.read_json(deep, 1 << 20)
    assert "\n" not in str(e.value)
    workdir = tmp_path / "spec"
    shutil.copytree(tiny_spec_run, workdir)
    shutil.copy(deep, workdir / "layouts.json")
    assert cli.main(["sample", "--workdir", str(workdir), "--num_samples", "1"]) == 0
    assert f"{workdir / 'layouts.json'} was not a layouts file sedd wrote" in capsys.readouterr().err
    assert isinstance(json.loads((workdir / "layouts.json").read_text()), dict)  # rewritten
