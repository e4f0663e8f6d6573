"""Faults a run survives: a corrupt checkpoint, a full disk, a NaN, a changed config, Ctrl-C twice.

The repeated SIGKILL trials are `experiments/faults.py` (docs/reliability.md);
these are the fast, deterministic cases.
"""

import json
import logging
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sedd import checkpoints, runs
from sedd import config as config_lib
from sedd import train as train_lib

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))


def tiny(data_dir, **overrides):
    """The tiny config of one block (faults do not depend on depth; the programs compile ~25% faster)."""
    overrides = {"data.data_dir": data_dir, "training.eval_samples": 0, "model.n_layers": 1, **overrides}
    return config_lib.load_config("tiny", [f"--config.{k}={v}" for k, v in overrides.items()])


def saved_state(workdir) -> dict:
    """The whole train state of the newest checkpoint of a run directory."""
    trainer = train_lib.Trainer(runs.read_config(workdir))
    return checkpoints.restore(checkpoints.checkpoint_manager(workdir), trainer.abstract_state)


def assert_trees_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def straight(data_dir, tmp_path_factory):
    """An uninterrupted tiny run of 6 steps, checkpoints at 2, 4, 6 (the newest two kept)."""
    workdir = tmp_path_factory.mktemp("straight") / "run"
    train_lib.train(
        tiny(data_dir, **{"training.n_iters": 6, "training.ckpt_every": 2}), workdir, quiet=True, final=False
    )
    return workdir


def test_truncated_newest_checkpoint_is_set_aside_and_the_run_resumes_from_the_previous(straight, tmp_path):
    """(Overwritten checkpoints: test_train.py's sampling case and the test below.)"""
    workdir = tmp_path / "run"
    shutil.copytree(straight, workdir)
    for f in (workdir / "checkpoints" / "6").rglob("*"):
        if f.is_file():  # a write cut short
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    config = runs.read_config(workdir)

    with pytest.warns(RuntimeWarning, match=r"skipped the checkpoint of step 6 .* Using step 4"):
        result = train_lib.train(config, workdir, quiet=True)
    assert result["step"] == 6
    assert (workdir / train_lib.UNREADABLE / "6").is_dir()  # kept for inspection, never deleted
    # Steps 5 and 6 were trained again from step 4's state: the same parameters as the straight run's.
    assert_trees_equal(saved_state(workdir), saved_state(straight))


def test_no_readable_checkpoint_is_a_clear_error_and_touches_nothing(straight, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(straight, workdir)
    for f in (workdir / "checkpoints").rglob("*"):
        if f.is_file() and f.stat().st_size > 1000:
            f.write_bytes(b"")
    before = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))
    with pytest.raises(
        RuntimeError, match=r"no checkpoint in .* can be read \(step 6: .*; step 4: .*\)\. The run"
    ) as e:
        train_lib.train(runs.read_config(workdir), workdir, quiet=True)
    assert "\n" not in str(e.value)  # one line (was: a line per checkpoint, each error over several)
    assert sorted(p.relative_to(workdir) for p in workdir.rglob("*")) == before


def test_full_disk_before_a_save_keeps_the_previous_checkpoint_and_says_so(data_dir, tmp_path, monkeypatch):
    """The free space is checked before each save (here the disk reports too little from the second save on)."""
    workdir = tmp_path / "run"
    calls = []

    def disk_usage(path):  # the checkpoints' disk: roomy at the first save only (the data's, prepared here
        if str(workdir) in str(path):  # when this test runs alone, always roomy)
            calls.append(path)
        usage = (
            shutil._ntuple_diskusage(10**9, 10**9, 10**9)
            if len(calls) <= 1
            else (shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
        )
        return usage

    monkeypatch.setattr(train_lib.shutil, "disk_usage", disk_usage)
    with pytest.raises(RuntimeError, match=r"the disk is full .* the newest is step 2\. Free some space"):
        train_lib.train(tiny(data_dir, **{"training.n_iters": 6, "training.ckpt_every": 2}), workdir, quiet=True)
    assert checkpoints.checkpoint_manager(workdir).all_steps() == [2]
    assert runs.load(workdir).step == 2


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    try:
        return (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
            ).returncode
            == 0
        )
    except OSError:
        return False


# orbax's commit thread runs its writes on an asyncio loop of its own and closes that loop when a write fails;
# tensorstore's writes still in flight then finish on tensorstore's threads and post their results to the closed
# loop ("RuntimeError: Event loop is closed", reported as unraisable: orbax's, not ours, and harmless here).
@pytest.mark.filterwarnings(
    "ignore:(?s)Exception ignored in.*Event loop is closed:pytest.PytestUnraisableExceptionWarning"
)
def test_a_really_full_disk_during_a_save(data_dir, tmp_path, monkeypatch, capfd, caplog):
    """A small tmpfs that fills up inside orbax's write (the free-space check is told there is room). Issue 83:
    orbax's writer threads printed their tracebacks and an error log above the refusal, and left the step's
    temporary folder."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "1200k"):
        pytest.skip("mounting a tmpfs needs root")
    try:
        monkeypatch.setattr(train_lib.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 0, 10**9))
        with pytest.raises(
            RuntimeError, match=r"the disk is full \(no space left on device\)\. .* newest is step (\d)"
        ) as e:
            train_lib.train(
                tiny(data_dir, **{"training.n_iters": 6, "training.ckpt_every": 2}), disk / "run", quiet=True
            )
        # Where 1200k fills up (at step 4's save or step 6's) depends on how well orbax compresses the
        # weights; the error names the newest checkpoint on disk, and that one reads whole.
        newest = int(re.search(r"newest is step (\d)", str(e.value)).group(1))
        assert newest in (2, 4) and runs.load(disk / "run").step == newest
        assert not list((disk / "run" / "checkpoints").glob("*.orbax-checkpoint-tmp*"))  # the partial copy: gone
        assert "Traceback" not in capfd.readouterr().err
        assert not [r.getMessage()[:200] for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def test_nan_at_step_k_stops_naming_it_and_no_non_finite_state_is_saved(data_dir, tmp_path, monkeypatch):
    k = 6
    train_step = train_lib.Trainer._train_step
    loss = train_lib.Trainer._loss
    traced_step = {}

    def poisoned_step(self, state, batch):  # remember the traced step, for the loss below
        traced_step["step"] = state["step"]
        return train_step(self, state, batch)

    def poisoned_loss(self, params, key, batch, train):
        mean, per_seq = loss(self, params, key, batch, train)
        if not train:
            return mean, per_seq
        nan = jnp.where(traced_step["step"] + 1 == k, jnp.nan, 0.0)  # the k-th step (1-based) is NaN
        return mean + nan, per_seq + nan

    monkeypatch.setattr(train_lib.Trainer, "_train_step", poisoned_step)
    monkeypatch.setattr(train_lib.Trainer, "_loss", poisoned_loss)
    config = tiny(data_dir, **{"training.n_iters": 10, "training.ckpt_every": 4, "training.log_every": 1})
    with pytest.raises(
        FloatingPointError,
        match=rf"non-finite loss or gradient at step {k}; .* "
        r"The last checkpoint is step 4",
    ):
        train_lib.train(config, tmp_path / "run", quiet=True)
    assert checkpoints.checkpoint_manager(tmp_path / "run").all_steps() == [4]
    state = saved_state(tmp_path / "run")  # restore() refuses non-finite values
    assert int(state["step"]) == 4


@pytest.mark.parametrize("bad", [jnp.nan, -jnp.inf])
def test_a_checkpoint_holding_a_non_finite_value_is_refused(tmp_path, bad):
    import orbax.checkpoint as ocp

    state = {"ema": {"w": jnp.ones((3, 4)).at[2, 1].set(bad), "b": jnp.zeros(4)}, "step": jnp.int32(7)}
    manager = checkpoints.checkpoint_manager(tmp_path, config_lib.load_config("tiny"))
    manager.save(7, args=ocp.args.Composite(state=ocp.args.PyTreeSave(state)), force=True)
    manager.wait_until_finished()
    assert (
        checkpoints.restore(checkpoints.checkpoint_manager(tmp_path), {"step": state["step"]})["step"] == 7
    )  # only the step
    with pytest.raises(RuntimeError, match="step 7 .* non-finite values, which training never saves"):
        checkpoints.restore(checkpoints.checkpoint_manager(tmp_path), state)


def test_resume_refuses_a_changed_config_naming_the_keys_but_allows_what_may_change(tmp_path):
    config = config_lib.load_config("tiny")
    (tmp_path / runs.CONFIG).write_text(config_lib.to_json(config))
    runs.check_compatible(
        tmp_path,
        config_lib.load_config(
            "tiny",
            [
                "--config.training.n_iters=99",
                "--config.training.ckpt_every=3",
                "--config.sampling.steps=7",
                "--config.mesh.data=1",
                f"--config.data.data_dir={tmp_path}",
                "--config.model.dtype=bfloat16",
            ],
        ),
    )
    changed = config_lib.load_config("tiny", ["--config.optim.lr=0.1", "--config.data.seq_len=16"])
    with pytest.raises(ValueError) as e:
        runs.check_compatible(tmp_path, changed)
    msg = str(e.value)
    assert "data.seq_len: saved 32, now 16" in msg and "optim.lr: saved 0.002, now 0.1" in msg
    assert "training.n_iters" in msg  # the keys that may change are listed
    # A run written before a key existed: the key counts as its shipped default.
    saved = json.loads((tmp_path / runs.CONFIG).read_text())
    del saved["model"]["time_conditioning"]
    (tmp_path / runs.CONFIG).write_text(json.dumps(saved))
    runs.check_compatible(tmp_path, config)
    with pytest.raises(ValueError, match=r"model.time_conditioning: saved True, now False"):
        runs.check_compatible(tmp_path, config_lib.load_config("tiny", ["--config.model.time_conditioning=False"]))
    # ... unless such runs did something else: the plain AdamW of runs before optim.adaln_lr_scale.
    del saved["optim"]["adaln_lr_scale"]
    (tmp_path / runs.CONFIG).write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"optim.adaln_lr_scale: saved 1.0, now 0.1"):
        runs.check_compatible(tmp_path, config)
    runs.check_compatible(tmp_path, config_lib.load_config("tiny", ["--config.optim.adaln_lr_scale=1.0"]))
    # ... and the uniform t of runs before training.t_power.
    del saved["training"]["t_power"]
    (tmp_path / runs.CONFIG).write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"training.t_power: saved 0.0, now 0.5"):
        runs.check_compatible(tmp_path, config_lib.load_config("tiny", ["--config.optim.adaln_lr_scale=1.0"]))
    old = ["--config.optim.adaln_lr_scale=1.0", "--config.training.t_power=0.0"]
    runs.check_compatible(tmp_path, config_lib.load_config("tiny", old))
    # ... and the AdamW of runs before optim.optimizer (the muon_lr_scale they never read counts as shipped).
    del saved["optim"]["optimizer"], saved["optim"]["muon_lr_scale"]
    (tmp_path / runs.CONFIG).write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"optim.optimizer: saved 'adamw', now 'muon'"):
        runs.check_compatible(tmp_path, config_lib.load_config("tiny", old))
    runs.check_compatible(tmp_path, config_lib.load_config("tiny", [*old, "--config.optim.optimizer=adamw"]))


def test_ctrl_c_is_answered_at_once_and_a_second_one_does_not_interrupt_the_save(data_dir, tmp_path):
    """Signals sent to a real `sedd train` process, as a user's Ctrl-C would be."""
    workdir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "sedd.cli",
        "train",
        "--config",
        "tiny",
        "--workdir",
        str(workdir),
        f"--config.data.data_dir={data_dir}",
        "--config.training.n_iters=100000",
        "--config.training.log_every=1",
        "--config.training.eval_every=100000",
        "--config.training.ckpt_every=100000",
        "--config.model.n_layers=1",
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), line) for line in proc.stdout))
    reader.start()
    metrics = workdir / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        time.sleep(0.05)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 0
    reader.join()
    out = "".join(line for _, line in lines)
    answer = [t for t, line in lines if line.startswith("Ctrl-C: saving a checkpoint")]
    assert answer and answer[0] - sent < 5.0, out  # answered at once (not after the step or a compile)
    assert "Traceback" not in out, out  # the second Ctrl-C came during the save, or after it: never a traceback
    stopped = int(out.split("stopped at step ")[1].split(";")[0])
    assert checkpoints.checkpoint_manager(workdir).all_steps() == [stopped]
    assert max(json.loads(line)["step"] for line in metrics.read_text().splitlines()) == stopped  # nothing lost


@pytest.mark.slow
def test_fault_injection_script_end_to_end(tmp_path):
    """`experiments/faults.py` with one trial of each fault (minutes; `pytest -m slow`)."""
    out = tmp_path / "table.md"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "faults.py"), "--trials", "1", "--steps", "12", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and "fault" not in line]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert len(rows) == 8 and all(c[1] == c[2] or "skipped" in c[2] for c in cells), rows  # trials == survived
