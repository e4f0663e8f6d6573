"""A bounded load test of `sedd serve` on localhost: batched against one-at-a-time serving.

  python experiments/benchmarks/serve_load.py --workdir RUN [--concurrency 64] [--requests 256] [--steps 8]
  python experiments/benchmarks/serve_load.py --workdir RUN --engine_only    (no HTTP: the batching alone)
  python experiments/benchmarks/serve_load.py --workdir RUN --hostile 100    (distinct temperatures mixed in)

Starts the server twice on a free localhost port, each time compiled up front
(--warmup): once as configured (batching within a 5 ms window, up to 64 rows)
and once with --max_batch 1 (one request at a time). Each time `concurrency`
clients, one keep-alive connection each, send `requests` completions (an
untimed round, then the timed one; distinct seeds) and the script prints
requests/s, p50/p95 latency, lost requests and the mean batch size. The
clients share the machine with the server, so they are as lean as an HTTP
client can be (``Connection``).

With --hostile N the batched server is started once and sent N ordinary
requests alone, then the same N mixed with N requests of distinct
temperatures and top_p (0.5 + i 1e-6, 0.95 - i 1e-6: each a new program
when they were static jit arguments); it prints the ordinary requests'
p50/p95 latency in each round and the programs the server compiled
(`/health`'s "compiles") during each; --rounds alternates the two, and the
medians of their p95 are compared.
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


class Connection:
    """One keep-alive HTTP/1.1 connection that POSTs JSON and reads a Content-Length answer.

    The load generator shares the two cores with the server, so it must cost
    little per request: a general client (httpx) spends about as long on a
    request as the server's batched engine does. This one writes the request's
    bytes and reads the status line, the headers and the body, nothing more.
    """

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        lines = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        length = {k.lower(): v for k, v in headers.items()}.get("content-length")
        if length is None:
            raise ConnectionError(f"an answer without Content-Length (status {status})")
        return status, await self.reader.readexactly(int(length))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def load(
    host: str, port: int, concurrency: int, requests: int, body: dict, bodies: list[dict] | None = None
) -> dict:
    """`requests` completions (seeds 0, 1, ...) from `concurrency` clients, one connection each.

    With `bodies`, those are sent instead (in order, each with its own seed),
    and the figures are of the ones without a "temperature" (the ordinary ones).
    """
    bodies = bodies or [body] * requests
    latencies, rows, lost = [], [], []
    todo = iter(enumerate(bodies))

    async def client():
        conn = Connection(host, port)
        try:
            for i, one in todo:
                data = json.dumps({**one, "seed": i}).encode()
                t0 = time.perf_counter()
                try:
                    status, answer = await conn.post("/v1/completions", data)
                except (OSError, asyncio.IncompleteReadError, ConnectionError) as e:
                    lost.append(repr(e))
                    conn.close()
                    conn = Connection(host, port)
                    continue
                if status != 200:
                    lost.append(f"{status}: {answer[:200]!r}")
                    continue
                if "temperature" not in one:
                    latencies.append(time.perf_counter() - t0)
                    rows.append(json.loads(answer)["diffusion"]["batch_rows"])
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    lat = np.asarray(latencies) * 1e3
    return {
        "requests": len(bodies),
        "ok": len(latencies),
        "lost": len(lost),
        "first_lost": lost[:3],
        "seconds": round(wall, 2),
        "requests_per_s": round(len(latencies) / wall, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 1) if len(lat) else None,
        "p95_ms": round(float(np.percentile(lat, 95)), 1) if len(lat) else None,
        "mean_batch_rows": round(float(np.mean(rows)), 1) if rows else None,
    }


def run_async(coroutine):
    """asyncio.run, on uvloop where it is installed (it comes with uvicorn[standard]): cheaper clients."""
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def serve_and_load(args, extra: list[str], rounds=None) -> dict:
    """Start the server with `extra` flags and run the load: `rounds(port, body)` (a dict of figures) or the default."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable,
        "-c",
        "import sys; from sedd import serve; sys.exit(serve.main(sys.argv[1:]))",
        "--workdir",
        args.workdir,
        "--port",
        str(port),
        "--log_level",
        "warning",
        "--warmup",
        "--warmup_steps",
        str(args.steps),
        "--max_queue",
        str(max(256, args.requests)),
        *extra,
    ]
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
        # An untimed round of the same size first: the first seconds after start-up serve at as little as
        # half the rate of the next (measured on the 2-core development machine).
        run_async(load("127.0.0.1", port, args.concurrency, args.requests, body))
        if rounds is not None:
            return rounds(port, body)
        return run_async(load("127.0.0.1", port, args.concurrency, args.requests, body))
    finally:
        server.terminate()
        server.wait(timeout=60)


def hostile_mix(args) -> dict:
    """Ordinary requests alone, then mixed with as many of distinct temperatures: their latency, programs compiled."""
    n = args.hostile

    def compiles(port):
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["compiles"]

    def rounds(port, body):
        hostile = [{**body, "temperature": 0.5 + i * 1e-6, "top_p": 0.95 - i * 1e-6} for i in range(n)]
        mixed = [b for pair in zip([body] * n, hostile) for b in pair]  # interleaved
        out = {"ordinary_alone": [], "with_hostile": []}
        for _ in range(args.rounds):  # alternated, so that a drift of the machine's load hits both
            for name, bodies in (("ordinary_alone", [body] * n), ("with_hostile", mixed)):
                before = compiles(port)
                figures = run_async(load("127.0.0.1", port, args.concurrency, len(bodies), body, bodies))
                out[name].append({**figures, "programs_compiled": compiles(port) - before})
        for name in ("ordinary_alone", "with_hostile"):
            out[f"{name}_p95_ms_median"] = float(np.median([r["p95_ms"] for r in out[name]]))
            out[f"{name}_programs_compiled"] = sum(r["programs_compiled"] for r in out[name])
        out["p95_ratio"] = round(out["with_hostile_p95_ms_median"] / out["ordinary_alone_p95_ms_median"], 2)
        return out

    return serve_and_load(args, ["--max_batch", str(args.max_batch), "--window_ms", "5"], rounds)


def engine_only(args) -> dict:
    """Requests/s of the engine alone (no HTTP): `requests` jobs queued at once, batched and one at a time."""
    import concurrent.futures  # noqa: PLC0415  (only this mode loads the model in this process)
    import dataclasses  # noqa: PLC0415

    from sedd import runs, serve  # noqa: PLC0415

    run = runs.load(args.workdir)
    plan = serve.plan(
        run, serve.CompletionRequest(prompt=args.prompt, steps=args.steps, max_tokens=args.max_tokens), serve.Limits()
    )
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
        out[name] = {
            "requests": args.requests,
            "seconds": round(wall, 2),
            "requests_per_s": round(args.requests / wall, 1),
            "batches": engine.batches - 1,
        }
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
    p.add_argument(
        "--hostile",
        type=int,
        default=0,
        help="N ordinary requests alone, then mixed with N of distinct temperatures (batched server)",
    )
    p.add_argument("--rounds", type=int, default=5, help="with --hostile: alternated rounds of each")
    args = p.parse_args()
    if args.hostile:
        results = hostile_mix(args)
        print(json.dumps(results, indent=1))
        rounds = results["ordinary_alone"] + results["with_hostile"]
        return 0 if all(r["lost"] == 0 for r in rounds) else 1
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
