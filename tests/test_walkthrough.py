"""The walkthrough runs end to end (fast mode), and the public API is documented.

docs/walkthrough.py imports sedd and never redefines it, so running it is a
check that the documentation still matches the library.
"""

import importlib
import importlib.util
import inspect
import os
import pkgutil
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sedd

ROOT = Path(__file__).resolve().parent.parent
WALKTHROUGH = ROOT / "docs" / "walkthrough.py"
FIGURES = (
    "forward_process.png",
    "score_entropy.png",
    "training.png",
    "samplers.png",
    "denoising.png",
    "likelihood_integrand.png",
)
# The issue asks for under 5 minutes on 2 CPU cores; the fast mode takes ~2.5.
TIME_LIMIT_S = 600


@pytest.mark.slow  # the whole walkthrough, a study of its own: behind -m slow to keep the default suite within 900 CPU s
def test_walkthrough_runs_in_fast_mode(tmp_path):
    env = dict(os.environ)
    env.update(
        SEDD_WALKTHROUGH_FAST="1",
        SEDD_WALKTHROUGH_FIGURES=str(tmp_path / "figures"),
        SEDD_WALKTHROUGH_WORKDIR=str(tmp_path / "run"),
        SEDD_DATA_DIR=str(tmp_path / "data"),
        MPLBACKEND="Agg",
    )
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(WALKTHROUGH)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIME_LIMIT_S
    )
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, f"walkthrough failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    assert "walkthrough finished" in proc.stdout
    for name in FIGURES:
        path = tmp_path / "figures" / name
        assert path.is_file() and path.stat().st_size > 1000, f"figure {name} was not written"
    print(f"walkthrough (fast) took {elapsed:.0f} s")


def _public_members():
    """(qualified name, object) of every public function and class defined in a module of sedd."""
    for info in sorted(pkgutil.walk_packages(sedd.__path__, "sedd."), key=lambda m: m.name):
        if info.name.rsplit(".", 1)[-1].startswith("_"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if getattr(obj, "__module__", None) != module.__name__:
                continue  # imported from elsewhere
            yield f"{info.name}.{name}", obj


def test_every_public_function_and_class_has_a_docstring():
    missing = [name for name, obj in _public_members() if not (inspect.getdoc(obj) or "").strip()]
    assert not missing, "public names without a docstring:\n  " + "\n  ".join(missing)


def test_walkthrough_uses_the_library_not_a_copy():
    source = WALKTHROUGH.read_text()
    assert "import sedd" in source or "from sedd import" in source
    # No class of the library is redefined in the walkthrough.
    for name, obj in _public_members():
        if inspect.isclass(obj):
            assert f"class {obj.__name__}" not in source, f"walkthrough redefines {name}"


@pytest.mark.parametrize("doc", ["math.md", "index.md"])
def test_docs_name_real_functions(doc):
    """Every `sedd.module.name` a doc cites exists; the index cites every module of the library."""
    text = (ROOT / "docs" / doc).read_text()
    refs = sorted(set(re.findall(r"`(sedd\.[a-z_0-9]+(?:\.[A-Za-z_0-9]+)+)", text)))
    assert refs, f"docs/{doc} cites no sedd function"
    for ref in refs:
        parts = ref.split(".")
        n = 2
        while (
            n < len(parts)
            and hasattr(importlib.import_module(".".join(parts[:n])), "__path__")
            and importlib.util.find_spec(".".join(parts[: n + 1])) is not None
        ):
            n += 1  # a subpackage's module, e.g. sedd.data.markov
        obj = importlib.import_module(".".join(parts[:n]))
        for attr in parts[n:]:
            assert hasattr(obj, attr), f"docs/{doc} cites {ref}, which does not exist"
            obj = getattr(obj, attr)
    if doc == "index.md":
        cited = {".".join(r.split(".")[:2]) for r in refs}
        modules = {f"sedd.{m.name}" for m in pkgutil.iter_modules(sedd.__path__) if not m.name.startswith("_")}
        assert modules - {"sedd.cli", "sedd.configs"} <= cited, sorted(modules - cited)
