"""The README and the guides instruct (issue 62, item 4): short, current, and true to the code.

- README.md: at most 200 lines, no commit hash, no host "load", CPU models and families named in its
  results tables only; its commands use config keys that exist; its file map names files that exist.
- The README's, `sedd.sampling`'s and `sedd sample --help`'s lists of samplers name every registered one.
- The guides in docs/ carry no dated run logs: those live in docs/studies/, linked from the guide.
- Every relative link of the README and of docs/ resolves, anchors included, inside the repository.
- The README's Python snippet runs from the folder above a clone, and an editable install is what lets it
  (issue 84).
"""

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sedd import cli, runs, sampling
from sedd import config as config_lib

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDES = sorted((ROOT / "docs").glob("*.md"))  # docs/studies/ holds the dated studies and their logs
DATE = re.compile(r"\b20\d\d-[01]\d(-[0-3]\d)?\b")
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")
LOAD = re.compile(r"(?<![\w.])load(?![\w(])", re.IGNORECASE)  # the word, not `sedd.runs.load(` or a file name
CPU = re.compile(r"\b(Zen \d|EPYC|Xeon|CPU family|family \d+|model \d+)\b")


def _results_tables(lines: list[str]) -> set[int]:
    """The line numbers of the README's results tables (the tables of the "## Results" section)."""
    start = lines.index("## Results")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return {i for i in range(start, end) if lines[i].startswith("|")}


def test_readme_is_short_and_current():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; at most 200 (dated figures go to docs/studies/)"
    assert not COMMIT.findall(text), f"README.md names commits: {COMMIT.findall(text)}"
    loads = [line for line in lines if LOAD.search(line)]
    assert not loads, f"README.md speaks of load: {loads}"
    tables = _results_tables(lines)
    named = [line for i, line in enumerate(lines) if CPU.search(line) and i not in tables]
    assert not named, f"README.md names CPU models outside its results tables: {named}"


def test_every_sampler_list_names_every_registered_sampler(capsys):
    readme = README.read_text()
    with pytest.raises(SystemExit):
        cli.main(["sample", "--help"])
    helped = " ".join(capsys.readouterr().out.split())
    for name, sampler in sampling.SAMPLERS.items():
        assert f"`{name}`" in readme, f"README.md does not name the sampler {name!r}"
        assert f'"{name}"' in sampling.__doc__, f"sedd.sampling's docstring does not list {name!r}"
        assert type(sampler).__name__ in sampling.__all__, f"sedd.sampling.__all__ lacks {type(sampler).__name__}"
        assert re.search(rf"\b{name}\b", helped), f"`sedd sample --help` does not name {name!r}"


@pytest.mark.parametrize("guide", [g.name for g in GUIDES])
def test_guides_carry_no_dated_run_logs(guide):
    text = (ROOT / "docs" / guide).read_text()
    dated = [line for line in text.splitlines() if DATE.search(line)]
    assert not dated, f"docs/{guide} holds dated runs (move them to docs/studies/ and link them): {dated[:3]}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # a `#` line in a code block is no heading
    return {_slug(m[1]) for m in re.finditer(r"(?m)^#+ (.*)$", text)}


@pytest.mark.parametrize("doc", ["README.md"] + [str(p.relative_to(ROOT)) for p in sorted(ROOT.glob("docs/**/*.md"))])
def test_links_resolve_inside_the_repository(doc):
    path = ROOT / doc
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.is_relative_to(ROOT) or not dest.exists():
            bad.append(f"{target}: no such file in the repository")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading #{anchor}")
    outside = re.findall(r"\.\./shared/\S*", text)
    assert not bad and not outside, f"{doc}: {bad + outside}"


def _readme_commands(program: str) -> list[list[str]]:
    """The README's `sedd PROGRAM ...` command lines, continuation lines joined and $S expanded."""
    text = README.read_text().replace("\\\n", " ")
    env = dict(re.findall(r'(?m)^(\w+)="([^"]*)"$', text))
    lines = [line.split("#", 1)[0] for line in text.splitlines() if line.startswith(f"sedd {program} ")]
    return [shlex.split(re.sub(r"\$(\w+)", lambda m: env[m[1]], line)) for line in lines]


def test_readme_commands_use_config_keys_that_exist():
    """Each `sedd train` line of the README loads and passes the checks `sedd train` makes before any work; each
    `sedd distill` line's overrides name keys of the default config (a renamed key fails here, not for a reader)."""
    commands = _readme_commands("train") + _readme_commands("distill")
    assert len(commands) >= 8
    for args in commands:
        overrides = [a for a in args if a.startswith("--config.")]
        name = args[args.index("--config") + 1] if "--config" in args else config_lib.DEFAULT_CONFIG
        if name.endswith(".py"):
            continue  # the reader's own file
        config = config_lib.load_config(name, overrides)
        if args[1] == "train":
            runs.check_config(config, " ".join(args))


def test_readme_file_map_names_files_that_exist():
    lines = README.read_text().splitlines()
    start = lines.index("## File map")
    rows = [line for line in lines[start:] if line.startswith("| `")]
    paths = [p for row in rows for p in re.findall(r"`([\w./]+/|[\w./]+\.\w+)`", row.split("|")[1])]
    assert len(paths) >= 20
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"README.md's file map names files that do not exist: {missing}"


def test_the_quickstart_commands_are_the_ones_ci_runs():
    """The README's two commands stay exactly these; `.ci/run` runs the second verbatim."""
    readme = README.read_text()
    train = "pip install -e . && sedd train"
    test = 'pip install -e ".[test]" && python -m pytest -q -rs -n 2 --dist loadscope'
    assert f"\n   {train}\n" in readme and f"\n   {test}\n" in readme
    assert test in (ROOT / ".ci" / "run").read_text().splitlines()


def test_the_readme_snippet_runs_from_the_clones_parent(tiny_run, tmp_path):
    """The README's Python snippet, saved in the folder above a clone and run there with `python snippet.py` (issue
    84): `git clone` names the clone `sedd`, and from its parent that folder (no __init__.py; a `runs/` in it after
    the README's `--workdir runs/mine`) is a namespace package `sedd` Python finds first unless the installed one
    is on sys.path, which setup.py's package_dir makes `pip install -e .` do. The run is the tests' tiny one."""
    snippet = re.search(r"```python\n(.*?)```", README.read_text(), re.S)[1]
    assert '"checkpoints/shakespeare_char"' in snippet, snippet
    (tmp_path / "sedd" / "runs" / "mine").mkdir(parents=True)  # the clone, as the folder above it sees it
    (tmp_path / "snippet.py").write_text(snippet.replace('"checkpoints/shakespeare_char"', repr(str(tiny_run[0]))))
    proc = subprocess.run(
        [sys.executable, "snippet.py"], cwd=tmp_path, env=dict(os.environ), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, (
        "the README's snippet failed from the clone's parent; where sedd is an editable install of an older "
        f"setup.py, `pip install -e .` again:\n{proc.stderr[-3000:]}"
    )
    texts = ast.literal_eval(proc.stdout.strip().splitlines()[0])  # the printed list of two samples
    assert len(texts) == 2 and all(t.startswith("ROMEO:") for t in texts), proc.stdout


def test_an_editable_install_puts_the_clone_itself_on_sys_path(tmp_path):
    """setuptools' editable wheel of this tree is a static .pth naming the clone (a path Python's own search reads,
    where a regular package beats a namespace one), not an import hook that runs after that search (issue 84;
    setuptools picks the hook for a flat layout unless package_dir names the root)."""
    build_meta = pytest.importorskip("setuptools.build_meta")
    if not hasattr(build_meta, "build_editable"):
        pytest.skip("setuptools < 64 has no editable wheels: pip's `setup.py develop` puts the clone on sys.path")
    src = tmp_path / "clone"
    skip = (".git", "checkpoints", "runs", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*skip, "tests", "docs", "experiments"))
    code = "import sys; from setuptools import build_meta; print(build_meta.build_editable(sys.argv[1]))"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "wheel")], cwd=src, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with zipfile.ZipFile(tmp_path / "wheel" / proc.stdout.split()[-1]) as wheel:
        pth = [wheel.read(n).decode() for n in wheel.namelist() if n.endswith(".pth")]
    assert [line for text in pth for line in text.splitlines()] == [str(src)], pth
