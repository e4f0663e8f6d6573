"""The code corpus (sedd.data.sources) and the measures of generated code (sedd.code_measures)."""

import json
import platform
from pathlib import Path

import numpy as np
import pytest

from sedd import code_measures as cm
from sedd.data import builders, load_dataset, read_documents, sources
from sedd.data.tokenizers import EOS_TEXT

FILES = {  # byte-exact oddities: leading blank lines, tabs, CRLF, no final newline, non-ASCII, trailing spaces
    "pkg/__init__.py": "",
    "pkg/core.py": "\n\nimport os\n\n\ndef f(x):\n\treturn x  \n",
    "pkg/util.py": "# -*- coding: utf-8 -*-\r\nNAME = 'caf\u00e9'\r\n",
    "pkg/deep/more.py": "class A:\n    def g(self):\n        return [1,\n                2]",
    "tool.py": "   \nprint('hi')\n\n\n",
    "notes.txt": "not python",
    "pkg/tests/test_core.py": "def test_f():\n    assert True\n",
    "pkg/test_util.py": "def test_u():\n    pass\n",
}


def write_tree(root: Path, files=FILES) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8"))
    return root


def test_builder_splits_by_file_and_round_trips_exact_bytes(tmp_path):
    root = write_tree(tmp_path / "src")
    builder = builders.get_builder("code", str(root), str(tmp_path / "data"), options={"tests": False})
    train, validation = (list(read_documents(builder, s)) for s in ("train", "validation"))
    expected = {FILES[n] for n in ("pkg/core.py", "pkg/util.py", "pkg/deep/more.py", "tool.py")}
    # Each file is one document, byte for byte, on exactly one side; tests, .txt and empty files left out.
    assert sorted(train + validation) == sorted(expected)
    assert validation and train and not set(train) & set(validation)
    # The side is a fixed function of the path: the hash decides, or the lowest hash when none falls below 5%.
    shares = {
        n: sources.validation_share(Path(n)) for n in ("pkg/core.py", "pkg/util.py", "pkg/deep/more.py", "tool.py")
    }
    chosen = [n for n, s in shares.items() if s < builders.VAL_FRACTION] or [min(shares, key=shares.get)]
    assert sorted(validation) == sorted(FILES[n] for n in chosen)
    manifest = json.loads((Path(builder.data_dir) / builders.MANIFEST).read_text())
    assert manifest["python"] == platform.python_version() and len(manifest["files_sha1"]) == 40
    assert manifest["tests"] is False and len(manifest["files"]) == 5  # the empty __init__.py is listed, not read


def test_builder_takes_tests_when_asked_and_keeps_a_cache_per_option(tmp_path):
    root = write_tree(tmp_path / "src")
    without = builders.get_builder("code", str(root), str(tmp_path / "data"), options={"tests": False})
    with_tests = builders.get_builder("code", str(root), str(tmp_path / "data"), options={"tests": True})
    assert without.data_dir != with_tests.data_dir
    docs = [d for s in ("train", "validation") for d in read_documents(with_tests, s)]
    assert FILES["pkg/tests/test_core.py"] in docs and FILES["pkg/test_util.py"] in docs and len(docs) == 6
    with pytest.raises(ValueError, match="at least 2 non-empty files .*found 1"):  # nothing to validate on
        builders.get_builder("code", str(root), str(tmp_path / "data"), options={"glob": "*.txt"})


def test_missing_sources_name_the_folder(tmp_path):
    (tmp_path / "slim" / "json").mkdir(parents=True)
    (tmp_path / "slim" / "json" / "__init__.pyc").write_bytes(b"\x00")  # a slim image keeps only bytecode
    with pytest.raises(FileNotFoundError, match=f"no \\*.py files under {tmp_path / 'slim'}"):
        builders.get_builder("code", str(tmp_path / "slim"), str(tmp_path / "data"))
    with pytest.raises(FileNotFoundError, match="no such folder"):
        builders.get_builder("code", str(tmp_path / "nowhere"), str(tmp_path / "data"))
    with pytest.raises(ValueError, match="data.code.glob"):
        builders.get_builder("code", str(tmp_path), str(tmp_path / "data"), options={"glob": "a/*.py"})
    with pytest.raises(ValueError, match="data.documents must be 'file'"):
        builders.get_builder("code", str(tmp_path), str(tmp_path / "data"), documents="lines")


def test_the_standard_library_is_found_without_tests():
    files = sources.list_sources(sources.stdlib_dir())
    names = {f.relative_to(sources.stdlib_dir()).as_posix() for f in files}
    assert "os.py" in names and "json/decoder.py" in names
    assert not any(n.startswith("test/") or "site-packages" in n for n in names)


def test_load_dataset_encodes_code_exactly(tmp_path):
    root = write_tree(tmp_path / "src")
    data = load_dataset({"name": "code", "path": str(root), "data_dir": str(tmp_path / "data"), "seq_len": 8})
    stream = np.concatenate([data.tokens(s) for s in data.splits])
    text = data.tokenizer.decode(stream)
    for name in ("pkg/core.py", "pkg/util.py", "pkg/deep/more.py", "tool.py"):
        assert FILES[name] in text.split(EOS_TEXT)


# ---------------------------------------------------------------- measures of generated code


def test_parse_cut_on_hand_written_samples():
    assert (
        cm.statement_cut("import os\n\ndef f(x):\n    return x + 1\n\n@dec\ndef g():\n    pa")
        == "import os\n\ndef f(x):\n    return x + 1\n\n"
    )
    assert cm.parses("import os\n\ndef f(x):\n    return x + 1\n\n@dec\ndef g():\n    pa") is True
    assert cm.parses("def f(:\n    pass\nx = 1") is False  # a syntax error before the cut
    assert cm.parses("if a:\n    b = 1\nelse:\n    b = 2\nc = 3") is True  # else continues the if
    assert cm.parses("x = (1,\n2)\ny = 3") is True  # a bracket continued at column 0
    assert cm.parses("    x = 1\n    y = 2") is None  # no complete top-level statement
    assert cm.parses("def f():\n    return 1\n" + EOS_TEXT + "garbage (") is True  # a file's end is complete
    assert cm.parses("x = 1\n" + EOS_TEXT) is True and cm.parses("x = \n" + EOS_TEXT) is False
    figures = cm.parse_figures(["x = 1\ny = 2", "x = = 1\ny = 2", "    z = 3", "a = 1\nb"])
    assert figures["parse_rate"] == pytest.approx(2 / 3) and figures["complete_share"] == 0.75


def test_line_tokenise_rate_on_hand_written_lines():
    assert cm.line_tokenises("    foo(a,") and cm.line_tokenises("return x")
    assert not cm.line_tokenises("x = 'abc") and not cm.line_tokenises("x = $")
    # Complete lines only: the last one, cut by the sample's end, is not judged.
    assert cm.complete_lines("a = 1\n\nb = $\nc = 'unfini") == ["a = 1", "b = $"]
    assert cm.line_tokenise_rate(["a = 1\nb = $\nc = 'unfini", "d = 2\n"]) == pytest.approx(2 / 3)


def test_memorisation_share_on_known_copies():
    train = "def handle(self, request):\n    return self.dispatch(request)\n"
    memo = cm.Memorisation(train, min_chars=10)
    copy = "    return self.dispatch"  # 24 characters of the training text
    sample = "xyz" + copy + "qqqqqqqqqq"
    marks = memo.copied(sample)
    assert marks.tolist() == [False] * 3 + [True] * len(copy) + [False] * 10
    assert memo.share([sample, "no copy here at all"]) == pytest.approx(len(copy) / (len(sample) + 19))
    assert memo.share(["handle(sel"]) == 1.0 and memo.share(["handle(se"]) == 0.0  # 10 characters, then 9
    assert cm.Memorisation("short", 10).share(["short text"]) == 0.0


# ---------------------------------------------------------------- a code run end to end


def code_tree(root: Path) -> Path:
    """Six modules of small top-level functions: every window from a statement parses."""
    for m in range(6):
        body = "".join(f"def f{m}_{i}(x):\n    return x + {i}\n\n\nclass C{i}:\n    y = {m}\n\n\n" for i in range(40))
        (root / f"mod{m}.py").parent.mkdir(parents=True, exist_ok=True)
        (root / f"mod{m}.py").write_text(f'"""Module {m}."""\nimport os\n\n\n' + body)
    return root


@pytest.fixture(scope="module")
def code_runs(tmp_path_factory):
    """(ddit run, AR run, spec run) of `tiny` on a folder of code, one block, 4 steps each."""
    from sedd import config as config_lib, train

    tmp = tmp_path_factory.mktemp("code_runs")
    root = code_tree(tmp / "src")
    out = []
    for kind in ("ddit", "ar", "spec"):
        config = config_lib.load_config(
            "tiny",
            [
                "--config.data.name=code",
                f"--config.data.path={root}",
                f"--config.data.data_dir={tmp / 'data'}",
                "--config.training.n_iters=4",
                "--config.training.eval_every=4",
                "--config.training.ckpt_every=4",
                "--config.model.n_layers=1",
                f"--config.model.kind={kind}",
                "--config.training.eval_samples=0",
            ],
        )
        train.train(config, tmp / kind, quiet=True, final=False)
        out.append(tmp / kind)
    return out


def test_any_exact_run_judges_the_completions(code_runs, capsys):
    """`sedd eval --code_samples K --judge SPEC_RUN`: a spec run's causal half is an exact judge (it failed after the
    completions with "an AR baseline is a DDiT with causal=True ..."); a run whose likelihood is a bound is not."""
    from sedd import cli

    ddit, ar_run, spec_run = code_runs
    args = [
        "eval",
        "--workdir",
        str(ddit),
        "--max_batches",
        "1",
        "--num_t",
        "2",
        "--code_samples",
        "4",
        "--prompt_chars",
        "12",
    ]
    assert cli.main([*args, "--judge", str(spec_run)]) == 0
    figures = dict(line.split(":", 1) for line in capsys.readouterr().out.strip().splitlines())
    assert float(figures["judge_nats_per_char".rjust(24)]) > 0
    assert cli.main([*args, "--judge", str(ddit)]) == 2
    err = capsys.readouterr().err
    assert "model.kind='ddit' run, whose likelihood is a bound; a judge's must be exact" in err, err


def test_eval_reports_the_code_measures(code_runs, capsys):
    from sedd import cli

    ddit, ar_run, _ = code_runs
    assert (
        cli.main(
            [
                "eval",
                "--workdir",
                str(ddit),
                "--max_batches",
                "1",
                "--num_t",
                "2",
                "--code_samples",
                "4",
                "--prompt_chars",
                "12",
                "--judge",
                str(ar_run),
            ]
        )
        == 0
    )
    figures = dict(line.split(":", 1) for line in capsys.readouterr().out.strip().splitlines())
    figures = {k.strip(): v.strip() for k, v in figures.items()}
    assert float(figures["data_parse_rate"]) == 1.0 and float(figures["data_complete_share"]) > 0  # held-out code
    assert float(figures["data_memorised_share"]) < 1.0  # no module copies another whole: the names differ
    for name in ("samples_tokenise_rate", "samples_memorised_share", "data_tokenise_rate"):
        assert 0.0 <= float(figures[name]) <= 1.0
    assert float(figures["judge_nats_per_char"]) > 0 and int(figures["nfe"]) == 8  # tiny's 8 steps
    assert 1 <= float(figures["row_nfe"]) <= 8  # each row's calls, at most the batch's
    assert float(figures["tokens_per_call"]) == pytest.approx((32 - 12) / float(figures["row_nfe"]), rel=1e-3)


def test_sample_prefix_reads_escapes_for_every_kind(code_runs, capsys):
    from sedd import cli

    for run in code_runs[:2]:  # the AR baseline takes a prompt too
        assert cli.main(["sample", "--workdir", str(run), "--num_samples", "2", "--prefix", r"def f(x):\n    "]) == 0
        samples = capsys.readouterr().out.split("--- sample ")[1:]
        assert len(samples) == 2 and all(s.split("\n", 1)[1].startswith("def f(x):\n    ") for s in samples)
    assert cli.unescape(r"a\\nb \d \t") == "a\\nb \\d \t"  # \\ is one backslash; \d is kept as typed


def test_a_code_run_is_served_as_code(code_runs):
    from starlette.testclient import TestClient

    from sedd import runs, serve

    run = runs.load(code_runs[0])
    limits = serve.Limits(max_steps=4, max_n=2, max_batch=4, timeout_s=120, window_s=0.05)
    with TestClient(serve.create_app(run, "code", limits), base_url="http://localhost") as c:
        assert c.get("/v1/models").json()["data"][0]["data"] == "code"  # the playground's prompt turns monospace
        r = c.post("/v1/completions", json={"prompt": "def f(x):\n    ", "max_tokens": 6, "seed": 1, "steps": 4})
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"][0]["text"]) == 6  # characters, after the prompt's indentation
    page = (Path(serve.__file__).parent.parent / "static" / "playground.html").read_text()
    assert 'model.data === "code"' in page and "textarea.code" in page


@pytest.mark.slow
def test_code_study_on_tiny_runs(code_runs, tmp_path):
    """experiments/code_study.py end to end on the tiny runs: every measure of every row, the table and plot."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "code_study", Path(__file__).parent.parent / "experiments" / "code_study.py"
    )
    code_study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(code_study)
    ddit, ar_run, _ = code_runs
    result = code_study.study(
        str(ar_run), [str(ddit)], [], num_prompts=2, prompt_chars=12, length=32, repeats=1, eval_batches=1
    )
    assert [r["sampler"] for r in result["rows"]] == [
        "",
        "ancestral",
        "speculative, n-gram drafts",
        "EB",
        "threshold 0.9",
    ]
    assert result["rows"][0]["parse_rate"] == 1.0  # the held-out windows
    for row in result["rows"][1:]:
        assert 0 <= row["parse_rate"] <= 1 or np.isnan(row["parse_rate"])
        assert row["tokens_per_call"] > 0 and row["vs_ar_b1"] > 0 and row["judge_nats_per_char"] > 0
    code_study.write(result, tmp_path / "out")
    assert "copied >= 64" in (tmp_path / "out" / "code_study.md").read_text()
    assert (tmp_path / "out" / "code_study.png").stat().st_size > 0
    assert code_study.main(["--tokens_per_call", str(ddit), "--length", "32", "--out", str(tmp_path / "t")]) == 0
    table = json.loads((tmp_path / "t" / "tokens_per_call.json").read_text())["rows"]
    assert [r["sampler"] for r in table] == ["EB", "threshold 0.9"]
    for r in table:  # a row's own calls are at most the batch's: its figure at least the batch's
        assert r["tokens_per_call_row"] >= r["tokens_per_call_batch"] >= 32 / 32 and r["tokens_per_call_row_se"] >= 0
