"""The memory paths change no number: the chunked loss (training.loss_chunk), rematerialised
layers (model.remat) and the padded vocabulary (model.vocab_multiple) against the plain model,
values and gradients, on every loss form; their errors. The memory they save is measured by
`bench.py memory` (docs/scaling.md), not here."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sedd import config as config_lib
from sedd import kinds, model as model_lib

GPT2 = 50257


def _config(overrides=(), vocab=85):
    c = config_lib.load_config("tiny", list(overrides))
    c.unlock()
    c.vocab_size = vocab
    return c


def _perturbed(net, seed=1, scale=0.05):
    """The network's weights plus noise: zero-initialised layers (adaLN, the output) made to matter."""
    graphdef, params, rest = nnx.split(net, nnx.Param, ...)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    params = jax.tree.unflatten(tree, [p + scale * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys)])
    return graphdef, params, rest


def _loss_and_grads(config, chunk, weights, x0, dropout_key=None):
    """Mean training loss of x0 and its gradient, with training.loss_chunk = chunk."""
    config.training.loss_chunk = chunk
    kind = kinds.get(config)
    graphdef, params, rest = weights

    def loss(params):
        net = nnx.merge(graphdef, params, rest)
        return kind.loss(jax.random.key(3), net, x0, True, rngs=dropout_key).mean()

    return jax.jit(jax.value_and_grad(loss))(params)


def _assert_same(a, b, rtol=1e-5):
    (la, ga), (lb, gb) = a, b
    np.testing.assert_allclose(float(lb), float(la), rtol=rtol)
    for path, x, y in zip(jax.tree.leaves_with_path(ga), jax.tree.leaves(ga), jax.tree.leaves(gb)):
        scale = float(jnp.max(jnp.abs(x))) or 1.0
        np.testing.assert_allclose(
            np.asarray(y) / scale, np.asarray(x) / scale, atol=rtol, err_msg=jax.tree_util.keystr(path[0])
        )


FORMS = {
    "absorbing": ["--config.model.normalize=False"],
    "absorbing_unscaled": ["--config.model.scale_by_sigma=False", "--config.model.normalize=False"],
    "uniform": ["--config.graph.type=uniform", "--config.model.scale_by_sigma=False", "--config.model.normalize=False"],
    "subs": ["--config.model.normalize=True"],
    "time_independent": ["--config.model.time_conditioning=False"],
    "ar": ["--config.model.kind=ar"],
}


# Three forms by default (the score entropy scaled and not, the AR cross-entropy); the rest with -m slow, to keep
# the default suite within 900 CPU s.
CHUNKED_CORE = ("absorbing", "uniform", "ar")


@pytest.mark.parametrize(
    "form", [f if f in CHUNKED_CORE else pytest.param(f, marks=pytest.mark.slow) for f in sorted(FORMS)]
)
def test_chunked_loss_equals_plain(form):
    """Chunks of 8 of L = 32 positions: the same loss and gradients, float32, rel 1e-5."""
    config = _config(FORMS[form])
    weights = _perturbed(kinds.build_model(config))
    x0 = jax.random.randint(jax.random.key(2), (4, config.data.seq_len), 0, config.vocab_size)
    _assert_same(_loss_and_grads(config, 0, weights, x0), _loss_and_grads(config, 8, weights, x0))


@pytest.mark.parametrize("form", ["absorbing", "ar"])
def test_chunked_loss_equals_plain_at_gpt2_vocabulary(form):
    """V = 50,257 (GPT-2) with a tiny network; the vocabulary padded to 128 as owt_small's."""
    config = _config(FORMS[form] + ["--config.model.vocab_multiple=128", "--config.data.seq_len=16"], vocab=GPT2)
    weights = _perturbed(kinds.build_model(config))
    x0 = jax.random.randint(jax.random.key(2), (2, 16), 0, GPT2)
    _assert_same(_loss_and_grads(config, 0, weights, x0), _loss_and_grads(config, 4, weights, x0))


@pytest.mark.parametrize("remat", ["dots", "layers"])
def test_remat_changes_no_gradient(remat):
    config = _config(["--config.training.loss_chunk=8"])
    weights = _perturbed(kinds.build_model(config))
    x0 = jax.random.randint(jax.random.key(2), (4, config.data.seq_len), 0, config.vocab_size)
    plain = _loss_and_grads(config, 8, weights, x0)
    config.model.remat = remat
    _assert_same(plain, _loss_and_grads(config, 8, _perturbed(kinds.build_model(config)), x0))


def test_remat_draws_dropout():
    """With remat and dropout the loss is not the dropout-free one, and another key draws other masks."""
    config = _config(["--config.model.remat=layers", "--config.model.dropout=0.3"])
    weights = _perturbed(kinds.build_model(config))
    x0 = jax.random.randint(jax.random.key(2), (4, config.data.seq_len), 0, config.vocab_size)
    one = float(_loss_and_grads(config, 0, weights, x0, jax.random.key(7))[0])
    other = float(_loss_and_grads(config, 0, weights, x0, jax.random.key(8))[0])
    config.model.dropout = 0.0
    off = float(_loss_and_grads(config, 0, _perturbed(kinds.build_model(config)), x0)[0])
    assert len({one, other, off}) == 3


@pytest.mark.parametrize("kind", ["ddit", "ar"])
def test_padded_vocabulary_is_the_same_network(kind):
    """vocab_multiple=128: tables of 128-multiple rows; copied weights give the same output; the padding
    columns get no gradient, so they stay 0."""
    plain_config = _config([f"--config.model.kind={kind}"])
    padded_config = _config([f"--config.model.kind={kind}", "--config.model.vocab_multiple=128"])
    plain = nnx.merge(*_perturbed(kinds.build_model(plain_config)))
    padded = kinds.build_model(padded_config)
    rows, cols = plain.vocab_embed.embedding.shape[0], plain.output_layer.linear.kernel.shape[1]
    assert padded.vocab_embed.embedding.shape[0] == model_lib.padded(rows, 128) == 128
    assert padded.output_layer.linear.kernel.shape[1] == 128
    padded.vocab_embed.embedding[...] = (
        padded.vocab_embed.embedding[...].at[:rows].set(plain.vocab_embed.embedding[...])
    )
    padded.output_layer.linear.kernel[...] = (
        jnp.zeros((32, 128)).at[:, :cols].set(plain.output_layer.linear.kernel[...])
    )
    padded.output_layer.linear.bias[...] = jnp.zeros((128,)).at[:cols].set(plain.output_layer.linear.bias[...])
    for name in ("layers", "sigma_map"):
        if getattr(plain, name) is not None:
            nnx.update(getattr(padded, name), nnx.state(getattr(plain, name)))
    nnx.update(padded.output_layer.norm_final, nnx.state(plain.output_layer.norm_final))
    nnx.update(padded.output_layer.adaLN_modulation, nnx.state(plain.output_layer.adaLN_modulation))
    x = jax.random.randint(jax.random.key(2), (2, 32), 0, 85)
    sigma = None if kind == "ar" else jnp.array([0.5, 2.0])
    output = nnx.jit(lambda net, x, sigma: net.network_output(x, sigma))  # eagerly: an op a compile
    out = output(padded, x, sigma)
    assert out.shape == (2, 32, cols)
    # Equal up to the rounding of a product of another width (XLA blocks it otherwise).
    np.testing.assert_allclose(out, output(plain, x, sigma), rtol=1e-5, atol=1e-6)
    graphdef, params, rest = nnx.split(padded, nnx.Param, ...)
    grads = jax.jit(
        jax.grad(
            lambda p: kinds.get(padded_config).loss(jax.random.key(3), nnx.merge(graphdef, p, rest), x, False).mean()
        )
    )(params)
    assert not np.any(grads["output_layer"]["linear"]["kernel"][...][:, cols:])
    assert np.any(grads["output_layer"]["linear"]["kernel"][...][:, :cols])


def test_bad_memory_settings_are_named():
    config = _config(["--config.training.loss_chunk=5"])
    weights = _perturbed(kinds.build_model(config))
    x0 = jnp.zeros((2, 32), jnp.int32)
    with pytest.raises(ValueError, match="loss_chunk=5 must divide the sequence length L=32"):
        _loss_and_grads(config, 5, weights, x0)
    with pytest.raises(ValueError, match="remat='all' must be one of 'none', 'dots', 'layers'"):
        kinds.build_model(_config(["--config.model.remat=all"]))
    with pytest.raises(ValueError, match="vocab_multiple=0 must be an integer >= 1"):
        kinds.build_model(_config(["--config.model.vocab_multiple=0"]))
    with pytest.raises(ValueError, match="loss_chunk=8 is not implemented for model.kind='block'"):
        kinds.get(_config(["--config.model.kind=block", "--config.training.loss_chunk=8"]))


def test_old_runs_keep_unpadded_tables():
    """A run saved before model.vocab_multiple existed loads with its unpadded shapes."""
    saved = config_lib.load_config("owt_small").to_dict()
    del saved["model"]["vocab_multiple"]
    assert config_lib.migrate(saved).model.vocab_multiple == 1


_PLAN = """
import importlib.util, json, sys
import jax
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", 2)
spec = importlib.util.spec_from_file_location("bench", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
sizes = ["--config.model.hidden_size=256", "--config.model.n_layers=2", "--config.model.n_heads=4",
         "--config.training.batch_size=8", "--config.data.seq_len=128", "--config.training.loss_chunk=32"]
temp = lambda c: bench.train_step_memory(c)["temp_size_in_bytes"]
out = {}
for axis in ("data", "fsdp"):
    out[axis] = temp(bench.memory_config("tiny", sizes, {"data": 1, "fsdp": 1, "tensor": 1, axis: 2}))
if sys.argv[2] == "plan":
    config = bench.memory_config("tiny", sizes, {"data": 2})
    none_peak = bench.train_step_memory(config)["peak_bytes_estimate"]
    out["limit"] = 0.9 * none_peak
    plan = bench.memory_plan(config, device_gib=out["limit"] / 2**30)
    out["fit"] = plan["fit"] and [plan["fit"]["remat"], plan["fit"]["accum_steps"]]
    out["tried"] = [[r["remat"], r["accum_steps"], r["peak_bytes_estimate"]] for r in plan["rows"]]
    config.training.batch_size = 2  # one sequence a device: the plan's only accum_steps
    out["nothing"] = bench.memory_plan(config, device_gib=1e-6)["fit"]
print("RESULT " + json.dumps(out))
"""


def _plan(*args):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # conftest's cheaper compilation (the same buffer sizes within 64 bytes, in half the time), without a device
    # count: the script sets its own.
    env["XLA_FLAGS"] = " ".join(
        f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")
    )
    proc = subprocess.run(
        [sys.executable, "-c", _PLAN, str(root / "experiments/benchmarks/bench.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads([l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1][7:])


@pytest.mark.slow  # a memory analysis on 8 fake devices in a subprocess: behind -m slow to keep the default suite within 900 CPU s
def test_fsdp_splits_activations_by_rows():
    """On 2 fake CPU devices the fsdp step holds what the data-parallel one does: 1.06x its temporaries
    (1.52x before the rows were pinned, activations split along H as the weights, the batch gathered)."""
    out = _plan("rows")
    assert out["fsdp"] <= 1.25 * out["data"], out


@pytest.mark.slow  # 12 compiles: 2-4 min on 2 cores
def test_memory_plan_picks_the_cheapest_setting_that_fits():
    """Under a device 10% smaller than the config needs, the plan's settings come in their order of cost
    (accum_steps 1, 2, ...; remat none, dots, layers within each), every one before the fit is over the
    size and the fit within it; under a device too small for anything, no setting."""
    out = _plan("plan")
    order = {"none": 0, "dots": 1, "layers": 2}
    tried = out["tried"][1:]  # after the config as shipped (no remat, accum_steps 1): over the size
    assert out["tried"][0][2] > out["limit"] and tried, out
    assert [(a, order[r]) for r, a, _ in tried] == sorted((a, order[r]) for r, a, _ in tried), out
    assert all(peak > out["limit"] for _, _, peak in tried[:-1]) and tried[-1][2] <= out["limit"], out
    assert out["fit"] == tried[-1][:2], out
    assert out["nothing"] is None


def test_bad_plan_arguments_are_named(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "experiments/benchmarks/bench.py"
    spec = importlib.util.spec_from_file_location("bench_for_args", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with pytest.raises(SystemExit):
        bench.main(["memory", "--mesh", "data=8,pipe=2"])
    assert "'pipe=2' is not AXIS=SIZE with AXIS one of data, fsdp, tensor" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["memory", "--device_gib", "0"])
    assert "--device_gib must be a positive size in GiB, got 0.0" in capsys.readouterr().err
