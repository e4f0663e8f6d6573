"""The same tokens for the same key, before and after a refactor: every kind x sampler x conditioning, and serve.

The expected tokens in ``fixtures/golden_samples.json`` were written by this
file (``SEDD_WRITE_GOLDEN=1 python -m pytest -p no:xdist tests/test_golden.py``)
and must not change when code moves: a change of any token here means a
sampler, a kind or the server now computes something else. The weights are
a tiny network's initial ones with every parameter perturbed (zero-initialised
output layers would make every score the same), so the draws depend on the
network's input.

The tokens hold on every CPU. The network computes in float32 whatever
``model.dtype`` or ``SEDD_COMPUTE_DTYPE`` say, and the cases meet no near-tie:
float32's last bits differ from one CPU to another (a CPU with AVX512 sums in
another order than one without), and where two choices lie within that noise
of each other (two positions' confidences, a uniform draw at a bin's edge) the
CPU would pick the path. The samplers round their data-dependent priorities
(``sedd.sampling.absorbing.tie_broken``), which removes the ties the network
makes itself (every masked position scores the same at the first step from
all masks); for the rest, writing a case tries keys until its tokens are the
same under ``PROBES`` further perturbations of the weights of ``PROBE_SCALE``
(the outputs move ~1e-4, a hundred times the noise between CPUs), and records
the first such key. To check a recording against other float noise, run this
file again under XLA's default compiler settings, which fuse and vectorise
otherwise: ``XLA_FLAGS=--xla_backend_optimization_level=2 python -m pytest -p
no:xdist tests/test_golden.py``.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from flax import nnx

import reference
from sedd import config as config_lib
from sedd import kinds, runs, sampling
from sedd.data.tokenizers import CharTokenizer
from sedd.sampling import absorbing

pytestmark = pytest.mark.dtypes  # .ci/run runs this file again in the other compute dtype

GOLDEN = Path(__file__).parent / "fixtures" / "golden_samples.json"
WRITE = os.environ.get("SEDD_WRITE_GOLDEN") == "1"
CHARS = "abcdefgh ,.\n"
L, STEPS, ROWS = 16, 3, 2
PROBES, PROBE_SCALE, ATTEMPTS = 3, 1e-5, 8

# (name, config overrides) of each run the cases sample from
RUNS = {
    "ddit": [],
    "uniform": ["--config.graph.type=uniform"],
    "timeless": ["--config.model.time_conditioning=False"],
    "block": ["--config.model.kind=block", "--config.model.block_size=4"],
    "ar": ["--config.model.kind=ar"],
    "spec": ["--config.model.kind=spec", "--config.model.draft_k=4"],
}
ABSORBING = ("euler", "analytic", "first_hitting", "confidence", "entropy_bound", "remdm", "dilated")


@pytest.fixture(autouse=True)
def _float32(monkeypatch):
    """The golden tokens are float32's: a run of the suite that forces another compute dtype leaves them be."""
    monkeypatch.delenv("SEDD_COMPUTE_DTYPE", raising=False)


def _run(name: str, probe: int = 0) -> runs.Run:
    """The run `name`; probe > 0: its weights perturbed once more by PROBE_SCALE (the near-tie probe)."""
    tokenizer = CharTokenizer(CHARS)
    config = config_lib.load_config(
        "tiny",
        [
            "--config.model.n_layers=1",
            f"--config.data.seq_len={L}",
            f"--config.sampling.steps={STEPS}",
            "--config.model.dtype=float32",
            *RUNS[name],
        ],
    )
    config = ml_collections.ConfigDict(config.to_dict())
    config.vocab_size = tokenizer.vocab_size
    graphdef, params, rest = nnx.split(kinds.get(config).network(0), nnx.Param, ...)
    params = reference.perturbed(params, 0.3, 7)
    if probe:
        params = reference.perturbed(params, PROBE_SCALE, 100 + probe)
    return runs.from_parts(config, tokenizer, graphdef, params, rest)


def _conditions(name: str) -> dict:
    """Conditioning patterns the kind allows: none, a prefix, an infill template."""
    out = {"none": {}}
    if name == "ar":
        return out
    out["prefix"] = {"prefix": "ab c"}
    if name not in ("block", "spec"):
        out["infill"] = {"infill": "a__d ef__h" + "_" * (L - 10)}
    return out


def _samplers(name: str) -> list:
    if name == "ar":
        return [
            ("default", {}),
            ("t07", {"temperature": 0.7}),
            ("ngram_k2", {"draft": "ngram", "draft_k": 2}),
            ("ngram_k3_token", {"draft": "ngram", "draft_k": 3, "verification": "token"}),
        ]
    if name == "spec":
        return [("default", {}), ("t07_p09", {"temperature": 0.7, "top_p": 0.9}), ("token", {"verification": "token"})]
    if name == "uniform":
        return [
            ("euler", {"sampler": "euler"}),
            ("analytic", {"sampler": "analytic"}),
            ("analytic_corrector", {"sampler": "analytic", "corrector_steps": 1}),
        ]
    if name == "timeless":
        return [
            ("analytic_cache", {"sampler": "analytic", "cache": True}),
            ("confidence_cache", {"sampler": "confidence", "cache": True}),
        ]
    return [(s, {"sampler": s}) for s in ABSORBING] + [
        ("confidence_t07_p09", {"sampler": "confidence", "temperature": 0.7, "top_p": 0.9}),
        ("analytic_t07_p09", {"sampler": "analytic", "temperature": 0.7, "top_p": 0.9}),
        ("confidence_margin_thr", {"sampler": "confidence", "order": "margin", "threshold": 0.5}),
        ("confidence_entropy", {"sampler": "confidence", "order": "entropy"}),
        ("confidence_thr", {"sampler": "confidence", "threshold": 0.3}),
        ("dilated_strided", {"sampler": "dilated", "order": "strided"}),
        ("remdm_loop", {"sampler": "remdm", "schedule": "loop"}),
    ]


def _library_cases():
    for name in RUNS:
        for cond, prompt in _conditions(name).items():
            for sampler, options in _samplers(name):
                yield f"{name}/{sampler}/{cond}", name, {**prompt, **options}
        if name in ("ddit", "block"):  # text past the model's length
            yield f"{name}/analytic/long", name, {"sampler": "analytic", "max_length": L + 8, "prefix": "ab"}


def _library_tokens(run: runs.Run, options: dict, attempt: int) -> dict:
    prompt = {k: options.pop(k) for k in ("prefix", "infill") if k in options}
    length = options.get("max_length") or L
    mask, tokens = sampling.text_conditioning(run.tokenizer, length, ROWS, **prompt)
    if mask is not None:
        options.update(fixed_mask=jnp.asarray(mask), fixed_tokens=jnp.asarray(tokens))
    out = run.sample(jax.random.key(3 + attempt), ROWS, return_stats=True, **options)
    return {"tokens": np.asarray(out.tokens).tolist(), "nfe": np.asarray(out.stats["nfe_per_sample"]).tolist()}


def _serve_cases():
    for name in ("ddit", "block"):
        for sampler in ABSORBING:
            yield f"serve/{name}/{sampler}", name, sampler, False
        yield f"serve/{name}/confidence/diffusing", name, "confidence", True


def _serve_tokens(run, sampler: str, trajectory: bool, attempt: int) -> dict:
    from sedd import serve

    limits = serve.Limits()
    engine = serve.Engine(run, limits)
    seed = 1000 * attempt
    requests = [
        serve.CompletionRequest(prompt="ab", max_tokens=8, n=2, seed=seed + 5, sampler=sampler),
        serve.CompletionRequest(
            prompt="h", max_tokens=6, n=1, seed=seed + 9, sampler=sampler, temperature=0.7, top_p=0.9
        ),
    ]
    if "suffix" in run.kind.conditions:
        requests.append(serve.CompletionRequest(prompt="a", suffix="gh", n=1, seed=seed + 11, sampler=sampler))
    jobs = [serve.Job(serve.plan(run, r, limits), trajectory, concurrent.futures.Future()) for r in requests]
    results = engine.run_batch(jobs)
    out = {
        "tokens": [np.asarray(ids).tolist() for ids, _, _ in results],
        "nfe": [info["nfe"] for _, _, info in results],
    }
    if trajectory:
        out["trajectory"] = [np.asarray(traj).tolist() for _, traj, _ in results]
    return out


_RUNS: dict = {}


def _cached_run(name, probe: int = 0):
    if (name, probe) not in _RUNS:
        _RUNS[name, probe] = _run(name, probe)
    return _RUNS[name, probe]


def _golden() -> dict:
    if WRITE:
        return {}
    return json.loads(GOLDEN.read_text())


LIBRARY = list(_library_cases())
SERVE = list(_serve_cases())


def _check(case: str, draw, name: str, golden: dict) -> None:
    """Compare `draw(run, attempt)` with the recorded tokens of `case`, or record them (SEDD_WRITE_GOLDEN=1).

    Recording tries attempts (keys, seeds) until the draw is the same under PROBES perturbations of the
    weights, and writes the first such: a draw that a near-tie decides is never recorded.
    """
    if not WRITE:
        assert case in golden, f"no golden tokens for {case}"
        expected = golden[case]
        got = draw(_cached_run(name), expected["attempt"])
        assert got == {k: v for k, v in expected.items() if k != "attempt"}, f"{case}: the tokens changed"
        return
    for attempt in range(ATTEMPTS):
        got = draw(_cached_run(name), attempt)
        if all(draw(_cached_run(name, probe), attempt) == got for probe in range(1, PROBES + 1)):
            break
    else:
        raise AssertionError(f"{case}: every one of {ATTEMPTS} keys meets a near-tie")
    data = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    data[case] = {"attempt": attempt, **got}
    GOLDEN.write_text(json.dumps(data, sort_keys=True, indent=0))


def _core(case: str) -> bool:
    """The default suite's share: every sampler unconditioned, and prompts with a few (the conditioning is one
    code path for every sampler); of block diffusion and of the server, which loop around the same samplers,
    a few samplers; every case with -m slow, to keep the default suite within 900 CPU s."""
    name, sampler, cond = case.split("/")
    if name == "block":  # its own loop around the same samplers: a few of them
        return sampler in CORE_PROMPTED or cond == "long"
    return cond in ("none", "long") or name != "ddit" or sampler in CORE_PROMPTED


CORE_PROMPTED = ("analytic", "confidence", "entropy_bound", "dilated", "remdm_loop")


@pytest.mark.parametrize("share", ["core", pytest.param("rest", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", list(RUNS))
def test_every_sampler_on_every_kind_draws_the_golden_tokens(name, share):
    golden = _golden()
    for case, run_name, options in LIBRARY:
        if run_name == name and (WRITE or _core(case) == (share == "core")):
            _check(case, lambda run, attempt: _library_tokens(run, dict(options), attempt), name, golden)


@pytest.mark.parametrize(  # the block server's tokens behind -m slow (the library's block cases stay): 900 CPU s
    "name,share",
    [
        ("ddit", "core"),
        pytest.param("ddit", "rest", marks=pytest.mark.slow),
        pytest.param("block", "core", marks=pytest.mark.slow),
        pytest.param("block", "rest", marks=pytest.mark.slow),
    ],
)
def test_serve_draws_the_golden_tokens(name, share):
    pytest.importorskip("starlette")
    golden = _golden()
    for case, run_name, sampler, trajectory in SERVE:
        core = sampler in CORE_PROMPTED or trajectory
        if run_name == name and (WRITE or core == (share == "core")):
            _check(case, lambda run, attempt: _serve_tokens(run, sampler, trajectory, attempt), name, golden)


class _SwappedOrder(absorbing.Confidence):
    """The confidence sampler with a planted change: positions 0 and 1 trade priorities."""

    def priority(self, ctx, key, logits, token, prob):
        p = super().priority(ctx, key, logits, token, prob)
        return p.at[..., 0].set(p[..., 1]).at[..., 1].set(p[..., 0])


@pytest.mark.skipif(WRITE, reason="compares with the recorded tokens")
@pytest.mark.parametrize("plant", ["order", pytest.param("temperature", marks=pytest.mark.slow)])  # slow: 900 CPU s
def test_a_planted_change_fails_the_golden_tokens(plant, monkeypatch):
    """A sampler that unmasks a position in another order, or a temperature off by 0.05, changes the tokens."""
    golden = _golden()
    case = "ddit/confidence_t07_p09/none"
    options = dict(next(o for c, _, o in LIBRARY if c == case))
    if plant == "order":
        monkeypatch.setitem(sampling.SAMPLERS, "confidence_swapped", _SwappedOrder())
        options["sampler"] = "confidence_swapped"
    else:
        options["temperature"] = 0.75
    with pytest.raises(AssertionError, match="the tokens changed"):
        _check(case, lambda run, attempt: _library_tokens(run, dict(options), attempt), "ddit", golden)
