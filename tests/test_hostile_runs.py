"""Run directories received from someone else (issue 33, findings 4, 7 and 8): each tampering reproduced.

`sedd sample` and `sedd serve` answer a tampered directory with one line and
exit code 2 before anything is built from it; `sedd eval` follows a run's
data paths only where this user prepared that data; a failed token cache
leaves no temporary file.
"""

import json
import shutil
from pathlib import Path
import stat
import threading
import time

import numpy as np
import pytest

from sedd import cli, figures, runs
from sedd.data import CharTokenizer
from sedd.data.text import write_token_cache


@pytest.fixture
def copy_run(tiny_run, tmp_path):
    """A writable copy of the tiny run: (workdir, its config dict)."""
    workdir = tmp_path / "received"
    shutil.copytree(tiny_run[0], workdir)
    return workdir, json.loads((workdir / runs.CONFIG).read_text())


def _set(config: dict, key: str, value) -> dict:
    node = config
    *path, last = key.split(".")
    for part in path:
        node = node[part]
    node[last] = value
    return config


CONFIG_VALUES = [  # (key, value, what the one line says)
    ("model.n_layers", 100_000, "model.n_layers = 100000 is outside [1, 256]"),  # was a hang building shapes
    ("data.seq_len", 10**9, "data.seq_len = 1000000000 is outside [1, 131072]"),  # was an abort inside XLA
    ("data.seq_len", 10**8, "data.seq_len = 100000000 is outside"),  # serve started, then answered 500
    ("model.hidden_size", 2**20, "model.hidden_size = 1048576 is outside"),
    ("model.n_heads", 0, "model.n_heads = 0 is outside [1, 256]"),
    ("sampling.steps", 10**9, "sampling.steps = 1000000000 is outside"),
    ("vocab_size", 10**7, "vocab_size = 10000000 is outside"),
    ("model.n_layers", "2", "model.n_layers = '2' is a str; a run's config holds a int there"),
    ("model.n_layers", True, "model.n_layers = True is a bool"),
    ("model.dropout", "0.1", "model.dropout = '0.1' is a str"),
    ("graph.type", ["absorbing"], "graph.type = ['absorbing'] is a list"),
    ("model.hidden_size", 16384, "make about"),  # every size in bounds, the product not
    ("model.vocab_multiple", 10**9, "model.vocab_multiple = 1000000000 is outside [1, 4096]"),  # a table of 1e9 rows
    ("model.remat", "everything", "remat='everything' must be one of 'none', 'dots', 'layers'"),
]


@pytest.mark.parametrize("key,value,message", CONFIG_VALUES)
def test_a_config_value_out_of_bounds_is_one_line_before_anything_is_built(copy_run, capsys, key, value, message):
    workdir, config = copy_run
    if message == "make about":
        _set(config, "model.n_layers", 256)
    (workdir / runs.CONFIG).write_text(json.dumps(_set(config, key, value)))
    t0 = time.monotonic()
    assert cli.main(["sample", "--workdir", str(workdir), "--steps", "2", "--num_samples", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sedd sample: error: ") and message in err and err.count("\n") == 1, err
    assert time.monotonic() - t0 < 10


BAD_FILES = [  # (file, content or a maker, what the line says)
    (runs.CONFIG, "[1, 2]", "not a list"),
    (runs.CONFIG, "{not json", "not a readable config: JSONDecodeError"),
    (runs.CONFIG, " " * 300_000 + "{}", "at most 262144 are read"),
    (runs.CONFIG, '{"model": ' * 20_000 + "1" + "}" * 20_000, "not a readable config: RecursionError"),
    (runs.CONFIG, b"\xff\xfe{}", "UnicodeDecodeError"),
    (runs.CONFIG, "dir", "is not a regular file"),  # was IsADirectoryError
    (runs.TOKENIZER, "dir", "is not a regular file"),
    (runs.TOKENIZER, "{not json", "not a tokenizer this package can read: JSONDecodeError"),
    (runs.TOKENIZER, "[]", 'a tokenizer is a JSON object with a "name"'),
    (runs.TOKENIZER, '{"name": "nope"}', "unknown tokenizer 'nope'"),
    (runs.TOKENIZER, '{"name": "char", "chars": 5}', "TypeError"),  # was a TypeError traceback
    (runs.TOKENIZER, '{"name": "char"}', "TypeError"),
    (runs.TOKENIZER, '{"name": "markov", "vocab_size": "x"}', "ValueError"),
    (runs.TOKENIZER, '{"name": "gpt2", "path": "/dev/zero"}', "is not a regular file"),  # would read for ever
    (runs.TOKENIZER, "gpt2 garbage", "not a tokenizer this package can read"),  # the tokenizers package's Exception
    (runs.TOKENIZER, "many symbols", "the tokenizer has 369 tokens and the model (config.json vocab_size) 85"),
]


@pytest.mark.parametrize("name,content,message", BAD_FILES, ids=[m[:40] for _, _, m in BAD_FILES])
def test_a_tampered_file_is_one_line_naming_it(copy_run, capsys, tmp_path, name, content, message):
    workdir, _ = copy_run
    target = workdir / name
    if content == "dir":
        target.unlink()
        target.mkdir()
    elif content == "gpt2 garbage":
        (tmp_path / "tokenizer.json").write_text('{"model": {"type": "nonsense"}}')
        target.write_text(json.dumps({"name": "gpt2", "path": str(tmp_path / "tokenizer.json")}))
        pytest.importorskip("tokenizers")
    elif content == "many symbols":  # 368 characters against the model's 85 (was accepted; it wrote garbage)
        target.write_text(json.dumps({"name": "char", "chars": "".join(chr(0x100 + i) for i in range(368))}))
    else:
        target.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert cli.main(["sample", "--workdir", str(workdir), "--steps", "2", "--num_samples", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sedd sample: error: ") and message in err and err.count("\n") == 1, err
    assert str(target) in err


def test_serve_refuses_a_tampered_run_in_one_line(copy_run, capsys):
    pytest.importorskip("starlette")
    from sedd import serve

    workdir, config = copy_run
    (workdir / runs.CONFIG).write_text(json.dumps(_set(config, "data.seq_len", 10**8)))
    assert serve.main(["--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sedd serve: error: ") and "data.seq_len = 100000000 is outside" in err
    assert err.count("\n") == 1


def test_a_bug_in_sedd_still_shows_its_traceback(tiny_run, monkeypatch):
    """Only what a run directory holds becomes one line; an error of sedd's own code is not hidden."""

    def broken(*args, **kwargs):
        raise TypeError("a bug in sedd")

    monkeypatch.setattr(runs, "load", broken)
    with pytest.raises(TypeError, match="a bug in sedd"):
        cli.main(["sample", "--workdir", str(tiny_run[0])])


def test_eval_follows_a_runs_data_paths_only_where_this_user_prepared_them(copy_run, tmp_path, monkeypatch, capsys):
    """Finding 8: `sedd eval` read a local file a run named and wrote its tokens under a folder the run chose."""
    workdir, config = copy_run
    monkeypatch.setenv("SEDD_DATA_DIR", str(tmp_path / "mine"))
    assert figures.eval_data(workdir, []) == config["data"]  # trained here: its prepared data is followed
    secret, elsewhere = tmp_path / "secret.txt", tmp_path / "theirs"
    secret.write_text("the password is hunter2\n" * 50)
    (workdir / runs.CONFIG).write_text(
        json.dumps(_set(_set(config, "data.path", str(secret)), "data.data_dir", str(elsewhere)))
    )
    assert cli.main(["eval", "--workdir", str(workdir), "--num_t", "2", "--max_batches", "1"]) == 2
    err = capsys.readouterr().err
    assert "holds no preparation of 'text' of yours" in err and f"data.path='{secret}'" in err
    assert "--config.data.path=" in err.splitlines()[-1]
    assert not elsewhere.exists() and not (tmp_path / "mine").exists()  # nothing read, nothing written
    # The user names the file: read it, with the caches in the user's own folder (and a warning saying so).
    with pytest.warns(UserWarning, match=f"data_dir '{elsewhere}' holds no preparation of 'text' of yours"):
        data = figures.eval_data(workdir, [f"--config.data.path={secret}"])
    assert data["path"] == str(secret) and data["data_dir"] == ""
    # A received run of the default corpus: its data_dir is replaced by the user's own, with a warning.
    (workdir / runs.CONFIG).write_text(json.dumps(_set(_set(config, "data.path", ""), "data.data_dir", str(elsewhere))))
    with pytest.warns(UserWarning, match="holds no preparation of 'shakespeare' of yours"):
        assert figures.eval_data(workdir, [])["data_dir"] == ""
    assert not elsewhere.exists()


def test_a_failed_token_cache_leaves_no_temporary_file(tmp_path):
    """Finding 8: an error while tokenizing left `train.NNN.tmp.npy` behind."""
    tokenizer = CharTokenizer("ab")
    pieces = [("abab", True), ("abc", True)]  # "c" is not in the vocabulary
    with pytest.raises(ValueError, match="not in the 2-character vocabulary"):
        write_token_cache(tmp_path / "train.npy", iter(pieces), tokenizer)
    assert list(tmp_path.iterdir()) == []
    stats = write_token_cache(tmp_path / "train.npy", iter(pieces[:1]), tokenizer)
    assert stats["tokens"] == 5 and [p.name for p in tmp_path.iterdir()] == ["train.npy"]
    assert np.load(tmp_path / "train.npy").tolist() == [0, 1, 0, 1, 2]


# ------------------------------------------------------------------ issue 72: what a run writes, and its config


def test_every_file_a_run_writes_is_renamed_into_place_never_written_through_a_link_or_a_fifo(tmp_path):
    """Was: a spec run wrote layouts.json.tmp with a plain open: a link planted there made `sedd sample` overwrite
    its target (and a FIFO there blocked it). ``layouts.choose``'s write, with a stand-in sampler."""
    import os

    import jax.numpy as jnp

    from sedd import files
    from sedd.kinds import layouts, spec

    def sample(layout, seed):
        return jnp.zeros((1, 6), jnp.int32), {"nfe_per_sample": np.asarray([3])}

    def choose(workdir):
        return layouts.choose(spec.candidates(2), sample, length=6, batch=1, dtype=jnp.float32, workdir=workdir)

    name = layouts.LAYOUTS_FILE
    run, victim = tmp_path / "run", tmp_path / "victim"
    run.mkdir()
    victim.write_text("the user's")
    (run / (name + ".tmp")).symlink_to(victim)
    choose(run)
    assert victim.read_text() == "the user's" and (run / (name + ".tmp")).is_symlink()
    assert json.loads((run / name).read_text())  # written, a regular file
    (run / name).unlink()
    (run / name).symlink_to(victim)  # read refuses a link out of the run; timed again, written over it
    assert "timed again" in choose(run)[1] and victim.read_text() == "the user's" and not (run / name).is_symlink()
    (run / (name + ".tmp")).unlink()
    os.mkfifo(run / (name + ".tmp"))
    (run / name).unlink()
    timer = threading.Timer(
        20, lambda: os.close(os.open(run / (name + ".tmp"), os.O_RDWR | os.O_NONBLOCK))
    )  # no hang if it opens it
    timer.start()
    choose(run)  # was: blocked for ever opening the FIFO
    timer.cancel()
    assert victim.read_text() == "the user's" and (run / name).is_file()
    assert stat.S_ISFIFO(os.lstat(run / (name + ".tmp")).st_mode)  # never opened, left as it was
    assert sorted(p.name for p in run.iterdir()) == [name, name + ".tmp"]  # no temp left
    (run / "sub").symlink_to(tmp_path)
    with pytest.raises(files.UnsafeFile, match="outside"):  # a folder on the way that leads out of the run
        files.write_text(run / "sub" / "x.json", "{}", run)


@pytest.mark.parametrize("entry", [runs.METRICS, runs.CONFIG])
def test_a_resumed_run_refuses_a_fifo_where_it_appends_or_writes(copy_run, tiny_run, capsys, entry):
    """Was: a FIFO metrics.jsonl blocked `sedd train` for ever on resume (opened for appending)."""
    import os

    workdir, _ = copy_run
    (workdir / entry).unlink(missing_ok=True)
    os.mkfifo(workdir / entry)
    argv = [
        "train",
        "--config",
        "tiny",
        "--workdir",
        str(workdir),
        f"--config.data.data_dir={tiny_run[1]}",
        "--config.training.n_iters=6",
        "--config.training.ckpt_every=2",
        "--config.training.eval_every=4",
        "--config.model.n_layers=1",
    ]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sedd train: error: ") and err.count("\n") == 1 and f"{entry} is not a regular file" in err
    from sedd import files

    with pytest.raises(files.UnsafeFile, match="a FIFO"):  # the appender itself never opens one for good
        files.open_append(workdir / entry, workdir)


@pytest.mark.parametrize("target", [runs.CONFIG, runs.TOKENIZER, "checkpoints/4/_CHECKPOINT_METADATA", "link"])
def test_sample_refuses_an_output_that_is_one_of_the_runs_own_files(copy_run, capsys, tmp_path, target):
    """Was: `sedd sample --workdir RUN --output RUN/config.json` overwrote the run's config (the run then failed)."""
    workdir, _ = copy_run
    output = workdir / target
    if target == "link":  # a link elsewhere that leads to the run's tokenizer
        output = tmp_path / "samples.txt"
        output.symlink_to(workdir / runs.TOKENIZER)
    before = (workdir / runs.CONFIG).read_bytes(), (workdir / runs.TOKENIZER).read_bytes()
    assert cli.main(["sample", "--workdir", str(workdir), "--steps", "2", "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sedd sample: error: --output ") and "inside the run's own" in err and err.count("\n") == 1
    assert ((workdir / runs.CONFIG).read_bytes(), (workdir / runs.TOKENIZER).read_bytes()) == before


TRAIN_VALUES = [  # (override, what the one line says): each refused before anything is allocated or compiled (the
    # bounds before anything is read; the memory, which needs the devices and the vocabulary, once the data is read)
    ("--config.training.batch_size=0", "training.batch_size must be an integer in [1, "),  # was ZeroDivisionError
    ("--config.training.batch_size=-1", "training.batch_size must be an integer in [1, "),  # was: after compiling
    ("--config.training.batch_size=1000000000", "training.batch_size = 1000000000: 1,000,000,000 sequences of"),
    ("--config.training.eval_samples=1000000000", "training.eval_samples must be an integer in [0, 65536]"),
    ("--config.training.eval_samples=60000 --config.data.seq_len=1024", "training.eval_samples = 60000: 60,000 seq"),
    ("--config.data.seq_len=131072", "training.batch_size = 8: 8 sequences of data.seq_len = 131072 tokens"),
    ("--config.data.markov.num_tokens=" + str(10**12), "data.markov.num_tokens = 1000000000000 needs about"),
    ("--config.training.n_iters=0", "training.n_iters must be an integer in [1, "),  # were accepted, no effect
    ("--config.training.n_iters=-5", "training.n_iters must be an integer in [1, "),
    ("--config.training.accum_steps=1000000000", "training.accum_steps = 1000000000 is more than training.n_iters"),
    ("--config.optim.warmup=-1", "optim.warmup must be an integer in [0, "),
    ("--config.optim.grad_clip=-1", "optim.grad_clip must be a finite number in [0, inf] (a global norm; 0 = off)"),
    ("--config.training.max_to_keep=0", "training.max_to_keep must be an integer in [1, "),
    # issue 83: values that passed every check and overflowed, or trained without effect, or were refused late
    ("--config.seed=" + str(10**30), "seed must be an integer in [0, 4294967295] (a uint32: "),  # was OverflowError
    ("--config.seed=-1", "seed must be an integer in [0, 4294967295]"),  # was: after the loop started, unnamed
    ("--config.optim.lr=-1", "optim.lr must be a finite number in (0, inf]"),  # trained
    ("--config.training.ema=1e9", "training.ema must be a finite number in [0, 1)"),  # trained
    ("--config.training.loss_chunk=-1", "training.loss_chunk must be an integer in [0, "),  # trained
    ("--config.optim.beta2=1", "optim.beta2 must be a finite number in [0, 1)"),
    ("--config.mesh.cpu_devices=" + str(10**30), "mesh.cpu_devices must be an integer in [0, 4096]"),  # jaxlib's
    ("--config.sampling.categorical=bogus", "unknown categorical method 'bogus'"),  # was: after training, saved
    ("--config.model.kind=bogus", "unknown model.kind 'bogus'"),  # these four: after the run folder was written
    ("--config.model.remat=bogus", "remat='bogus' must be one of"),
    ("--config.graph.type=bogus", "unknown graph 'bogus'"),
    ("--config.optim.schedule=bogus", "unknown optim.schedule 'bogus'"),
    ("--config.model.draft_head=8", "model.draft_head=8: a model.kind='ddit' run does not read it (it is for"),
    ("--config.model.kind=block --config.training.draft_target=causal", "a model.kind='block' run does not read"),
    ("--config.model.kind=block --config.model.draft_k=8", "model.draft_k=8: a model.kind='block' run does not"),
    ("--config.model.block_size=8", "model.block_size=8: a model.kind='ddit' run does not read it"),
]


@pytest.mark.parametrize(
    "override,message", TRAIN_VALUES, ids=[o.split("=")[0][9:] + "=" + o.split("=")[1][:12] for o, _ in TRAIN_VALUES]
)
def test_every_config_value_that_sizes_an_allocation_is_refused_by_name_before_any_work(
    tiny_run, tmp_path, capsys, override, message
):
    workdir = tmp_path / "run"
    extra = ["--config.data.name=markov"] if "markov" in override else [f"--config.data.data_dir={tiny_run[1]}"]
    assert cli.main(["train", "--config", "tiny", "--workdir", str(workdir), *override.split(), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sedd train: error: ") and message in err, err
    assert err.count("\n") == 1 and not workdir.exists()


def test_the_same_checks_hold_for_a_library_caller_of_train(tmp_path):
    from sedd import config as config_lib
    from sedd import train

    config = config_lib.load_config("tiny", ["--config.training.batch_size=0"])
    with pytest.raises(runs.RunError, match="training.batch_size must be an integer in"):
        train.train(config, tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()


def test_eval_refuses_a_data_dir_that_is_not_a_folder_in_one_line(copy_run, capsys):
    """Was: `sedd eval --config.data.data_dir=/dev/null` ended in a NotADirectoryError traceback."""
    workdir, _ = copy_run
    for data_dir in ("/dev/null", "/dev/null/sub"):
        assert cli.main(["eval", "--workdir", str(workdir), f"--config.data.data_dir={data_dir}"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"sedd eval: error: data.data_dir = '{data_dir}': /dev/null is not a folder"), err
        assert err.count("\n") == 1


def test_long_values_are_clipped_where_a_message_echoes_them(copy_run, capsys, monkeypatch):
    """Was: a 5,000-character SEDD_COMPUTE_DTYPE and an 18 kB list of characters echoed whole (a prompt that long is
    now refused by its length before it is encoded: the characters a short one lacks are one line)."""
    workdir, _ = copy_run
    monkeypatch.setenv("SEDD_COMPUTE_DTYPE", "x" * 5000)
    assert cli.main(["sample", "--workdir", str(workdir), "--steps", "2", "--num_samples", "1"]) == 2
    err = capsys.readouterr().err
    assert "SEDD_COMPUTE_DTYPE='xxx" in err and "(5," in err and len(err) < 1100 and err.count("\n") == 1, err[:300]
    monkeypatch.delenv("SEDD_COMPUTE_DTYPE")
    strange = "".join(chr(0x4E00 + i) for i in range(30))  # none of them in the run's 84 characters (a longer
    # prompt is refused by its length before it is encoded)
    assert (
        cli.main(["sample", "--workdir", str(workdir), "--steps", "2", "--num_samples", "1", "--prefix", strange]) == 2
    )
    err = capsys.readouterr().err
    assert "are not in the" in err and len(err) < 1100 and err.count("\n") == 1, len(err)


def test_a_code_corpus_whose_walk_meets_a_vanished_folder_is_read_not_taken_as_gone(tmp_path, monkeypatch):
    """Was: a folder that vanished during the walk (a /proc entry) made the whole corpus "gone": "/ is gone: using
    the data prepared from it on ...". The folder is skipped with a note; the rest is read."""
    import os
    import warnings

    from sedd.data import sources

    corpus = tmp_path / "corpus"
    (corpus / "pkg").mkdir(parents=True)
    (corpus / "proc" / "1234").mkdir(parents=True)
    for name in ("a.py", "b.py", "pkg/c.py"):
        (corpus / name).write_text(f"x = {len(name)}\n")
    vanished = str(corpus / "proc" / "1234")
    real = os.scandir

    def scandir(path="."):
        if os.fspath(path) == vanished:
            raise FileNotFoundError(2, "No such file or directory", vanished)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.warns(UserWarning, match="proc/1234/ \\(not listed: No such file or directory\\)"):
        found = sources.list_sources(corpus)
    assert [f.relative_to(corpus).as_posix() for f in found] == ["a.py", "b.py", "pkg/c.py"]
    # With an earlier preparation of the same corpus on disk, the builder reads the files, not the preparation.
    data_dir = tmp_path / "data"
    with pytest.warns(UserWarning, match="not listed"):
        key = sources.SourceCode(path=str(corpus), data_dir=str(data_dir)).key
    old = data_dir / sources.SourceCode.name / f"{key}_00000000" / str(sources.SourceCode.VERSION)
    old.mkdir(parents=True)
    (old / "sedd_manifest.json").write_text(json.dumps({"prepared": "yesterday", "files": ["a.py"]}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        builder = sources.SourceCode(path=str(corpus), data_dir=str(data_dir))
    assert not any("is gone" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert len(builder.files) == 3


# --------------------------------------------------------------------------- a spec run's options and keys


def test_a_moved_keys_old_key_given_alone_is_refused_naming_the_new_one():
    """`--config.model.block_size=8` on a new spec run trained at draft_k 4 without a word: its drafts a round
    moved to model.draft_k, so the old key alone is refused, naming it; both, or the new one, are read."""
    from sedd import config as config_lib

    with pytest.raises(
        ValueError,
        match=r"--config.model.block_size is not what a model.kind='spec' run reads: its "
        r"meaning moved to model.draft_k \(give --config.model.draft_k=8\)",
    ):
        config_lib.load_config("tiny", ["--config.model.kind=spec", "--config.model.block_size=8"])
    assert config_lib.load_config("tiny", ["--config.model.kind=spec", "--config.model.draft_k=8"]).model.draft_k == 8
    assert config_lib.load_config("tiny", ["--config.model.kind=block", "--config.model.block_size=8"])


def test_a_run_saved_before_a_key_moved_resumes_with_its_value_there(tmp_path):
    """An old spec run (model.block_size 8, no draft_k) is its draft_k 8: resumed at draft_k 8 it is accepted, at 4
    (today's default) it is refused as the change it is, "saved 8, now 4"."""
    from sedd import config as config_lib

    old = config_lib.load_config("tiny", ["--config.model.kind=spec"]).to_dict()
    del old["model"]["draft_k"]
    old["model"]["block_size"] = 8
    (tmp_path / runs.CONFIG).write_text(json.dumps(old))
    runs.check_compatible(
        tmp_path, config_lib.load_config("tiny", ["--config.model.kind=spec", "--config.model.draft_k=8"])
    )
    with pytest.raises(ValueError, match=r"model.draft_k: saved 8, now 4"):
        runs.check_compatible(tmp_path, config_lib.load_config("tiny", ["--config.model.kind=spec"]))


@pytest.fixture
def copy_spec_run(tiny_spec_run, tmp_path):
    workdir = tmp_path / "spec"
    shutil.copytree(tiny_spec_run, workdir)
    return workdir


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--layout", "1,1", "--draft_k", "2"], "draft_k=2: this run drafts 1 token a round in its layout"),
        (["--layout", "1_0"], "layout='1_0' must be 'K' or 'K,GROUPS'"),
        (["--max_length", "64"], "takes no option max_length"),
        (["--stop"], "takes no option stop"),
        (["--animate"], "takes no option return_trajectory"),
    ],
)
def test_a_spec_runs_options_are_refused_before_any_layout_is_timed(copy_spec_run, capsys, argv, says):
    """What a spec run cannot take is one line, before any timing (the first sample timed seven layouts for about
    a minute, then refused --max_length, --stop, --animate with layouts.json written; --layout 1,1 --draft_k 4 drew
    at k = 1): nothing timed, nothing written."""
    t = time.perf_counter()
    assert cli.main(["sample", "--workdir", str(copy_spec_run), "--num_samples", "1", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not (copy_spec_run / "layouts.json").exists() and time.perf_counter() - t < 30


def test_serve_takes_a_spec_runs_draft_k_only_as_its_layouts_k(copy_spec_run, capsys):
    """`sedd serve --layout 1,1` took --draft_k 1 and 4 alike: the k of another layout is refused before it
    listens, in one line."""
    import servers
    from sedd import serve

    port = str(servers.free_port())
    assert serve.main(["--workdir", str(copy_spec_run), "--layout", "1,1", "--draft_k", "2", "--port", port]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "draft_k=2: this run drafts 1 token a round in its layout" in err, err


def test_a_layouts_file_naming_a_layout_the_run_does_not_time_is_timed_again_and_rewritten(copy_spec_run, capsys):
    """Issue 83, finding 1: layouts.json naming "8,1" (stored by a `--draft_k 8` of a run trained at k = 4) or
    "64,65" for this device made every later `sedd sample` and `sedd serve` exit 2 until a person deleted it. An
    entry that is not one of the run's own candidates is timed again and rewritten; the run samples."""
    import jax.numpy as jnp

    from sedd.kinds import layouts, spec

    where = layouts.device_key(jnp.float32, 1)
    path, own = copy_spec_run / layouts.LAYOUTS_FILE, {lay.name for lay in spec.candidates(2)}
    for bad in ("8,1", 7):  # what --draft_k 8 stored; not a layout at all (tests/test_layouts.py: the others)
        path.write_text(json.dumps({where: {"layout": bad}}))
        assert cli.main(["sample", "--workdir", str(copy_spec_run), "--num_samples", "1"]) == 0
        assert "timed again" in capsys.readouterr().err
        assert json.loads(path.read_text())[where]["layout"] in own
    assert cli.main(["sample", "--workdir", str(copy_spec_run), "--num_samples", "1"]) == 0
    assert "chosen earlier on this device" in capsys.readouterr().err


@pytest.fixture
def copy_head_run(tmp_path):
    """A writable copy of tests/fixtures/spec_head_run: an AR run with a draft head, k = 3, 16 tokens."""
    workdir = tmp_path / "head"
    shutil.copytree(Path(__file__).parent / "fixtures" / "spec_head_run", workdir)
    return workdir


@pytest.mark.parametrize(
    "run, argv, says",
    [
        ("spec", ["--draft_k", "8"], "draft_k=8: k=8 must be in [1, 2] (model.draft_k = 2"),
        ("spec", ["--layout", "64"], "layout='64': k=64 must be in [1, 2]"),
        ("head", ["--draft_k", "64"], "draft_k=64: this run's draft head drafts k in [0, 3] a round"),
        ("head", ["--layout", "64"], "layout='64': this run's draft head drafts k in [0, 3] a round"),
        ("head", ["--layout", "2,1"], "layout='2,1' must be 'K'"),
    ],
)
def test_a_draft_k_or_layout_past_the_runs_k_is_refused_before_anything_is_timed_or_stored(
    copy_spec_run, copy_head_run, capsys, run, argv, says
):
    """Issue 83, finding 1: `--draft_k 8` on a run trained at k = 4 exited 0 and stored "8,1"; `--layout 64` on a
    32-token head run drew 65 positions a call. A value given for one call is checked against the run's trained k
    (at most its length) first: one line, nothing timed, nothing stored."""
    workdir = copy_spec_run if run == "spec" else copy_head_run
    t = time.perf_counter()
    assert cli.main(["sample", "--workdir", str(workdir), "--num_samples", "1", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not (workdir / "layouts.json").exists() and time.perf_counter() - t < 30


def test_a_draft_k_within_the_runs_k_samples_as_asked_and_stores_nothing(copy_head_run, capsys):
    assert cli.main(["sample", "--workdir", str(copy_head_run), "--num_samples", "1", "--draft_k", "2"]) == 0
    assert "layout k=2 from the draft head (3 positions a call), as asked" in capsys.readouterr().err
    assert not (copy_head_run / "layouts.json").exists()
