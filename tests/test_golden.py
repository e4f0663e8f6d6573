"""The same tokens for the same key, before and after a refactor: every kind x sampler x conditioning, and serve.

The expected tokens in ``fixtures/golden_samples.json`` were written by this
file (``SEDD_WRITE_GOLDEN=1 python -m pytest tests/test_golden.py``) at the
commit before the sampling core was made public (the architecture issue of
2026-12-04), and must not change when code moves: a change of any token here
means a sampler, a kind or the server now computes something else. The
weights are a tiny network's initial ones with every parameter perturbed
(zero-initialised output layers would make every score the same), so the
draws depend on the network's input.
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

GOLDEN = Path(__file__).parent / "fixtures" / "golden_samples.json"
WRITE = os.environ.get("SEDD_WRITE_GOLDEN") == "1"
CHARS = "abcdefgh ,.\n"
L, STEPS, ROWS = 16, 3, 2

# (name, config overrides) of each run the cases sample from
RUNS = {
    "ddit": [],
    "uniform": ["--config.graph.type=uniform"],
    "timeless": ["--config.model.time_conditioning=False"],
    "block": ["--config.model.kind=block", "--config.model.block_size=4"],
    "ar": ["--config.model.kind=ar"],
}
ABSORBING = ("euler", "analytic", "first_hitting", "confidence", "entropy_bound", "remdm")


def _run(name: str) -> runs.Run:
    tokenizer = CharTokenizer(CHARS)
    config = config_lib.load_config("tiny", ["--config.model.n_blocks=1", f"--config.data.seq_len={L}",
                                             f"--config.sampling.steps={STEPS}", *RUNS[name]])
    config = ml_collections.ConfigDict(config.to_dict())
    config.vocab_size = tokenizer.vocab_size
    graphdef, params, rest = nnx.split(kinds.get(config).network(0), nnx.Param, ...)
    return runs.from_parts(config, tokenizer, graphdef, reference.perturbed(params, 0.3, 7), rest)


def _conditions(name: str) -> dict:
    """Conditioning patterns the kind allows: none, a prefix, an infill template."""
    out = {"none": {}}
    if name == "ar":
        return out
    out["prefix"] = {"prefix": "ab c"}
    if name != "block":
        out["infill"] = {"infill": "a__d ef__h" + "_" * (L - 10)}
    return out


def _library_cases():
    for name in RUNS:
        if name == "ar":
            samplers = [("default", {}), ("t07", {"temperature": 0.7})]
        elif name == "uniform":
            samplers = [("euler", {"predictor": "euler"}), ("analytic", {"predictor": "analytic"}),
                        ("analytic_corrector", {"predictor": "analytic", "corrector_steps": 1})]
        elif name == "timeless":
            samplers = [("analytic_cache", {"predictor": "analytic", "cache": True}),
                        ("confidence_cache", {"predictor": "confidence", "cache": True})]
        else:
            samplers = [(s, {"predictor": s}) for s in ABSORBING]
            samplers += [("confidence_t07_p09", {"predictor": "confidence", "temperature": 0.7, "top_p": 0.9}),
                         ("analytic_t07_p09", {"predictor": "analytic", "temperature": 0.7, "top_p": 0.9}),
                         ("confidence_margin_thr", {"predictor": "confidence", "order": "margin",
                                                    "threshold": 0.5}),
                         ("remdm_loop", {"predictor": "remdm", "schedule": "loop"})]
        for cond, prompt in _conditions(name).items():
            for sampler, options in samplers:
                yield f"{name}/{sampler}/{cond}", name, {**prompt, **options}
        if name in ("ddit", "block"):  # text past the model's length
            yield f"{name}/analytic/long", name, {"predictor": "analytic", "max_length": L + 8, "prefix": "ab"}


def _library_tokens(run: runs.Run, options: dict) -> dict:
    prompt = {k: options.pop(k) for k in ("prefix", "infill") if k in options}
    length = options.get("max_length") or L
    mask, tokens = sampling.text_conditioning(run.tokenizer, length, ROWS, **prompt)
    if mask is not None:
        options.update(fixed_mask=jnp.asarray(mask), fixed_tokens=jnp.asarray(tokens))
    out = run.sample(jax.random.key(3), ROWS, return_stats=True, **options)
    return {"tokens": np.asarray(out.tokens).tolist(), "nfe": np.asarray(out.stats["nfe_per_sample"]).tolist()}


def _serve_cases():
    for name in ("ddit", "block"):
        for sampler in ABSORBING:
            yield f"serve/{name}/{sampler}", name, sampler, False
        yield f"serve/{name}/confidence/diffusing", name, "confidence", True


def _serve_tokens(run, sampler: str, trajectory: bool) -> dict:
    from sedd import serve
    limits = serve.Limits()
    engine = serve.Engine(run, limits)
    requests = [serve.CompletionRequest(prompt="ab", max_tokens=8, n=2, seed=5, sampler=sampler),
                serve.CompletionRequest(prompt="h", max_tokens=6, n=1, seed=9, sampler=sampler,
                                        temperature=0.7, top_p=0.9)]
    if run.config.model.kind != "block":
        requests.append(serve.CompletionRequest(prompt="a", suffix="gh", n=1, seed=11, sampler=sampler))
    jobs = [serve.Job(serve.plan(run, r, limits), trajectory, concurrent.futures.Future()) for r in requests]
    results = engine.run_batch(jobs)
    out = {"tokens": [np.asarray(ids).tolist() for ids, _, _ in results],
           "nfe": [info["nfe"] for _, _, info in results]}
    if trajectory:
        out["trajectory"] = [np.asarray(traj).tolist() for _, traj, _ in results]
    return out


_RUNS: dict = {}


def _cached_run(name):
    if name not in _RUNS:
        _RUNS[name] = _run(name)
    return _RUNS[name]


def _golden() -> dict:
    if WRITE:
        return {}
    return json.loads(GOLDEN.read_text())


LIBRARY = list(_library_cases())
SERVE = list(_serve_cases())


def _check(case: str, got: dict, golden: dict) -> None:
    if WRITE:
        data = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        data[case] = got
        GOLDEN.write_text(json.dumps(data, sort_keys=True, indent=0))
        return
    assert case in golden, f"no golden tokens for {case}"
    assert got == golden[case], f"{case}: the tokens changed"


@pytest.mark.parametrize("name", list(RUNS))
def test_every_sampler_on_every_kind_draws_the_golden_tokens(name):
    golden = _golden()
    run = _cached_run(name)
    for case, run_name, options in LIBRARY:
        if run_name == name:
            _check(case, _library_tokens(run, dict(options)), golden)


@pytest.mark.parametrize("name", ["ddit", "block"])
def test_serve_draws_the_golden_tokens(name):
    pytest.importorskip("starlette")
    golden = _golden()
    run = _cached_run(name)
    for case, run_name, sampler, trajectory in SERVE:
        if run_name == name:
            _check(case, _serve_tokens(run, sampler, trajectory), golden)
