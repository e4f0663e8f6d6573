"""Device meshes, partition rules and multi-host set-up: one code path from 1 device to a pod.

Every run, on one CPU or on thousands of accelerators, goes through the same
`jax.jit(..., in_shardings=..., out_shardings=...)` calls of `sedd.train.Trainer`
(`jax.jit` with shardings is what `pjit` became). What changes between runs is
only the mesh ("data", "fsdp", "tensor"; docs/scaling.md says what each
splits), built here from the config's `mesh` section, and the `rules` that map
the parameters' logical axis names to mesh axes. A parameter dimension whose
size does not divide by its mesh axes is replicated instead, so every rule set
works for every model.

One CPU: `split_cpu` makes a host's cores several JAX devices. Multi-host:
each process runs this same program on its own devices
(`initialize_distributed`), loads only its rows of the global batch, and
`shard_batch` assembles the global array.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
from typing import Any, Iterable, Sequence

import jax
import numpy as np
from flax import nnx
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
# The batch dimension is split over both data-parallel axes.
BATCH_AXES = ("data", "fsdp")

# Logical axis name -> mesh axis (or tuple of mesh axes, or None = replicated).
# config.mesh.rules overrides entries by name.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", BATCH_AXES),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("cond", "fsdp"),
    ("freq", None),
    ("qkv", "tensor"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("adaln", "tensor"),
)

Rules = dict[str, Any]


# --------------------------------------------------------------------------- mesh


def mesh_shape(mesh_config, n_devices: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) sizes for n_devices; a single -1 takes all that remain (a ValueError naming both
    when they do not fit)."""
    requested = tuple(int(mesh_config[a]) for a in MESH_AXES)
    shown = "(" + ", ".join(f"{a}={s}" for a, s in zip(MESH_AXES, requested)) + ")"
    free = [i for i, s in enumerate(requested) if s == -1]
    if len(free) > 1 or any(s == 0 or s < -1 for s in requested):
        raise ValueError(
            f"mesh {shown} is not valid: each axis must be a positive size, and at most one may be -1 "
            "(all remaining devices)"
        )
    fixed = math.prod(s for s in requested if s != -1)
    if free:
        if n_devices % fixed:
            raise ValueError(
                f"mesh {shown} does not fit {n_devices} devices: {n_devices} is not divisible by {fixed}; "
                "set config.mesh.{data,fsdp,tensor} so that their product is the device count"
            )
        return tuple(n_devices // fixed if s == -1 else s for s in requested)
    if fixed != n_devices:
        raise ValueError(
            f"mesh {shown} needs {fixed} devices but there are {n_devices}; set config.mesh.{{data,fsdp,"
            "tensor} so that their product is the device count (or one of them to -1)"
        )
    return requested


def make_mesh(mesh_config, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The ("data", "fsdp", "tensor") mesh over `devices` (default: all devices of all processes).

    Axis types are Auto: `jax.make_mesh` now defaults to Explicit axes, which
    the sharding-in-types code of Flax and optax does not expect. mesh_config:
    anything indexable by "data", "fsdp", "tensor" (config.mesh, ``mesh_shape``).
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(mesh_config, len(devices))
    try:  # topology-aware order on TPU/GPU (tensor axis on the fastest links)
        grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
    except Exception:  # CPU and unusual topologies: plain order, process-major
        grid = np.asarray(devices, dtype=object).reshape(shape)
    return Mesh(grid, MESH_AXES)


# --------------------------------------------------------------------------- rules


def make_rules(overrides: Iterable | None = None) -> Rules:
    """DEFAULT_RULES updated with `overrides`, pairs (logical name, mesh axes).

    Mesh axes may be a name, a list/tuple of names, or None (replicated); JSON
    round trips turn tuples into lists, which are accepted.
    """
    rules = dict(DEFAULT_RULES)
    for pair in overrides or ():
        if len(pair) != 2:
            raise ValueError(f"a mesh rule is a pair (logical name, mesh axes), got {pair!r}")
        name, axes = pair
        if isinstance(axes, (list, tuple)):
            axes = tuple(axes) if len(axes) != 1 else axes[0]
        for a in axes if isinstance(axes, tuple) else (axes,):
            if a is not None and a not in MESH_AXES:
                raise ValueError(f"mesh rule {name!r} -> {axes!r}: {a!r} is not a mesh axis {MESH_AXES}")
        rules[name] = axes
    return rules


def _rules(rules) -> Rules:
    return rules if isinstance(rules, dict) else make_rules(rules)


def logical_to_mesh(names: Sequence[str | None], shape: Sequence[int], mesh: Mesh, rules=None) -> P:
    """Mesh PartitionSpec of an array of `shape` whose dimensions have logical `names`.

    A dimension is replicated when its name has no rule, when its size does not
    divide by the product of its mesh axes' sizes, or when an earlier dimension
    already uses one of those axes (a mesh axis shards at most one dimension).
    """
    rules = _rules(rules)
    if len(names) != len(shape):  # e.g. a per-parameter scalar of some optimizer: replicate
        return P()
    used: set[str] = set()
    out = []
    for name, size in zip(names, shape):
        axes = rules.get(name) if name is not None else None
        axes = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
        axes = tuple(a for a in axes if mesh.shape[a] > 1)  # size-1 axes shard nothing
        n = math.prod(mesh.shape[a] for a in axes)
        if not axes or size % n or used & set(axes):
            out.append(None)
            continue
        used |= set(axes)
        out.append(axes[0] if len(axes) == 1 else axes)
    while out and out[-1] is None:
        out.pop()
    return P(*out)


def param_shardings(tree, mesh: Mesh, rules=None):
    """NamedShardings for a pytree holding nnx Variables (an nnx.State, or a dict of them).

    Each Variable's logical names (its `out_sharding` metadata) go through
    `rules`; leaves that are not Variables (step counters, keys) are replicated.
    Works on concrete arrays and on `jax.ShapeDtypeStruct`s alike.
    """
    rules = _rules(rules)
    specs = nnx.get_partition_spec(tree)
    # An empty node (optax's MaskedNode, where a masked optimizer keeps no state) holds no array.
    return jax.tree.map(
        lambda spec, x: (
            x if not jax.tree.leaves(x) else NamedSharding(mesh, logical_to_mesh(tuple(spec), np.shape(x), mesh, rules))
        ),
        specs,
        tree,
        is_leaf=lambda s: isinstance(s, P),
    )


def optimizer_shardings(tree, shardings, mesh: Mesh):
    """ZeRO-1 along "data": the shardings of an optimizer state, each replicated matrix split over "data".

    Data-parallel devices hold the same parameters and gradients, so each can
    update a share of the optimizer's moments (Rajbhandari et al. 2020,
    "ZeRO", stage 1): a replicated leaf of two or more dimensions is split
    along "data" on its longest dimension that divides, and XLA gathers the
    update. For Muon this splits the Newton-Schulz products over the devices;
    an AdamW step, elementwise, only gains a gather (docs/scaling.md). Leaves
    already sharded keep their sharding. shardings: `param_shardings`' of tree.
    """
    n = mesh.shape["data"]

    def split(x, s):
        if n == 1 or not isinstance(s, NamedSharding) or np.ndim(x) < 2 or any(a is not None for a in s.spec):
            return s
        dims = [d for d in np.argsort(np.shape(x))[::-1] if np.shape(x)[d] % n == 0]
        if not dims:
            return s
        spec = [None] * np.ndim(x)
        spec[dims[0]] = "data"
        return NamedSharding(mesh, P(*spec))

    return jax.tree.map(split, tree, shardings, is_leaf=lambda x: not jax.tree.leaves(x))


def replicated(mesh: Mesh) -> NamedSharding:
    """A sharding that keeps a full copy of an array on every device of mesh."""
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh, rules=None) -> NamedSharding:
    """Rows of a [B, ...] batch split over the rule of "batch" (default: data x fsdp)."""
    axes = _rules(rules).get("batch", BATCH_AXES)
    return NamedSharding(mesh, P(axes))


_ROWS: contextvars.ContextVar[NamedSharding | None] = contextvars.ContextVar("sedd_rows", default=None)


@contextlib.contextmanager
def split_rows(placement: NamedSharding | None):
    """While tracing within: ``constrain_rows`` splits activations' rows as `placement` splits a batch.

    The weights' rules alone leave XLA free to split an activation
    [B, L, H] along H where ``embed`` -> ``fsdp`` splits the weights, and to
    gather the batch on every device instead of the weights (docs/scaling.md,
    "The memory plan", measured what that held). With the rows pinned at the
    layers' boundaries the weights are gathered, as FSDP means.
    """
    token = _ROWS.set(placement)
    try:
        yield
    finally:
        _ROWS.reset(token)


def constrain_rows(x: jax.Array) -> jax.Array:
    """x [B, ...] with its rows split as ``split_rows`` says and the rest whole; x itself outside it."""
    placement = _ROWS.get()
    return x if placement is None else jax.lax.with_sharding_constraint(x, placement)


def batch_divisor(mesh: Mesh, rules=None) -> int:
    """Number of row shards of a batch: the global batch size must divide by it."""
    axes = _rules(rules).get("batch", BATCH_AXES)
    axes = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
    return math.prod(mesh.shape[a] for a in axes)


def shard_batch(local_batch, mesh: Mesh, rules=None) -> jax.Array:
    """The global [B, ...] batch from each process's rows [b, ...], b = B / process_count.

    Process p holds rows [p b, (p + 1) b) of the global batch (the mesh puts each process's devices in one
    contiguous stretch of the data axes). A ValueError where B does not divide by the batch shards.
    """
    local_batch = np.asarray(local_batch)
    global_rows = local_batch.shape[0] * jax.process_count()
    n = batch_divisor(mesh, rules)
    if global_rows % n:
        raise ValueError(
            f"global batch size {global_rows} must divide by the {n} batch shards of the mesh "
            f"{dict(mesh.shape)} (data x fsdp); change training.batch_size or config.mesh"
        )
    return jax.make_array_from_process_local_data(batch_sharding(mesh, rules), local_batch)


def rows_sharding(rows: int, mesh: Mesh, rules=None) -> NamedSharding | None:
    """``batch_sharding`` for a [rows, ...] array, or None when rows does not divide by the batch shards."""
    return None if rows % batch_divisor(mesh, rules) else batch_sharding(mesh, rules)


def place_global(batch, mesh: Mesh, rules=None) -> jax.Array:
    """A [B, ...] array that every process holds in full (evaluation batches), split over the batch axes.

    Replicated when B does not divide by the number of batch shards.
    """
    if isinstance(batch, jax.Array) and not batch.is_fully_addressable:
        return batch  # already a global array
    batch = np.asarray(batch)
    sharding = (rows_sharding(batch.shape[0], mesh, rules) if batch.ndim else None) or replicated(mesh)
    return jax.make_array_from_process_local_data(sharding, batch, batch.shape)


# --------------------------------------------------------------------------- one CPU, several devices

MAX_AUTO_CPU_DEVICES = 8
"""The most devices ``split_cpu``'s auto mode makes of one host's CPU."""


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def auto_cpu_devices(batch_size: int, cores: int) -> int:
    """The largest divisor of the batch that is at most min(cores, ``MAX_AUTO_CPU_DEVICES``)."""
    cap = max(1, min(cores, MAX_AUTO_CPU_DEVICES))
    return max(d for d in range(1, cap + 1) if batch_size % d == 0)


def split_cpu(config) -> int:
    """Make this host's CPU ``config.mesh.cpu_devices`` JAX devices; returns the count set, 0 if none.

    XLA runs a small model's many small ops one after another, each split
    over all cores, and the cores wait at every op's end; one device per
    core, each with its share of the batch, keeps them busy instead
    (docs/scaling.md). The arithmetic is that of any data-parallel run.

    ``mesh.cpu_devices``: 0 (auto) takes the largest divisor of
    ``training.batch_size`` that is at most the available cores (and
    ``MAX_AUTO_CPU_DEVICES``); N > 0 takes N; 1 keeps one device. It changes
    nothing, returning 0, when it cannot be honoured silently right: auto in
    a multi-process job, a device count already chosen (``XLA_FLAGS``,
    ``jax_num_cpu_devices``), or a process that has already used a device
    (which is why `sedd train` asks for it and the library's ``train`` does
    not by default).
    """
    want = int(config.mesh.cpu_devices)
    if want < 0:
        raise ValueError(f"mesh.cpu_devices must be >= 0 (0 = auto), got {want}")
    if (
        "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
        or jax.config.jax_num_cpu_devices != -1
    ):
        return 0
    if want == 0:
        if jax.distributed.is_initialized():
            return 0
        want = auto_cpu_devices(config.training.batch_size, available_cores())
    if want == 1:
        return 0
    try:
        jax.config.update("jax_num_cpu_devices", want)
    except RuntimeError:  # a device was used already: the backends exist and keep their devices
        return 0
    return want


# --------------------------------------------------------------------------- multi-host


def initialize_distributed(config) -> bool:
    """Connect the processes of a multi-process job with `jax.distributed.initialize`.

    Must run before anything touches a device. config.mesh.distributed:
      "off": never.
      "on": always. coordinator_address, num_processes and process_id come
        from the config where set there; jax detects the rest (SLURM, Open MPI,
        Cloud TPU, $JAX_COORDINATOR_ADDRESS) and fails when it cannot.
      "auto" (default): as "on" when the config sets a coordinator address or
        jax detects a cluster; a single process otherwise.

    Returns True when this call initialized jax.distributed.
    """
    m = config.mesh
    mode = m.distributed
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"mesh.distributed must be 'auto', 'on' or 'off', got {mode!r}")
    if mode == "off" or jax.distributed.is_initialized():
        return False
    kwargs = {
        "coordinator_address": m.coordinator_address or None,  # "", 0 and -1: detected by jax
        "num_processes": m.num_processes or None,
        "process_id": m.process_id if m.process_id >= 0 else None,
    }
    try:
        jax.distributed.initialize(**kwargs)
    except (ValueError, RuntimeError):
        # "auto" without a coordinator in the config: jax found no cluster
        # (ValueError), or this process already ran JAX computations, as a
        # notebook or a test suite does (RuntimeError): it stays one process.
        if mode == "on" or kwargs["coordinator_address"]:
            raise
        return False
    return True
