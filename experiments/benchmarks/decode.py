"""`bench.py decode`: batch-1 decode, ms a network call: AR with its KV cache and its variants, block models."""

from __future__ import annotations

import functools
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.benchmarks import nets
from experiments.timing import format_table, interleaved, median, paired_ratio
from sedd import kernels, kinds
from sedd.kinds import causal


def stored_in_compute_dtype(model):
    """A copy of `model` whose product weights (the Linear kernels of `kernels.mixed_einsum`) are stored in
    their compute dtype.

    `mixed_einsum` casts each float32 weight to bfloat16 at every call; a decode
    step is a pass over the weights, so stored cast it reads half the bytes
    (unless XLA hoists the casts out of the loop). The products see the same
    values, so the tokens are the same.
    """
    model = nnx.clone(model)
    linears = [
        node
        for _, node in nnx.iter_graph(model)
        if isinstance(node, nnx.Linear) and isinstance(node.dot_general, kernels._MixedDot)
    ]
    for node in linears:
        node.kernel = nnx.Param(node.kernel[...].astype(node.dot_general.dtype))
    return model


def _ar_decode(model, key, temperature, *, num_samples: int, length: int, unroll: int = 1):
    """``sedd.kinds.causal.ancestral`` (no prompt, the precise categorical, up to max_len) with its loop unrolled
    `unroll` times: the same tokens, a loop iteration of `unroll` network calls."""
    from sedd.categorical import sample_categorical  # noqa: PLC0415

    def step(pos, carry):
        cache, prev, toks = carry
        logits, cache, _ = causal.decode_in_cache(model, cache, prev[:, None], pos)  # (B, 1, V)
        probs = jax.nn.softmax(logits[:, 0].astype(jnp.float32) / temperature, axis=-1)
        tok = sample_categorical(jax.random.fold_in(key, pos), probs, "precise").astype(jnp.int32)
        return cache, tok, toks.at[:, pos].set(tok)

    bos = jnp.full((num_samples,), causal.bos_id(model), jnp.int32)
    toks = jnp.zeros((num_samples, length), jnp.int32)
    carry = (model.empty_cache(num_samples, length), bos, toks)
    return jax.lax.fori_loop(0, length, step, carry, unroll=unroll)[2]  # (B, L)


ar_decode = nnx.jit(_ar_decode, static_argnames=("num_samples", "length", "unroll"))


def union_ns(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of (start, end) intervals."""
    total, end = 0.0, -float("inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def trace_calls(fn: Callable[[], Any], calls: int, top: int = 20, keep: str | None = None) -> dict:
    """One traced run of fn (compiled first) under jax.profiler, summarised per network call.

    Device planes (a GPU's streams): per line, events (kernels, copies) a call,
    their summed and their union time a call, the span, and the `top` names by
    time. Host threads: per line the `top` event names by time and count (the
    launches, the thunks of XLA's runtime, the while loop's). `keep`: a path to
    copy the .xplane.pb to (gzip), for TensorBoard / xprof.
    """
    from jax._src.profiler import ProfileData  # noqa: PLC0415

    jax.block_until_ready(fn())
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        try:  # no Python tracer: its events would be most of the trace
            options = jax.profiler.ProfileOptions()
            options.python_tracer_level = 0
        except Exception:  # noqa: BLE001  (an older or newer jax)
            options = None
        with jax.profiler.trace(d, profiler_options=options):
            jax.block_until_ready(fn())
        wall = time.perf_counter() - t0
        pb = next(Path(d).rglob("*.xplane.pb"))
        if keep:
            import gzip  # noqa: PLC0415

            Path(keep).parent.mkdir(parents=True, exist_ok=True)
            Path(keep).write_bytes(gzip.compress(pb.read_bytes()))
        data = ProfileData.from_file(str(pb))
    out = {"calls": calls, "wall_ms_per_call_traced": wall / calls * 1e3, "device": [], "host": []}
    for plane in data.planes:
        is_device = plane.name.startswith("/device:")
        if not (is_device or plane.name.startswith("/host:CPU")):
            continue
        for line in plane.lines:
            evs = [(ev.name, ev.start_ns, ev.duration_ns) for ev in line.events]
            if not evs:
                continue
            by_name: dict[str, list[float]] = {}
            for name, _, dur in evs:
                by_name.setdefault(name, []).append(dur)
            names = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
            row = {
                "plane": plane.name,
                "line": line.name,
                "events_per_call": len(evs) / calls,
                "sum_ms_per_call": sum(e[2] for e in evs) / calls / 1e6,
                "top": [
                    {
                        "name": n[:120],
                        "count_per_call": len(v) / calls,
                        "ms_per_call": sum(v) / calls / 1e6,
                        "mean_us": sum(v) / len(v) / 1e3,
                    }
                    for n, v in names
                ],
            }
            if is_device:
                row["busy_ms_per_call"] = union_ns([(a, a + d) for _, a, d in evs]) / calls / 1e6
                row["span_ms"] = (max(a + d for _, a, d in evs) - min(a for _, a, _ in evs)) / 1e6
            (out["device"] if is_device else out["host"]).append(row)
    out["host"] = sorted(out["host"], key=lambda r: -r["sum_ms_per_call"])[:6]
    return out


def hlo_loop_ops(hlo_text: str) -> dict:
    """Opcode counts of the largest while-loop body of a compiled module's text (what a loop iteration runs)."""
    bodies = {m.group(1): m.group(2) for m in re.finditer(r"\n%?([\w.\-]+) [^\n]*\{\n(.*?)\n\}", hlo_text, re.S)}
    loops = re.findall(r"while\(.*?body=%?([\w.\-]+)", hlo_text)
    best: dict[str, int] = {}
    for name in loops:
        ops: dict[str, int] = {}
        for m in re.finditer(r"= \S+ ([\w\-]+)\(", bodies.get(name, "")):
            ops[m.group(1)] = ops.get(m.group(1), 0) + 1
        if sum(ops.values()) > sum(best.values()):
            best = ops
    return dict(sorted(best.items(), key=lambda kv: -kv[1]))


def _ar_hlo(model, length: int, unroll: int = 1) -> str:
    """The compiled text of `ar_decode` (as jax.jit of the split model)."""
    graphdef, state = nnx.split(model)
    f = jax.jit(
        lambda state, key, t: _ar_decode(
            nnx.merge(graphdef, state), key, t, num_samples=1, length=length, unroll=unroll
        )
    )
    return f.lower(state, jax.random.key(0), jnp.float32(1.0)).compile().as_text()


def ar_writers(config, key, batch: int, length: int, unrolls) -> tuple:
    """(the AR network of the config with random nonzero weights, {name: (a text of `length` tokens, its calls)}):
    ``causal.ancestral`` as shipped, its loop unrolled, its weights stored in the compute dtype."""
    one = jnp.float32(1.0)
    c = config.copy_and_resolve_references()
    c.model.kind = "ar"
    ar_model = kinds.build_model(c, 0)
    # Random nonzero weights (the zero-initialised output layer would make every draw uniform).
    graphdef, params, rest = nnx.split(ar_model, nnx.Param, ...)
    leaves = jax.tree.leaves(params)
    ks = jax.random.split(jax.random.key(1), len(leaves))
    params = jax.tree.unflatten(
        jax.tree.structure(params), [p + 0.02 * jax.random.normal(k, p.shape) for p, k in zip(leaves, ks)]
    )
    ar_model = nnx.merge(graphdef, params, rest)
    ar_model.eval()
    ar_low = stored_in_compute_dtype(ar_model)
    fns: dict[str, tuple[Callable[[], Any], int]] = {
        "AR, KV cache (causal.ancestral)": (lambda: causal.ancestral_model(key, ar_model, batch, length), length)
    }
    for u in unrolls:
        fns[f"AR, loop unrolled x{u}"] = (
            functools.partial(ar_decode, ar_model, key, one, num_samples=batch, length=length, unroll=u),
            length,
        )
    fns["AR, weights stored bf16"] = (
        functools.partial(ar_decode, ar_low, key, one, num_samples=batch, length=length, unroll=1),
        length,
    )
    if unrolls:
        u = max(unrolls)
        fns[f"AR, weights stored bf16, unrolled x{u}"] = (
            functools.partial(ar_decode, ar_low, key, one, num_samples=batch, length=length, unroll=u),
            length,
        )
    return ar_model, fns


def run_decode(quick: bool, args) -> dict:
    """Batch-1 decode, ms a network call: AR with KV cache (as shipped, its loop unrolled, its weights stored in
    bfloat16) and block models (b = 4 and 16 at 4 tokens a call), interleaved; with --trace a jax.profiler trace
    of the AR and block-4 calls (kernels a call, their time, the host's)."""
    if quick:
        config = nets.bench_config("tiny")
        length, repeats, unrolls = 32, 1, args.unroll
    else:
        config = nets.bench_config(
            hidden_size=args.width,
            n_heads=max(args.width // 64, 1),
            n_layers=args.blocks,
            cond_dim=128,
            seq_len=args.seq_len,
        )
        config.vocab_size = args.vocab or (50257 if args.width >= 768 else config.vocab_size)
        length, repeats, unrolls = args.length, args.repeats, args.unroll
    if args.dtype:
        config.model.dtype = args.dtype
    batch, key = 1, jax.random.key(0)
    ar_model, fns = ar_writers(config, key, batch, length, unrolls)
    base = "AR, KV cache (causal.ancestral)"
    ref = np.asarray(fns[base][0]())
    results = []

    def measure(group: dict) -> None:
        """Times a group of writers, interleaved; each result is printed as it comes (a timeout keeps them)."""
        same = {}
        for name, (fn, _) in group.items():
            out = np.asarray(fn() if not name.startswith("block") else fn().tokens)  # also compiles
            if name.startswith("AR"):
                same[name] = bool(np.array_equal(out, ref))
        times = interleaved({name: fn for name, (fn, _) in group.items()}, repeats, warmup=0)
        for name, (_, calls) in group.items():
            sec = median(times[name])
            results.append(
                {
                    "what": name,
                    "calls": calls,
                    "seconds": sec,
                    "ms_per_call": sec / calls * 1e3,
                    "tokens_per_s": batch * length / sec,
                    "same_tokens_as_ar_sample": same.get(name),
                    "ratio_to_ar_sample": paired_ratio(times[name], times[base]) if base in group else None,
                    "times_s": times[name],
                }
            )
            print(
                f"decode: {name}: {sec / calls * 1e3:.4f} ms a call ({calls} calls, {sec:.3f} s; "
                f"same tokens: {same.get(name)})",
                flush=True,
            )

    measure(fns)
    per_step, blocks = 4, {}
    for b in [] if args.no_block else args.block_sizes:
        kind, net = nets.random_net(config, "block", b)
        steps = max(b // per_step, 1)
        fn = functools.partial(
            kind.sample, key, net, batch, steps, sampler="confidence", max_length=length, return_stats=True
        )
        nfe = int(fn().stats["nfe"])  # also compiles
        blocks[f"block b={b}, {min(per_step, b)} tokens a call"] = (fn, nfe)
    if blocks:
        measure(blocks)
    fns.update(blocks)
    out = {
        "benchmark": "decode",
        "results": results,
        "model": dict(config.model.to_dict(), vocab_size=config.vocab_size, seq_len=config.data.seq_len),
        "length": length,
        "batch": batch,
    }
    # The weights a call reads: the floor of a call at the device's copy rate.
    n = nets.network_matmul_params(ar_model)
    out["weight_bytes_float32"], out["weight_bytes_bfloat16"] = 4 * n, 2 * n
    _hlo_and_traces(out, fns, ar_model, length, base, args)
    out["table"] = _table(out)
    return out


def _hlo_and_traces(out: dict, fns: dict, ar_model, length: int, base: str, args) -> None:
    """Into `out`: the AR loop body's HLO op counts (--trace --dump) and the traces of the AR and block-4 calls
    (--trace); a failure is recorded, never raised (a summary, not a result)."""
    try:
        if not (args.trace and args.dump):
            raise RuntimeError("the loop body's HLO is read with --trace --dump only")
        text = _ar_hlo(ar_model, length)
        out["hlo_loop_body_ops"] = hlo_loop_ops(text)
        out["hlo_loop_body_ops_total"] = sum(out["hlo_loop_body_ops"].values())
        out["hlo_converts_in_loop"] = out["hlo_loop_body_ops"].get("convert", 0)
        if args.dump:
            Path(args.dump).mkdir(parents=True, exist_ok=True)
            (Path(args.dump) / "ar_decode_hlo.txt").write_text(text)
    except Exception as e:  # a summary, not a result: never fail the timings for it
        out["hlo_error"] = repr(e)[:400]
    if args.trace:
        out["trace"] = {}
        for name, (fn, calls) in fns.items():
            if name in (base, "AR, weights stored bf16") or name.startswith("block b=4"):
                try:
                    stem = name.split(",")[0].replace(" ", "_").replace("=", "")
                    keep = str(Path(args.dump) / f"{stem}.xplane.pb.gz") if args.dump else None
                    out["trace"][name] = trace_calls(fn, calls, keep=keep)
                except Exception as e:
                    out["trace"][name] = {"error": repr(e)[:400]}


def _table(out: dict) -> str:
    """The decode benchmark's table: a row per writer, then the weights a call reads and each trace's lines."""
    rows = [
        [
            r["what"],
            r["calls"],
            f"{r['seconds']:.3f}",
            f"{r['ms_per_call']:.3f}",
            f"{r['tokens_per_s']:.0f}",
            "" if r["ratio_to_ar_sample"] is None else f"{r['ratio_to_ar_sample']:.2f}",
            "" if r["same_tokens_as_ar_sample"] is None else str(r["same_tokens_as_ar_sample"]),
        ]
        for r in out["results"]
    ]
    table = format_table(["batch 1", "calls", "s", "ms a call", "tok/s", "time / ancestral", "same tokens"], rows)
    table += (
        f"\nweights a call: {out['weight_bytes_float32'] / 1e9:.3f} GB float32, "
        f"{out['weight_bytes_bfloat16'] / 1e9:.3f} GB bfloat16; the AR loop body: "
        f"{out.get('hlo_loop_body_ops_total', '?')} HLO ops, {out.get('hlo_converts_in_loop', '?')} converts"
    )
    for name, tr in out.get("trace", {}).items():
        if "error" in tr:
            table += f"\ntrace of {name}: {tr['error']}"
            continue
        for row in tr["device"]:
            table += (
                f"\ntrace of {name}, {row['line']}: {row['events_per_call']:.0f} events a call, "
                f"{row['sum_ms_per_call']:.3f} ms summed, {row['busy_ms_per_call']:.3f} ms busy a call "
                f"(traced wall {tr['wall_ms_per_call_traced']:.3f} ms a call)"
            )
    return table
