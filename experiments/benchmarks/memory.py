"""`bench.py memory`: XLA's memory analysis of the compiled train step a device, and the cheapest setting that fits."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.timing import format_table
from sedd import config as config_lib
from sedd import sharding
from sedd.train import Trainer


def train_step_memory(config, mesh: jax.sharding.Mesh | None = None) -> dict:
    """XLA's memory analysis of the compiled train step, one device's bytes, from abstract inputs (nothing allocated).

    On a mesh of several devices the compiled program is one device's part of
    the SPMD step, so every figure is per device.
    """
    t0 = time.perf_counter()
    trainer = Trainer(config, mesh)
    state = trainer.abstract_state
    batch = jax.ShapeDtypeStruct(
        (config.training.batch_size, config.data.seq_len), jnp.int32, sharding=trainer.batch_sharding
    )
    compiled = trainer.train_step.lower(state, batch).compile()
    ma = compiled.memory_analysis()
    fields = (
        "argument_size_in_bytes",
        "output_size_in_bytes",
        "alias_size_in_bytes",
        "temp_size_in_bytes",
        "generated_code_size_in_bytes",
    )
    out = {f: int(getattr(ma, f, 0) or 0) for f in fields} if ma is not None else {}
    if out:
        # Donated state buffers are reused for the outputs (alias), so they count once.
        out["peak_bytes_estimate"] = (
            out["argument_size_in_bytes"]
            + out["output_size_in_bytes"]
            - out["alias_size_in_bytes"]
            + out["temp_size_in_bytes"]
        )
    state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
    out.update(
        {
            "n_params": trainer.n_params,
            "state_bytes": int(state_bytes),
            "devices": len(trainer.mesh.devices.flat),
            "mesh": dict(trainer.mesh.shape),
            "compile_s": time.perf_counter() - t0,
        }
    )
    return out


# The vocabulary each config trains with (set from the tokenizer in a real run): the plays give 85 ids.
SHIPPED_VOCAB = {
    "shakespeare_char": 85,
    "shakespeare_wide": 85,
    "tiny": 85,
    "text8": 28,
    "owt_small": 50257,
    "owt_1b3": 50257,
    "markov": 8,
}


# What the memory plan varies, cheapest first: accumulation (fewer sequences a call) costs
# nothing in compute; remat costs a forward pass of what it recomputes ("dots" less than "layers").
REMAT_ORDER = ("none", "dots", "layers")


def parse_mesh(text: str) -> dict[str, int]:
    """ "data=8,fsdp=1" -> {"data": 8, "fsdp": 1, "tensor": 1} (axes not named are 1).

    Raises:
      ValueError: an axis that is not data, fsdp or tensor, or a size that is not a positive integer.
    """
    sizes = {a: 1 for a in sharding.MESH_AXES}
    for part in filter(None, text.split(",")):
        name, _, value = part.partition("=")
        if name not in sizes or not value.isdigit() or int(value) < 1:
            raise ValueError(
                f"--mesh {text!r}: {part!r} is not AXIS=SIZE with AXIS one of "
                f"{', '.join(sharding.MESH_AXES)} and SIZE a positive integer"
            )
        sizes[name] = int(value)
    return sizes


def memory_config(name: str, overrides=(), mesh: dict | None = None):
    """Config `name` with `overrides` (``--config.KEY=VALUE``), its shipped vocabulary, and the mesh sizes.

    Without `mesh` the config runs on the local devices along ``data``, whatever mesh it names.
    """
    c = config_lib.load_config(name, list(overrides))
    c.unlock()
    c.vocab_size = c.data.markov.vocab_size if c.data.name == "markov" else SHIPPED_VOCAB.get(name, 65)
    # Without a mesh, all local devices on the data axis (a config's own mesh may need more devices).
    for axis, size in (mesh or {"data": -1, "fsdp": 1, "tensor": 1}).items():
        c.mesh[axis] = size
    return c


def memory_plan(config, device_gib: float | None) -> dict:
    """The config's step on its mesh, and with a device size the cheapest (accum_steps, remat) that fits.

    Settings are tried in the order of their cost, accum_steps 1, 2, 4, ... (the
    per-call batch divided by it, so the update sees the same sequences) and
    within each remat none, dots, layers, and the first whose peak fits is the
    plan; none fits when one sequence a device with remat = layers does not.
    """
    rows = [
        dict(
            train_step_memory(config),
            accum_steps=config.training.accum_steps,
            remat=config.model.remat,
            batch_size=config.training.batch_size,
            loss_chunk=config.training.loss_chunk,
            shipped=True,
        )
    ]
    fit = None
    if device_gib:
        limit = device_gib * 2**30
        shards = int(np.prod([config.mesh[a] for a in sharding.BATCH_AXES]))
        accum, batch = config.training.accum_steps, config.training.batch_size
        while fit is None and batch % shards == 0 and batch >= shards:
            for remat in REMAT_ORDER:
                c = config_lib.from_json(config_lib.to_json(config))  # a copy
                c.training.accum_steps, c.training.batch_size, c.model.remat = accum, batch, remat
                if (accum, batch, remat) == (
                    config.training.accum_steps,
                    config.training.batch_size,
                    config.model.remat,
                ):
                    row = rows[0]
                else:
                    row = dict(
                        train_step_memory(c),
                        accum_steps=accum,
                        remat=remat,
                        batch_size=batch,
                        loss_chunk=c.training.loss_chunk,
                        shipped=False,
                    )
                    rows.append(row)
                print(
                    f"  accum_steps={accum} batch_size={batch} remat={remat}: "
                    f"{row['peak_bytes_estimate'] / 2**30:.2f} GiB a device",
                    flush=True,
                )
                if row["peak_bytes_estimate"] <= limit:
                    fit = row
                    break
            if batch % 2:
                break
            accum, batch = accum * 2, batch // 2
    return {"rows": rows, "fit": fit, "device_gib": device_gib}


def run_memory(quick: bool, args) -> dict:
    """Compiled train-step memory (argument, temporary, peak bytes) per config and mesh; dict with a table.

    With --mesh the step is compiled for that mesh on as many CPU devices
    (``main`` makes them before JAX starts), and with --device_gib the plan
    searches the cheapest setting that fits (``memory_plan``).
    """
    names = ["tiny"] if quick else (args.configs or config_lib.shipped_configs())
    mesh = parse_mesh(args.mesh) if args.mesh else None
    results, rows = {}, []
    gib = lambda x: f"{x / 2**30:.3f}"  # noqa: E731
    for name in names:
        c = memory_config(name, args.overrides, mesh)
        plan = memory_plan(c, args.device_gib)
        for r in plan["rows"]:
            r.update(seq_len=c.data.seq_len, dtype=c.model.dtype, vocab_size=c.vocab_size)
        results[name] = plan
        for r in plan["rows"]:
            per_device = r["batch_size"] // int(np.prod([r["mesh"][a] for a in sharding.BATCH_AXES]))
            mark = ("fits" if r is plan["fit"] else "") if args.device_gib else ""
            rows.append(
                [
                    name,
                    ",".join(f"{a}={n}" for a, n in r["mesh"].items() if n > 1) or "1 device",
                    f"{r['n_params'] / 1e6:.2f}M",
                    r["batch_size"],
                    per_device,
                    r["seq_len"],
                    r["dtype"],
                    r["remat"],
                    r["loss_chunk"],
                    r["accum_steps"],
                    gib(r.get("argument_size_in_bytes", 0)),
                    gib(r.get("temp_size_in_bytes", 0)),
                    gib(r.get("peak_bytes_estimate", 0)),
                    f"{r['compile_s']:.0f}",
                    mark,
                ]
            )
        if args.device_gib and plan["fit"] is None:
            print(
                f"{name}: no setting fits {args.device_gib} GiB a device, even one sequence a device with "
                "remat=layers: add devices (fsdp splits the weights and optimizer state) or shorten L"
            )
        elif args.device_gib:
            f, shipped = plan["fit"], plan["rows"][0]
            fits = shipped["peak_bytes_estimate"] <= args.device_gib * 2**30
            print(
                f"{name}: as configured (remat={shipped['remat']}, accum_steps={shipped['accum_steps']}) "
                f"{shipped['peak_bytes_estimate'] / 2**30:.1f} GiB a device, "
                f"{'within' if fits else 'over'} {args.device_gib} GiB; the cheapest setting that fits: "
                f"--config.training.batch_size={f['batch_size']} --config.training.accum_steps={f['accum_steps']} "
                f"--config.model.remat={f['remat']} ({f['peak_bytes_estimate'] / 2**30:.1f} GiB)"
            )
    table = format_table(
        [
            "config",
            "mesh",
            "params",
            "B",
            "B/device",
            "L",
            "dtype",
            "remat",
            "loss_chunk",
            "accum",
            "args GiB",
            "temp GiB",
            "peak GiB/device",
            "compile s",
            "",
        ],
        rows,
    )
    return {"benchmark": "memory", "results": results, "table": table}
