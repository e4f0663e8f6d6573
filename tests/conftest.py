"""Fixtures shared by test modules."""

import os
import shutil
import tempfile

import jax
import pytest

from sedd import config as config_lib
from sedd import train


def _pin_xdist_worker() -> None:
    """Give each pytest-xdist worker a core of its own when there are at least as many workers as cores.

    XLA's CPU client sizes its thread pools by the cores a process may run on: two workers each spreading
    their compilations and tiny programs over every core spend CPU handing work between threads. Pinned
    before jax creates its backend (at the first computation, not at import); the `sedd` subprocesses a
    worker starts inherit its core.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")) >= len(cores) > 1:
        os.sched_setaffinity(0, {cores[int(worker[2:]) % len(cores)]})


_pin_xdist_worker()

# One persistent XLA compilation cache for the session, shared with the `sedd`
# subprocesses the CLI tests start (they inherit the environment): the same
# tiny programs are compiled by many tests, and on 2 CPU cores compiling is
# most of a tiny test's time. A fresh folder per session, so nothing is
# reused across code changes.
# With pytest-xdist the workers inherit the controller's folder (the environment), so they share it too.
_OWN = "SEDD_TEST_XLA_CACHE" not in os.environ
_CACHE = os.environ.setdefault("SEDD_TEST_XLA_CACHE", tempfile.mkdtemp(prefix="sedd-test-xla-cache-"))
# And XLA's cheaper compilation for the tests (and, through the environment, their subprocesses): the
# programs here are tiny, so compiling is their cost, and every figure a test compares is computed under the
# same flags. The backend's optimisation level 0 took about 30% off test_train.py's time; XLA CPU's older
# loop emitters instead of its fusion emitters then halve the backend's compile time (test_train.py's 203
# compilations: 46.5 s -> 25.3 s, jax.monitoring's backend_compile_duration; its wall 81 s -> 60 s).
# Set before the first computation creates the backend.
_TEST_FLAGS = ["--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false"]
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):  # an xdist worker has them
    os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""), *_TEST_FLAGS]))
os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.2"
jax.config.update("jax_compilation_cache_dir", _CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop jax's in-memory compiled programs after each test file (the persistent cache above keeps them).

    Each compiled CPU program holds memory maps of its own, and the suite compiles thousands: kept all
    session, one process passed 63,000 maps, and past the kernel's vm.max_map_count (65,530 by default)
    XLA aborts or segfaults in the next compilation (in tests/test_serve.py, late in the run).
    """
    yield
    jax.clear_caches()


def pytest_sessionfinish(session, exitstatus):
    if _OWN:
        shutil.rmtree(_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A `tiny` run of one block trained for 4 steps, checkpoints at steps 2 and 4: (workdir, data_dir).

    Read-only for its users: trained once per session. One block: its users test runs, prompts, serving and
    hostile input, none of which depends on depth, and every program they compile is ~25% smaller (the
    model's own tests use two or more).
    """
    tmp = tmp_path_factory.mktemp("tiny_run")
    config = config_lib.load_config(
        "tiny",
        [
            f"--config.data.data_dir={tmp / 'data'}",
            "--config.training.n_iters=4",
            "--config.training.ckpt_every=2",
            "--config.training.eval_every=4",
            "--config.model.n_layers=1",
        ],
    )
    train.train(config, tmp / "run", quiet=True, final=False)
    return tmp / "run", str(tmp / "data")


@pytest.fixture(scope="session")
def tiny_spec_run(tiny_run, tmp_path_factory):
    """A `tiny` spec run (model.draft_k = 2) of one block trained for 2 steps on tiny_run's data: its workdir.

    Read-only for its users (copy it to change it).
    """
    tmp = tmp_path_factory.mktemp("tiny_spec_run")
    config = config_lib.load_config(
        "tiny",
        [
            f"--config.data.data_dir={tiny_run[1]}",
            "--config.model.kind=spec",
            "--config.model.draft_k=2",
            "--config.model.n_layers=1",
            "--config.training.n_iters=2",
            "--config.training.ckpt_every=2",
            "--config.training.eval_every=2",
            "--config.training.eval_samples=0",
        ],
    )
    train.train(config, tmp / "run", quiet=True, final=False)
    return tmp / "run"


@pytest.fixture(scope="session")
def gpt2_files(tmp_path_factory):
    """A byte-level BPE trained here, saved in GPT-2's layout (vocab.json + merges.txt)."""
    tokenizers = pytest.importorskip("tokenizers")
    folder = tmp_path_factory.mktemp("gpt2")
    bpe = tokenizers.ByteLevelBPETokenizer()
    texts = ["the cat sat on the mat, and the dog ate the bone.", "Zoë's café — “naïve” 1,234 times!\n"] * 50
    bpe.train_from_iterator(
        texts, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"], show_progress=False
    )
    bpe.save_model(str(folder))
    return folder
