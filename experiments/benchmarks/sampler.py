"""`bench.py sampler`: one sampler step (and a whole `sample` loop) divided by one plain forward pass."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from experiments.benchmarks import nets
from experiments.timing import format_table, interleaved, median, paired_ratio
from sedd import sampling


def bench_sampler(
    config,
    batch: int,
    repeats: int = 5,
    t: float = 0.5,
    steps: int = 128,
    loop_steps: int = 16,
    samplers: list[str] | None = None,
    key_impls: tuple[str, ...] = ("rbg",),
) -> dict:
    """One sampler step divided by one plain forward pass, per sampler and categorical method.

    A step is ``sedd.sampling.one_step`` (the network call included), jitted
    alone. The state is a draw of x_t at time t (about half the positions
    masked for the absorbing graph), the step size that of a ``steps``-step
    grid. A whole ``sample`` call of ``loop_steps`` steps is timed too and
    divided by (loop_steps + 1) forward passes: the loop's own cost (no host
    round trips). ``key_impls`` adds rows for euler / analytic's precise path
    fed a key of another PRNG implementation (``jax.random.key(0, impl=...)``).
    """
    graph, noise, params, score_fn = nets.diffusion_parts(config)
    l = config.data.seq_len
    key = jax.random.key(0)
    x0 = jax.random.randint(key, (batch, l), 0, config.vocab_size)
    sigma_t = noise(jnp.float32(t))[0]
    x = graph.sample_transition(jax.random.key(1), x0, jnp.full((batch, 1), sigma_t)).astype(jnp.int32)
    sigma = jnp.full((batch,), sigma_t)
    fwd = jax.jit(score_fn)
    fns = {"forward": lambda: fwd(params, x, sigma)}
    t_, dt = jnp.float32(t), jnp.float32(1.0 / steps)
    names = samplers or [
        p for p in sorted(sampling.SAMPLERS) if graph.absorb or "uniform" in sampling.SAMPLERS[p].graphs
    ]
    for name in names:

        @jax.jit
        def step(params, key, x, name=name, cat="precise"):
            return sampling.one_step(
                key, functools.partial(score_fn, params), graph, noise, x, t_, dt, sampler=name, categorical=cat
            )

        for cat in sampling.CATEGORICAL_METHODS:
            step_c = jax.jit(functools.partial(step.__wrapped__, cat=cat))
            fns[f"{name}/{cat}"] = functools.partial(step_c, params, key, x)
        if key_impls and name in ("analytic", "euler"):
            # The key's implementation is the caller's choice: threefry (default)
            # spends most of the precise path's time making random bits on CPU.
            for impl in key_impls:
                fns[f"{name}/precise, {impl} key"] = functools.partial(
                    jax.jit(functools.partial(step.__wrapped__, cat="precise")), params, jax.random.key(0, impl=impl), x
                )
    loop = functools.partial(sampling.sample, key, score_fn, graph, noise, (batch, l), loop_steps, score_params=params)
    fns[f"sample({loop_steps} steps, default)"] = loop
    times = interleaved(fns, repeats)
    ratios = {k: paired_ratio(v, times["forward"]) for k, v in times.items() if k != "forward"}
    loop_key = f"sample({loop_steps} steps, default)"
    ratios[loop_key] = ratios[loop_key] / (loop_steps + 1)
    return {
        "model": dict(config.model.to_dict(), vocab_size=config.vocab_size, seq_len=l, batch_size=batch),
        "graph_dim": graph.dim,
        "forward_s": median(times["forward"]),
        "ratio_to_forward": ratios,
        "default_path": f"{config.sampling.sampler}/{config.sampling.categorical}",
        "times_s": times,
    }


def run_sampler(quick: bool, args) -> dict:
    """The sampler benchmark: time of a sampler step relative to a forward pass; dict with a table."""
    if quick:
        cases = [(nets.bench_config("tiny", vocab_size=1000), 4)]
        repeats, loop_steps, samplers, key_impls = 2, 4, ["analytic"], ()
    else:
        cases = [
            (nets.bench_config(), args.batch),  # the default char model (sedd/configs/shakespeare_char.py), V 85
            (
                nets.bench_config(vocab_size=50257, hidden_size=128, n_layers=2, n_heads=2, cond_dim=64, seq_len=128),
                args.batch_gpt2,
            ),
        ]
        repeats, loop_steps, samplers, key_impls = args.repeats, 16, None, ("rbg",)
    for c, _ in cases:
        if args.dtype:
            c.model.dtype = args.dtype
    results = [
        bench_sampler(c, b, repeats=repeats, loop_steps=loop_steps, samplers=samplers, key_impls=key_impls)
        for c, b in cases
    ]
    rows = []
    for r in results:
        m = r["model"]
        for k, v in r["ratio_to_forward"].items():
            rows.append(
                [
                    m["hidden_size"],
                    m["n_layers"],
                    m["seq_len"],
                    m["batch_size"],
                    m["vocab_size"],
                    k,
                    f"{r['forward_s'] * 1e3:.1f}",
                    f"{v:.3f}",
                ]
            )
    table = format_table(
        ["H", "blocks", "L", "B", "V", "step (sampler/categorical)", "forward ms", "step / forward"], rows
    )
    return {"benchmark": "sampler", "results": results, "table": table}
