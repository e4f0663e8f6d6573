"""Clients that ask for diffusing streams and never read them, against `sedd serve` on localhost (issue 53, finding 3).

  python experiments/benchmarks/idle_clients.py --workdir RUN [--clients 60] [--n 16] [--steps 1024]
      [--send_timeout 30] [--sndbuf 4096] [--rounds 2]

Starts `sedd serve` in a Python of its own (so that its RSS is the server's
alone). Four clients first ask for the same stream and read it whole (the
programs compiled, the memory of a served stream counted in the baseline);
then `--clients` clients each open a connection (receive buffer 4 KiB), send
{"n", "steps", "diffusing": true}, read nothing and stay connected, for
`--rounds` rounds (each round's clients closed before the next). Every 0.5 s
until every response has begun (uvicorn's access line) and no stream is open
(/health's "streams"): the server's RSS (VmRSS) and /health's latency.
Printed: the baseline RSS; for each round the peak and the RSS once every
stream has ended (its clients still connected: memory still held would grow
round by round), /health's median and largest latency, the streams the
server dropped for their send timeout (its log line); the next request's
status, and the server's "Task was destroyed" lines and tracebacks.

Linux grows a connection's send buffer up to 4 MiB (net.ipv4.tcp_wmem),
which takes a whole stream of a small run: the server then never waits on a
send, and what a client does not read sits in the kernel. `--sndbuf B` sets
SO_SNDBUF on the server's listening socket (accepted sockets inherit it; the
server is otherwise `sedd serve` as it runs), so that every stream blocks as
a 67 MB stream (L = 1,024) does with any buffer: then the send timeout is
what frees it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

# `sedd serve` itself, its uvicorn.run given a listening socket with a small send buffer.
_SERVER = """
import socket, sys, uvicorn
from sedd import cli
sndbuf = int(sys.argv[1])
def run(app, host, port, **kw):
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    sock.bind((host, port))
    try:
        uvicorn.Server(uvicorn.Config(app, host=host, port=port, **kw)).run(sockets=[sock])
    except KeyboardInterrupt:  # as uvicorn.run: SIGINT is the way to stop it
        pass
if sndbuf:
    uvicorn.run = run
sys.exit(cli.main(sys.argv[2:]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(port: int) -> tuple[float, dict]:
    """(seconds /health took, its JSON)."""
    t0 = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("GET", "/health")
    r = c.getresponse()
    body = json.loads(r.read())
    assert r.status == 200, body
    return time.monotonic() - t0, body


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["VmRSS"].split()[0]) / 1024


def request_bytes(port: int, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: localhost:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode() + data


def read_whole(port: int, request: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(request)
        while s.recv(1 << 20):
            pass


def start(args, port: int, log) -> subprocess.Popen:
    argv = [
        "serve",
        "--workdir",
        args.workdir,
        "--port",
        str(port),
        "--window_ms",
        "200",
        "--log_level",
        "info",
        "--send_timeout",
        str(args.send_timeout),
        "--timeout",
        "900",
    ]
    server = subprocess.Popen([sys.executable, "-c", _SERVER, str(args.sndbuf), *argv], stdout=log, stderr=log)
    deadline = time.monotonic() + 180
    while True:
        try:
            health(port)
            return server
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(0.3)


def measure(args, port: int, server: subprocess.Popen, log_path: str) -> dict:
    request = request_bytes(port, {"prompt": "ROMEO:", "n": args.n, "steps": args.steps, "diffusing": True, "seed": 1})
    warm = [threading.Thread(target=read_whole, args=(port, request)) for _ in range(4)]
    for t in warm:
        t.start()
    for t in warm:
        t.join()
    time.sleep(1)
    out = {"baseline RSS MiB": rss_mib(server.pid)}
    begun_before = 4
    for r in range(1, args.rounds + 1):
        out.update(
            {f"round {r}: {k}": v for k, v in idle_round(args, port, server, log_path, request, begun_before).items()}
        )
        begun_before += args.clients
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request(
        "POST", "/v1/completions", json.dumps({"prompt": "ROMEO:", "steps": 4}), {"Content-Type": "application/json"}
    )
    out["next request"] = c.getresponse().status
    return out


def idle_round(args, port: int, server: subprocess.Popen, log_path: str, request: bytes, begun_before: int) -> dict:
    """`args.clients` clients that read nothing, until every response has begun and every stream has ended."""
    idle, t0 = [], time.monotonic()
    for _ in range(args.clients):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        s.sendall(request)
        idle.append(s)
    latencies, peak = [], 0.0
    while time.monotonic() - t0 < args.deadline:
        seconds, state = health(port)
        latencies.append(seconds)
        peak = max(peak, rss_mib(server.pid))
        with open(log_path) as f:  # uvicorn's access line: a response begun
            begun = f.read().count("POST /v1/completions") - begun_before
        if begun >= args.clients and state["streams"] == 0:
            break
        time.sleep(0.5)
    out = {
        "seconds until every stream ended": round(time.monotonic() - t0, 1),
        "peak RSS MiB": peak,
        "RSS after MiB (clients still connected)": rss_mib(server.pid),
        "/health median s": statistics.median(latencies),
        "/health max s": max(latencies),
        "/health samples": len(latencies),
    }
    time.sleep(1)  # a dropped stream's generator is closed just before its line is logged
    with open(log_path) as f:
        out["streams dropped, in all (send timeout)"] = f.read().count("read nothing of its stream")
    for s in idle:
        s.close()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="the run directory to serve")
    p.add_argument("--clients", type=int, default=60)
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--steps", type=int, default=1024)
    p.add_argument("--send_timeout", type=float, default=30.0)
    p.add_argument("--sndbuf", type=int, default=0, help="SO_SNDBUF of the server's sockets (0: Linux's own)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of idle clients (memory held would grow by round)")
    p.add_argument("--deadline", type=float, default=900.0, help="most seconds a round waits for its streams")
    p.add_argument("--log", help="keep the server's stderr in this file (default: a temporary one)")
    args = p.parse_args(argv)
    port = free_port()
    with open(args.log, "w+") if args.log else tempfile.NamedTemporaryFile("w+", suffix=".log") as log:
        server = start(args, port, log)
        try:
            out = measure(args, port, server, log.name)
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(60)
        log.seek(0)
        text = log.read()
    out["'Task was destroyed' lines"] = text.count("Task was destroyed")
    out["tracebacks"] = text.count("Traceback")
    for key, value in out.items():
        print(f"{key:>42}: {value:.3f}" if isinstance(value, float) else f"{key:>42}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
