"""The shape of the library: one place that tells model kinds apart, one sampler call, short functions."""

import ast
import inspect
from pathlib import Path

import jax
import numpy as np
import pytest

from sedd import graphs, kinds, noise, sampling

SEDD = Path(__file__).resolve().parents[1] / "sedd"


def _modules():
    for path in sorted(SEDD.rglob("*.py")):
        yield path, ast.parse(path.read_text())


def test_model_kind_is_read_only_by_the_kind_builder():
    """No module but sedd/kinds.py reads config.model.kind or compares a kind's name."""
    found = []
    for path, tree in _modules():
        if path.name == "kinds.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and node.attr == "kind" \
                    and isinstance(node.value, ast.Attribute) and node.value.attr == "model":
                found.append(f"{path.name}:{node.lineno} reads model.kind")
            if isinstance(node, ast.Compare):
                names = [n for n in [node.left, *node.comparators] if isinstance(n, ast.Constant)]
                if any(n.value in kinds.KINDS for n in names) and "kind" in ast.unparse(node):
                    found.append(f"{path.name}:{node.lineno} compares with a kind's name")
            if isinstance(node, ast.Name) and node.id in ("ar_model", "is_ar"):
                found.append(f"{path.name}:{node.lineno} {node.id}")
    assert not found, found


def test_functions_are_short():
    """No function of sedd/ is longer than 120 lines, but train(), whose banner sections read linearly."""
    long = [f"{path.name}:{node.name} {node.end_lineno - node.lineno + 1} lines"
            for path, tree in _modules() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > 120 and (path.name, node.name) != ("train.py", "train")]
    assert not long, long


def test_sample_has_one_signature_and_one_return_type():
    params = inspect.signature(sampling.sample).parameters
    assert len(params) <= 14, list(params)
    assert list(params)[:11] == ["key", "score_fn", "graph", "noise", "shape", "steps", "predictor", "denoise",
                                 "eps", "fixed_mask", "fixed_tokens"]
    graph, sched = graphs.Absorbing(3), noise.LogLinear(1e-3)

    def score_fn(x, sigma):  # any log-score: the shape of the result is what is checked
        return jax.numpy.zeros(x.shape + (graph.dim,))

    for asked in ({}, {"return_stats": True}, {"return_trajectory": True},
                  {"return_stats": True, "return_trajectory": True}):
        out = sampling.sample(jax.random.key(0), score_fn, graph, sched, (2, 4), 3, **asked)
        assert isinstance(out, sampling.Samples) and out.tokens.shape == (2, 4)
        assert (out.stats is not None) == bool(asked.get("return_stats"))
        assert (out.trajectory is not None) == bool(asked.get("return_trajectory"))


def test_options_value_and_keywords_draw_alike():
    """An Options value, the same options as keywords, and keywords over a value: the same draws."""
    graph, sched = graphs.Absorbing(3), noise.LogLinear(1e-3)
    logits = jax.numpy.log(jax.numpy.array([0.5, 0.3, 0.2]))

    def score_fn(x, sigma):  # a product law's absorbing score: p(x0) / (e^sigma - 1) at the tokens
        tokens = logits - graphs.log_expm1(sigma)[:, None, None]
        return jax.numpy.concatenate([jax.numpy.broadcast_to(tokens, x.shape + (3,)),
                                      jax.numpy.zeros(x.shape + (1,))], -1)

    key = jax.random.key(1)
    kw = sampling.sample(key, score_fn, graph, sched, (64, 4), 4, predictor="confidence", order="random",
                         top_p=0.9).tokens
    value = sampling.sample(key, score_fn, graph, sched, (64, 4), 4, predictor="confidence",
                            options=sampling.Options.make(order="random", top_p=0.9)).tokens
    over = sampling.sample(key, score_fn, graph, sched, (64, 4), 4, predictor="confidence",
                           options=sampling.Options.make(order="random", top_p=0.5), top_p=0.9).tokens
    np.testing.assert_array_equal(kw, value)
    np.testing.assert_array_equal(kw, over)
    with pytest.raises(ValueError, match="takes no option"):
        sampling.Options.make(order="random").checked("analytic", graph)


def test_an_unknown_kind_names_the_registered_ones():
    from sedd import config as config_lib
    c = config_lib.load_config("tiny")
    c.vocab_size = 5
    c.model.kind = "diffusion"
    with pytest.raises(ValueError, match="unknown model.kind 'diffusion'; expected one of 'ddit', 'ar'"):
        kinds.get(c)
