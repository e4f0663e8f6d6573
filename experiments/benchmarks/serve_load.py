"""A bounded load test of `sedd serve` on localhost: batched against one-at-a-time serving.

  python experiments/benchmarks/serve_load.py --workdir RUN [--concurrency 64] [--requests 256] [--steps 8]
  python experiments/benchmarks/serve_load.py --workdir RUN --engine_only    (no HTTP: the batching alone)

Starts the server twice on a free localhost port, each time compiled up front
(--warmup): once as configured (batching within a 5 ms window, up to 64 rows)
and once with --max_batch 1 (one request at a time). Each time `concurrency`
clients send `requests` completions in all (distinct seeds) and the script
prints requests/s, p50/p95 latency, lost requests and the mean batch size.
"""

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time

import httpx
import numpy as np


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def load(base: str, concurrency: int, requests: int, body: dict) -> dict:
    gate = asyncio.Semaphore(concurrency)
    latencies, rows, lost = [], [], []

    async def one(client, i):
        async with gate:
            t0 = time.perf_counter()
            try:
                r = await client.post(f"{base}/v1/completions", json={**body, "seed": i})
                if r.status_code != 200:
                    lost.append(f"{r.status_code}: {r.text[:200]}")
                    return
                out = r.json()
                latencies.append(time.perf_counter() - t0)
                rows.append(out["diffusion"]["batch_rows"])
            except httpx.HTTPError as e:
                lost.append(repr(e))

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(client, i) for i in range(requests)))
        wall = time.perf_counter() - t0
    lat = np.asarray(latencies) * 1e3
    return {"requests": requests, "ok": len(latencies), "lost": len(lost), "first_lost": lost[:3],
            "seconds": round(wall, 2), "requests_per_s": round(len(latencies) / wall, 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 1) if len(lat) else None,
            "p95_ms": round(float(np.percentile(lat, 95)), 1) if len(lat) else None,
            "mean_batch_rows": round(float(np.mean(rows)), 1) if rows else None}


def serve_and_load(args, extra: list[str]) -> dict:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-c", "import sys; from sedd import serve; sys.exit(serve.main(sys.argv[1:]))",
           "--workdir", args.workdir, "--port", str(port), "--log_level", "warning", "--warmup", "--warmup_steps", str(args.steps),
           "--max_queue", str(max(256, args.requests)), *extra]
    server = subprocess.Popen(cmd)
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.5)
        body = {"prompt": args.prompt, "steps": args.steps}
        if args.max_tokens:
            body["max_tokens"] = args.max_tokens
        return asyncio.run(load(base, args.concurrency, args.requests, body))
    finally:
        server.terminate()
        server.wait(timeout=60)


def engine_only(args) -> dict:
    """Requests/s of the engine alone (no HTTP): `requests` jobs queued at once, batched and one at a time."""
    import concurrent.futures  # noqa: PLC0415  (only this mode loads the model in this process)
    import dataclasses  # noqa: PLC0415

    from sedd import runs, serve  # noqa: PLC0415

    run = runs.load(args.workdir)
    plan = serve.plan(run, serve.CompletionRequest(prompt=args.prompt, steps=args.steps, max_tokens=args.max_tokens),
                      serve.Limits())
    out = {}
    for name, max_batch in (("batched", args.max_batch), ("one_at_a_time", 1)):
        engine = serve.Engine(run, serve.Limits(max_batch=max_batch, max_n=1, max_queue=args.requests))
        engine.run_batch([serve.Job(dataclasses.replace(plan, n=max_batch), False, concurrent.futures.Future())])
        engine.start()
        t0 = time.perf_counter()
        futures = [engine.submit(dataclasses.replace(plan, seed=i), False) for i in range(args.requests)]
        concurrent.futures.wait(futures)
        wall = time.perf_counter() - t0
        engine.stop()
        out[name] = {"requests": args.requests, "seconds": round(wall, 2),
                     "requests_per_s": round(args.requests / wall, 1), "batches": engine.batches - 1}
    out["speedup"] = round(out["batched"]["requests_per_s"] / out["one_at_a_time"]["requests_per_s"], 2)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--prompt", default="ROMEO:")
    p.add_argument("--max_tokens", type=int, default=None)
    p.add_argument("--max_batch", type=int, default=64)
    p.add_argument("--engine_only", action="store_true", help="time the batched engine alone, without HTTP")
    args = p.parse_args()
    if args.engine_only:
        print(json.dumps(engine_only(args), indent=1))
        return 0
    results = {
        "batched": serve_and_load(args, ["--max_batch", str(args.max_batch), "--window_ms", "5"]),
        "one_at_a_time": serve_and_load(args, ["--max_batch", "1", "--max_n", "1", "--window_ms", "0"]),
    }
    results["speedup"] = round(results["batched"]["requests_per_s"] / results["one_at_a_time"]["requests_per_s"], 2)
    print(json.dumps(results, indent=1))
    return 0 if all(r["lost"] == 0 for r in (results["batched"], results["one_at_a_time"])) else 1


if __name__ == "__main__":
    sys.exit(main())
