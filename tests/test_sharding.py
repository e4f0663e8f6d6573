"""Sharded training: the same losses on every mesh, checkpoints across meshes, multi-process.

Device meshes need several devices, and jax fixes its device count at import,
so the mesh tests run in subprocesses with 8 fake CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=8); the multi-process test
starts 2 processes that connect through jax.distributed (gloo collectives on
the CPU) on localhost.
"""

from __future__ import annotations

import json
import os
import socket
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from sedd import config as config_lib
from sedd import checkpoints, runs, sharding
from sedd import train as train_lib

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str, n_devices: int, tmp_path: Path, *args: str, wait: bool = True):
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n_devices}".strip()
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["SEDD_DATA_DIR"] = str(tmp_path / "data")
    env["JAX_PLATFORMS"] = "cpu"
    cmd = [sys.executable, "-c", textwrap.dedent(code), *args]
    if not wait:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return _result(proc.stdout)


def _result(stdout: str) -> dict:
    lines = [l for l in stdout.splitlines() if l.startswith("RESULT ")]
    assert lines, stdout[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


# --------------------------------------------------------------------------- in this process


def test_mesh_shape_fills_minus_one_and_names_shape_and_device_count():
    assert sharding.mesh_shape({"data": -1, "fsdp": 2, "tensor": 1}, 8) == (4, 2, 1)
    assert sharding.mesh_shape({"data": 2, "fsdp": 2, "tensor": 2}, 8) == (2, 2, 2)
    with pytest.raises(ValueError, match=r"data=3, fsdp=1, tensor=1.*needs 3 devices but there are 8"):
        sharding.mesh_shape({"data": 3, "fsdp": 1, "tensor": 1}, 8)
    with pytest.raises(ValueError, match=r"data=-1, fsdp=3, tensor=1.*does not fit 8 devices"):
        sharding.mesh_shape({"data": -1, "fsdp": 3, "tensor": 1}, 8)
    with pytest.raises(ValueError, match="at most one may be -1"):
        sharding.mesh_shape({"data": -1, "fsdp": -1, "tensor": 1}, 8)


def test_rules_from_config_override_defaults():
    rules = sharding.make_rules([["embed", None], ["mlp", ["fsdp", "tensor"]]])
    assert rules["embed"] is None and rules["mlp"] == ("fsdp", "tensor") and rules["qkv"] == "tensor"
    with pytest.raises(ValueError, match="'model' is not a mesh axis"):
        sharding.make_rules([["embed", "model"]])


def test_train_reads_the_mesh_and_rejects_one_that_does_not_fit(tmp_path):
    c = config_lib.load_config("tiny")
    n = jax.device_count()
    c.mesh.data = n + 2
    with pytest.raises(ValueError, match=rf"data={n + 2}, fsdp=1, tensor=1.*there are {n}"):
        train_lib.train(c, tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()  # failed before touching the run directory


def test_auto_cpu_devices_divide_the_batch_within_the_cores():
    assert sharding.auto_cpu_devices(32, 2) == 2
    assert sharding.auto_cpu_devices(32, 6) == 4
    assert sharding.auto_cpu_devices(30, 16) == 6  # at most MAX_AUTO_CPU_DEVICES = 8
    assert sharding.auto_cpu_devices(7, 4) == 1
    assert sharding.auto_cpu_devices(32, 1) == 1


def test_split_cpu_acts_only_before_any_device_is_used(tmp_path):
    """A fresh process gets the devices asked for; one whose devices exist (this one), or whose
    XLA_FLAGS chose a count, is left as it is; a negative count is refused."""
    config = config_lib.load_config("tiny")
    jax.devices()
    config.mesh.cpu_devices = 3
    assert sharding.split_cpu(config) == 0 and jax.device_count() == len(jax.devices())
    config.mesh.cpu_devices = -1
    with pytest.raises(ValueError, match="mesh.cpu_devices"):
        sharding.split_cpu(config)
    code = """
    import json, sys, jax
    from sedd import config as C, sharding as S
    c = C.load_config("tiny")
    c.mesh.cpu_devices = int(sys.argv[1])
    n = S.split_cpu(c)
    print("RESULT " + json.dumps({"set": n, "devices": jax.device_count()}))
    """
    assert _python(code, 4, tmp_path, "3") == {"set": 0, "devices": 4}  # XLA_FLAGS chose 4
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""), JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), "3"], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _result(proc.stdout) == {"set": 3, "devices": 3}


def test_distributed_is_a_no_op_for_a_single_process(monkeypatch):
    for v in ("JAX_COORDINATOR_ADDRESS", "SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri", "TPU_WORKER_HOSTNAMES"):
        monkeypatch.delenv(v, raising=False)
    assert sharding.initialize_distributed(config_lib.load_config("tiny")) is False
    with pytest.raises(ValueError, match="'auto', 'on' or 'off'"):
        sharding.initialize_distributed(config_lib.load_config("tiny", ["--config.mesh.distributed=maybe"]))


# --------------------------------------------------------------------------- 8 fake devices

_MESHES = """
import json, tempfile
import jax, numpy as np
import orbax.checkpoint as ocp
from sedd import checkpoints, config as C, runs, sharding as S, train as T

cfg = C.load_config("tiny")
cfg.vocab_size = 65  # D = 66: divides by 2, not by 8 (the replication fallback)
cfg.model.n_layers = 1  # every rule is met in one block, and 4 meshes compile 30% faster than with 2
rng = np.random.default_rng(0)
# Three steps: the output layer starts at zero, so the blocks' first gradients are zero and only the third
# loss reads weights that a sharded update of the blocks wrote.
batches = [rng.integers(0, 65, (8, 32)).astype(np.int32) for _ in range(3)]
out = {"losses": {}, "specs": {}, "eval": {}, "samples": {}}
trainers, states = {}, {}
for shape in [(1, 1, 1), (8, 1, 1), (2, 2, 2), (1, 1, 8)]:
    mesh = S.make_mesh(dict(zip(S.MESH_AXES, shape)), jax.devices()[: int(np.prod(shape))])
    tr = T.Trainer(cfg, mesh)
    st = tr.init_state()
    losses = []
    for b in batches:
        st, m = tr.train_step(st, tr.shard_batch(b))
        losses.append(float(m["loss_nats_per_token"]))
    name = "x".join(map(str, shape))
    out["losses"][name] = losses
    p = st["params"]
    # The optimizer's first moment of layers[0].mlp_in (Muon's or AdamW's, whichever holds it).
    mu = next(x for path, x in jax.tree_util.tree_flatten_with_path(st["opt_state"])[0]
              if ".mu['layers'][0]['mlp_in']['kernel']" in jax.tree_util.keystr(path))
    out["specs"][name] = {
        "mlp_in": str(p["layers"][0]["mlp_in"]["kernel"][...].sharding.spec),
        "attn_qkv": str(p["layers"][0]["attn_qkv"]["kernel"][...].sharding.spec),
        "embedding": str(p["vocab_embed"]["embedding"][...].sharding.spec),
        "mu_mlp_in": str(mu.sharding.spec),
        "ema_mlp_in": str(st["ema"]["layers"][0]["mlp_in"]["kernel"][...].sharding.spec),
        "step": str(st["step"].sharding.spec),
        "batch": str(tr.shard_batch(batches[0]).sharding.spec),
    }
    if shape in [(1, 1, 1), (8, 1, 1), (2, 2, 2)]:  # evaluation and sampling on sharded parameters
        out["eval"][name] = float(tr.loss_step(st["ema"], batches[0], jax.random.key(0)).sum())
        run = runs.from_parts(cfg, None, tr.graphdef, st["ema"], tr.rest, mesh=mesh)
        # What Run.sample runs (before its NumPy copy): the rows stay split over the data axis through the
        # loop, the score function constraining its input.
        x = run.kind.sample(jax.random.key(1), run.net._replace(placement=run.row_sharding(8)), 8, 2).tokens
        out["samples"][name] = np.asarray(x).tolist()
        out["specs"][name]["samples"] = str(x.sharding.spec)
    trainers[shape], states[shape] = tr, st

# Dropout masks and race words (sedd.rng) drawn into arrays split over a mesh equal the one-device draws.
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from sedd import rng
shape, key = (8, 4, 40), jax.random.key(3)
draw = lambda k, x: (rng.uint16(k, x.shape) * x, *(w * x for w in rng.words(k, x.shape)))
one = [np.asarray(a) for a in jax.jit(draw)(key, jnp.ones(shape, jnp.uint32))]
out["rng"] = {}
for shape_m, spec in [((2, 2, 2), P(("data", "fsdp"), None, "tensor")), ((1, 1, 8), P(None, None, "tensor"))]:
    mesh = S.make_mesh(dict(zip(S.MESH_AXES, shape_m)), jax.devices())
    x = jax.device_put(jnp.ones(shape, jnp.uint32), NamedSharding(mesh, spec))
    split = jax.jit(draw)(key, x)
    out["rng"]["x".join(map(str, shape_m))] = [bool(np.array_equal(a, np.asarray(b))) for a, b in zip(one, split)] + [
        str(split[0].sharding.spec)]

# A checkpoint written on the 2 x 2 x 2 mesh, restored onto 1 x 1 x 8 and onto one device.
with tempfile.TemporaryDirectory() as d:
    mgr = checkpoints.checkpoint_manager(d, cfg)
    mgr.save(2, args=ocp.args.Composite(state=ocp.args.PyTreeSave(states[(2, 2, 2)])), force=True)
    mgr.wait_until_finished()
    out["restore"] = {}
    for shape in [(1, 1, 8), (1, 1, 1)]:
        tr = trainers[shape]
        r = checkpoints.restore(checkpoints.checkpoint_manager(d), tr.abstract_state)
        same = all(
            np.array_equal(np.asarray(a), np.asarray(b))
            for a, b in zip(jax.tree.leaves(r), jax.tree.leaves(states[(2, 2, 2)]))
        )
        spec_ok = all(
            a.sharding == s for a, s in zip(jax.tree.leaves(r), jax.tree.leaves(tr.state_sharding))
        )
        r, m = tr.train_step(r, tr.shard_batch(batches[0]))
        out["restore"]["x".join(map(str, shape))] = [same, spec_ok, float(m["loss_nats_per_token"])]
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def meshes(tmp_path_factory):
    return _python(_MESHES, 8, tmp_path_factory.mktemp("meshes"))


def test_every_mesh_gives_the_one_device_losses(meshes):
    ref = meshes["losses"]["1x1x1"]
    assert ref[1] < ref[0]  # it trains
    for name, losses in meshes["losses"].items():
        np.testing.assert_allclose(losses, ref, rtol=2e-6, err_msg=name)
    for name in ("8x1x1", "2x2x2"):
        np.testing.assert_allclose(meshes["eval"][name], meshes["eval"]["1x1x1"], rtol=2e-6)


def test_random_words_do_not_depend_on_the_mesh(meshes):
    # sedd.rng numbers the elements with iotas, so a split draw (dropout's uint16 words, the race's two
    # uint32 words) is the one-device draw, shard by shard (the partitioner keeps the input's split).
    for name, (*same, spec) in meshes["rng"].items():
        assert all(same), (name, same)
        assert "tensor" in spec, (name, spec)


def test_parameters_are_sharded_as_the_rules_say(meshes):
    s = meshes["specs"]
    # One device and pure data parallelism: parameters replicated, the batch split over data.
    for name in ("1x1x1", "8x1x1"):
        assert s[name]["mlp_in"] == s[name]["embedding"] == "P()"
    assert s["8x1x1"]["batch"] == "P(('data', 'fsdp'),)"
    # ZeRO-1: a replicated parameter's moments split along data on their longest dimension (mlp_in: 32 x 128).
    assert s["1x1x1"]["mu_mlp_in"] == "P()"
    assert s["8x1x1"]["mu_mlp_in"] == "P(None, 'data')"
    # embed -> fsdp, mlp/qkv -> tensor, vocab -> tensor; Adam moments and EMA follow their parameter.
    assert s["2x2x2"]["mlp_in"] == "P('fsdp', 'tensor')"
    assert s["2x2x2"]["attn_qkv"] == "P('fsdp', 'tensor')"
    assert s["2x2x2"]["embedding"] == "P('tensor', 'fsdp')"
    assert s["2x2x2"]["mu_mlp_in"] == s["2x2x2"]["ema_mlp_in"] == s["2x2x2"]["mlp_in"]
    assert s["2x2x2"]["step"] == "P()"
    # 8-way tensor parallelism: mlp (128) and qkv (96) split; the vocabulary (66) does not divide: replicated.
    assert s["1x1x8"]["mlp_in"] == "P(None, 'tensor')"
    assert s["1x1x8"]["attn_qkv"] == "P(None, 'tensor')"
    assert s["1x1x8"]["embedding"] == "P()"


def test_sampling_runs_sharded_and_matches_one_device(meshes):
    a = np.asarray(meshes["samples"]["1x1x1"])
    assert a.shape == (8, 32)
    for name in ("8x1x1", "2x2x2"):
        assert (a == np.asarray(meshes["samples"][name])).mean() > 0.99  # rounding may flip a rare draw
    # Run.sample's rows stay split over the batch axes: each device samples its own rows.
    assert meshes["specs"]["8x1x1"]["samples"] in ("P('data',)", "P(('data', 'fsdp'),)")  # fsdp has size 1
    assert meshes["specs"]["2x2x2"]["samples"] == "P(('data', 'fsdp'),)"


def test_checkpoint_restores_onto_another_mesh(meshes):
    for name, (same, spec_ok, loss) in meshes["restore"].items():
        assert same and spec_ok, name
    np.testing.assert_allclose(meshes["restore"]["1x1x8"][2], meshes["restore"]["1x1x1"][2], rtol=2e-6)


# --------------------------------------------------------------------------- 2 processes

_TRAIN = """
import json, sys
n_proc, pid, port, workdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
from sedd import config as C, train as T
cfg = C.load_config("tiny")
cfg.training.n_iters = 3
cfg.training.log_every = 1
cfg.training.eval_every = 1000
cfg.training.ckpt_every = 1000
cfg.training.eval_batches = 1
cfg.training.eval_samples = 2
cfg.sampling.steps = 2
# The memory paths of big configs: blocks recomputed (a scan), the loss 8 positions at a time,
# the vocabulary padded to 128 rows (86 -> 128, which fsdp = 2 splits).
cfg.model.remat, cfg.training.loss_chunk, cfg.model.vocab_multiple = "layers", 8, 128
if n_proc > 1:
    cfg.mesh.coordinator_address = f"localhost:{port}"
    cfg.mesh.num_processes = n_proc
    cfg.mesh.process_id = pid
    cfg.mesh.data, cfg.mesh.fsdp = 2, -1  # 2 x 2 x 1 over 2 processes of 2 devices each
res = T.train(cfg, workdir, quiet=True)
import jax
res["process_count"], res["device_count"] = jax.process_count(), jax.device_count()
print("RESULT " + json.dumps(res))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _losses(workdir: Path) -> list[float]:
    return [json.loads(l)["loss_nats_per_token"] for l in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # 45 s on 2 cores; two processes still train and stop together in the sigterm test below
def test_two_processes_train_like_one(tmp_path):
    """2 processes x 2 devices, data = 2 x fsdp = 2, with remat, the chunked loss and the padded vocabulary."""
    one = _python(_TRAIN, 1, tmp_path, "1", "0", "0", str(tmp_path / "one"))
    port = str(_free_port())
    procs = [_python(_TRAIN, 2, tmp_path, "2", str(i), port, str(tmp_path / "two"), wait=False) for i in range(2)]
    outs = []
    for p in procs:
        try:
            stdout, _ = p.communicate(timeout=300)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 0, stdout[-5000:]
        outs.append(_result(stdout))
    assert [o["process_count"] for o in outs] == [2, 2] and outs[0]["device_count"] == 4
    np.testing.assert_allclose(_losses(tmp_path / "two"), _losses(tmp_path / "one"), rtol=2e-6)
    assert len(_losses(tmp_path / "two")) == 3  # process 0 alone wrote the metrics
    for o in outs:
        np.testing.assert_allclose(o["val_estimate_nats_per_token"], one["val_estimate_nats_per_token"], rtol=2e-6)
        np.testing.assert_allclose(o["bound"]["nats_per_token"], one["bound"]["nats_per_token"], rtol=2e-5)
        assert o["samples"] == one["samples"]
    # Both processes wrote their shards of one checkpoint through orbax.
    assert checkpoints.checkpoint_manager(tmp_path / "two").latest_step() == 3
    # ... which this single process loads for sampling onto all of its devices: the run's 2 x -1 x 1 mesh
    # when they can form it, else all of them on the data axis.
    two = runs.load(tmp_path / "two")
    assert two.mesh.devices.size == jax.device_count()
    if jax.device_count() % 2:
        assert dict(two.mesh.shape) == {"data": jax.device_count(), "fsdp": 1, "tensor": 1}
    ema, ema_one = two.params, runs.load(tmp_path / "one").params
    for a, b in zip(jax.tree.leaves(ema), jax.tree.leaves(ema_one)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


_STOP = """
import json, sys
pid, port, workdir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
from sedd import config as C, train as T
cfg = C.load_config("tiny", ["--config.training.n_iters=100000", "--config.training.log_every=1",
                             "--config.training.eval_every=100000", "--config.training.ckpt_every=100000",
                             "--config.model.n_layers=1",  # the signal does not depend on depth: a faster compile
                             f"--config.mesh.coordinator_address=localhost:{port}",
                             "--config.mesh.num_processes=2", f"--config.mesh.process_id={pid}"])
res = T.train(cfg, workdir, quiet=True)
print("RESULT " + json.dumps(res))
"""


@pytest.mark.slow  # two processes of a multi-process job; the meshes' exactness stays in the default suite: behind -m slow to keep the default suite within 900 CPU s
def test_sigterm_to_one_of_two_processes_stops_both_at_the_same_step(tmp_path):
    """A signal reaches one host only; both agree on it, save the same step and exit."""
    port = str(_free_port())
    procs = [_python(_STOP, 1, tmp_path, str(i), port, str(tmp_path / "run"), wait=False) for i in range(2)]
    metrics = tmp_path / "run" / "metrics.jsonl"
    try:
        deadline = time.time() + 240
        while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
            assert all(p.poll() is None for p in procs), [p.stdout.read()[-3000:] for p in procs]
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGTERM)  # the process that writes nothing
        sent = time.time()
        outs = [p.communicate(timeout=120)[0] for p in procs]
        waited = time.time() - sent
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], [o[-3000:] for o in outs]
    results = [_result(o) for o in outs]
    assert all(r["stopped"] for r in results)
    assert results[0]["step"] == results[1]["step"] < 100000
    assert checkpoints.checkpoint_manager(tmp_path / "run").latest_step() == results[0]["step"]
    assert waited < 60
