"""Drafting as one concept: every way in (the library, `sedd sample --draft`, `sedd serve --draft`) says the same.

The draft-vocabulary check and the bound on draft_k live once, in the drafter
(``sedd.drafts.Drafter.checked``): a run of another vocabulary, k = 0, k = 65
(past ``sedd.speculative.MAX_DRAFTS``) and k = b + 1 for a block drafter of
block size b are refused with one message, whichever way they come.
draft_k is a server's option, not a request's: a server is refused at its
start, before any `POST /v1/completions`.
"""

import jax
import pytest

from sedd import cli, config as config_lib, drafts, runs, speculative, train


def _train(tmp, name: str, *overrides: str):
    """A tiny one-block run trained for 2 steps: its directory."""
    config = config_lib.load_config(
        "tiny",
        [
            f"--config.data.data_dir={tmp / 'data'}",  # one corpus prepared once
            "--config.training.n_iters=2",
            "--config.training.ckpt_every=2",
            "--config.training.eval_every=2",
            "--config.model.n_layers=1",
            "--config.data.seq_len=16",
            *overrides,
        ],
    )
    train.train(config, tmp / name, quiet=True, final=False)
    return tmp / name


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """Run directories: an AR target, a block drafter (b = 4) and an AR run of another vocabulary."""
    tmp = tmp_path_factory.mktemp("drafts")
    return {
        "ar": _train(tmp, "ar", "--config.model.kind=ar"),
        "block": _train(tmp, "block", "--config.model.kind=block", "--config.model.block_size=4"),
        "foreign": _train(
            tmp,
            "foreign",
            "--config.model.kind=ar",
            "--config.data.name=markov",
            "--config.data.markov.num_tokens=20000",
        ),
    }


CASES = [("ngram", 0), ("ngram", speculative.MAX_DRAFTS + 1), ("block", 5), ("foreign", 2)]


def _library(dirs, draft: str, k: int) -> str:
    run = runs.load(dirs["ar"])
    with pytest.raises(ValueError) as e:
        run.sample(jax.random.key(0), 1, draft=draft if draft == "ngram" else runs.load(dirs[draft]), draft_k=k)
    return str(e.value)


def _command(dirs, draft: str, k: int, capsys, command: str) -> str:
    argv = [
        "--workdir",
        str(dirs["ar"]),
        "--draft",
        draft if draft == "ngram" else str(dirs[draft]),
        "--draft_k",
        str(k),
    ]
    if command == "sample":
        code = cli.main(["sample", "--num_samples", "1", *argv])
    else:
        pytest.importorskip("uvicorn")
        from sedd import serve

        code = serve.main([*argv, "--port", "1"])  # refused before it listens
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    prefix = f"sedd {command}: error: "
    assert err.startswith(prefix), err
    return err[len(prefix) :]


@pytest.mark.parametrize("draft,k", CASES)
def test_every_way_in_refuses_a_draft_with_one_message(dirs, capsys, draft, k):
    said = _library(dirs, draft, k)
    assert "\n" not in said
    if draft == "foreign":
        assert "vocabulary" in said and "differs from this run's" in said
    elif draft == "block":
        assert (
            said == "draft_k must be an integer in [1, 4] (drafts a round, at most the block drafter's block "
            "size), got 5"
        )
    else:
        assert said.startswith(f"draft_k must be an integer in [1, {speculative.MAX_DRAFTS}]")
    assert _command(dirs, draft, k, capsys, "sample") == said
    assert _command(dirs, draft, k, capsys, "serve") == said


def test_the_bound_is_the_drafter_s():
    """k in [1, MAX_DRAFTS] for prompt lookup; a block drafter's b below it; one message for both."""
    ngram = drafts.Ngram(5)
    assert ngram.checked(5, speculative.MAX_DRAFTS) == speculative.MAX_DRAFTS
    for k in (0, -1, speculative.MAX_DRAFTS + 1, 2.0, True, "3", None):
        with pytest.raises(ValueError, match=r"^draft_k must be an integer in \[1, 64\]"):
            ngram.checked(5, k)
    with pytest.raises(ValueError, match=r"vocabulary \(5 tokens\) differs from this run's \(6\)"):
        ngram.checked(6, 3)
    with pytest.raises(ValueError, match="'ngram', a smaller AR run or a block-diffusion run"):
        drafts.get("bigram", 5)


@pytest.mark.parametrize("kind", ["ar", "spec"])
def test_sample_refuses_what_a_left_to_right_run_cannot_honour(tmp_path, capsys, kind):
    """draft_k without a draft, a sampler, steps, a suffix: one line each, naming the option and the right kind."""
    from sedd import serve

    overrides = (
        ["--config.model.kind=spec", "--config.model.draft_k=3"] if kind == "spec" else ["--config.model.kind=ar"]
    )
    work = _train(tmp_path, kind, *overrides)
    run = runs.load(work)
    own_k = ("--draft_k", "2") if kind == "ar" else ("--draft_k", "2", "--layout", "1,1")
    says = {
        own_k: "draft_k needs a draft" if kind == "ar" else "draft_k=2: this run drafts 1 token a round in",
        ("--sampler", "dilated"): "sampler='dilated': a model.kind",
        ("--steps", "16"): "steps=16: a model.kind",
        ("--suffix", "x"): "a suffix: a model.kind",
    }
    for argv, said in says.items():
        assert cli.main(["sample", "--workdir", str(work), "--num_samples", "1", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and said in err, err
        if argv[0] != "--draft_k":
            assert "model.kind 'ddit'" in err, err  # the kind that takes it
    app = serve.create_app(run, "x")
    from starlette.testclient import TestClient

    with TestClient(app, base_url="http://localhost") as client:
        for field, value in (("sampler", "dilated"), ("steps", 16), ("suffix", "x")):
            r = client.post("/v1/completions", json={"prompt": "a", field: value})
            assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
            with pytest.raises(ValueError) as e:
                if field == "suffix":
                    run.generate(jax.random.key(0), 1, prefix="a", suffix="x")
                else:
                    run.sample(jax.random.key(0), 1, **{field: value})
            assert r.json()["error"]["message"] == str(e.value)


def test_the_ar_baseline_imports_nothing_of_block_diffusion_and_each_check_is_stated_once():
    """sedd/kinds/ar.py imports no block module; the vocabulary message and the draft_k bound are written once."""
    import ast
    from pathlib import Path

    sedd = Path(drafts.__file__).parent
    tree = ast.parse((sedd / "kinds" / "ar.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert not [m for m in imported if "block" in m], imported
    sources = {p: p.read_text() for p in sedd.rglob("*.py")}
    for text, where in (("differs from this run's", "drafts.py"), ("drafts a round, at most {why}", "validate.py")):
        assert [p.name for p, s in sources.items() if text in s] == [where], text


def test_a_spec_run_written_with_its_drafts_in_block_size_reads_them_as_draft_k():
    """model.draft_k is the spec kind's key; an older spec run kept k in model.block_size (config.MOVED)."""
    saved = config_lib.load_config("tiny").to_dict()
    del saved["model"]["draft_k"]
    saved["model"].update(kind="spec", block_size=3)
    assert config_lib.migrate(saved).model.draft_k == 3
    saved["model"]["kind"] = "block"  # a block run's block_size is its block length: draft_k keeps its default
    assert config_lib.migrate(saved).model.draft_k == config_lib.load_config("tiny").model.draft_k
