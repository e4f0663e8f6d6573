"""Hostile requests against `sedd serve` (issue 33, findings 3 and 5): each reproduces what an attacker did.

A server of its own (short timeouts, a small program cache) on a free
localhost port in a background thread, behind the header-timeout protocol
`sedd serve` runs; raw sockets where a client must misbehave.
"""

import dataclasses
import concurrent.futures
import json
import logging
import socket
import threading
import time

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("sse_starlette")
uvicorn = pytest.importorskip("uvicorn")

from starlette.testclient import TestClient  # noqa: E402

import servers  # noqa: E402
from sedd import graphs, noise, runs, sampling, serve  # noqa: E402

LIMITS = serve.Limits(
    max_steps=16,
    max_n=2,
    max_batch=4,
    max_queue=16,
    timeout_s=60,
    window_s=0.0,
    max_body_bytes=2048,
    max_programs=4,
    header_timeout_s=0.5,
    body_timeout_s=0.5,
)
BODY = {"prompt": "ROMEO:", "max_tokens": 6, "steps": 4}


@pytest.fixture(scope="module")
def server(tiny_run):
    """(host, port, app) of a server on a free localhost port, in a background thread."""
    run = runs.load(tiny_run[0])
    app = serve.create_app(run, "sedd-tiny", LIMITS)
    with servers.serving(app, http=serve.header_timeout_protocol(LIMITS.header_timeout_s)) as port:
        yield "127.0.0.1", port, app


def _request(body: dict | bytes, port: int, content_type: str = "application/json", host: str = "localhost") -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode() + data


def _answer(sock: socket.socket) -> tuple[int, dict]:
    """(status, JSON body) of one Content-Length answer read from a keep-alive socket."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    length = int(next(line.split(":", 1)[1] for line in lines if line.lower().startswith("content-length:")))
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(lines[0].split()[1]), json.loads(rest[:length])


def test_distinct_temperatures_share_one_program(server):
    """Finding 3: temperature and top_p were static jit arguments, one compilation (~10 s, 16 MiB) per float."""
    host, port, app = server
    engine = app.state.engine
    base = f"http://{host}:{port}"
    assert httpx.post(f"{base}/v1/completions", json={**BODY, "seed": 0}, timeout=60).status_code == 200
    before = engine.compiles
    for i in range(12):
        body = {**BODY, "seed": i, "temperature": 0.5 + i * 1e-9, "top_p": 0.9 - i * 1e-3}
        r = httpx.post(f"{base}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["diffusion"]["compiled"] is False
    assert engine.compiles == before
    assert httpx.get(f"{base}/health").json()["programs"] == len(engine.programs) <= LIMITS.max_programs


@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (0.5, 1.0), (1.7, 1.0), (1.0, 0.6), (0.7, 0.8)])
def test_traced_temperature_is_the_samplers_law(temperature, top_p):
    """The served lanes' tempered log-score gives the ratios of sedd.sampling.Context.score at that temperature."""
    graph = graphs.Absorbing(7)
    log_score = jax.random.normal(jax.random.key(0), (3, 1, 5, graph.dim)) * 2.0  # (B, 1, L, D)
    x = jnp.asarray([[[7, 1, 7, 7, 2]]] * 3, jnp.int32)  # MASK = 7 at positions 0, 2, 3
    temps = jnp.asarray([temperature, 1.0, temperature], jnp.float32)  # row 1 as it is
    tops = jnp.asarray([top_p, 1.0, top_p], jnp.float32)

    def tempered(s, xx, t, p):  # the traced (T, top_p) of one lane, as the served lanes apply them
        traced = sampling.Context(None, graph, noise.LogLinear(1e-3), sampling.Options(axis_name="rows"), 4, (t, p))
        return traced.tempered(s, xx)

    ours = jax.vmap(tempered, axis_name="rows")(log_score, x, temps, tops)
    ctx = sampling.Context(
        None, graph, noise.LogLinear(1e-3), sampling.Options(temperature=temperature, top_p=top_p), 4
    )
    plain = sampling.Context(None, graph, noise.LogLinear(1e-3), sampling.Options(), 4)
    for row, c in ((0, ctx), (1, plain), (2, ctx)):
        np.testing.assert_allclose(np.exp(ours[row]), c.score(log_score[row], x[row]), rtol=2e-5, atol=1e-30)


@pytest.mark.slow  # a soak: many requests of distinct programs: behind -m slow to keep the default suite within 900 CPU s
def test_the_program_cache_is_bounded(server):
    """Compiled programs are kept least recently used first, at most max_programs; a dropped one compiles again."""
    _, _, app = server
    run = app.state.engine.run
    engine = serve.Engine(run, serve.Limits(max_programs=2, max_n=1, max_batch=1))  # not started: no thread
    plan = serve.plan(run, serve.CompletionRequest(**BODY, seed=0), engine.limits)

    def job(steps):
        return serve.Job(dataclasses.replace(plan, steps=steps), False, concurrent.futures.Future())

    for steps in (2, 3, 2, 4):
        engine.run_batch([job(steps)])
    assert engine.compiles == 3 and [k[1] for k in engine.programs] == [2, 4]
    engine.run_batch([job(3)])  # dropped before: compiled again
    assert engine.compiles == 4 and len(engine.programs) == 2


def test_only_json_bodies_and_allowed_hosts_are_answered(server):
    """Finding 3: a text/plain POST (no CORS preflight) and any Host header (DNS rebinding) were answered."""
    host, port, _ = server
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        with socket.create_connection((host, port)) as s:
            s.sendall(_request(BODY, port, content_type))
            status, body = _answer(s)
        assert status == 415 and body["error"]["code"] == "unsupported_media_type"
    for name in ("evil.example", "127.0.0.1.nip.io", "localhost.evil.example", ""):
        with socket.create_connection((host, port)) as s:
            s.sendall(_request(BODY, port, host=name))
            status, body = _answer(s)
        assert status == 421 and body["error"]["code"] == "host_not_allowed", name
    for name in ("localhost", "127.0.0.1", "LOCALHOST"):
        with socket.create_connection((host, port)) as s:
            s.sendall(_request({**BODY, "seed": 1}, port, host=name))
            assert _answer(s)[0] == 200
    app = serve.create_app(server[2].state.engine.run, "m", LIMITS, allowed_hosts=("api.example.org",))
    c = TestClient(app, base_url="http://api.example.org")  # the lifespan never starts: models only
    assert c.get("/v1/models").status_code == 200
    assert TestClient(app, base_url="http://other.example.org").get("/v1/models").status_code == 421


def test_an_api_key_is_checked_as_openai_does(server):
    run = server[2].state.engine.run
    app = serve.create_app(run, "m", LIMITS, api_key="s3cret-key")
    c = TestClient(app, base_url="http://localhost")
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "s3cret-key"}):
        r = c.get("/v1/models", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert c.get("/v1/models", headers={"authorization": "Bearer s3cret-key"}).status_code == 200
    assert c.get("/health").status_code == 200 and c.get("/").status_code == 200  # liveness and the page stay open
    with pytest.raises(ValueError, match="api_key"):
        serve.create_app(run, "m", LIMITS, api_key="")


def test_a_500_is_openai_shaped_logged_and_keeps_the_connection(server, monkeypatch, caplog):
    """Finding 5: a 500 carried the exception's text, and reset the keep-alive connection for the next request."""
    host, port, app = server
    engine = app.state.engine
    real = engine.run_batch
    calls = []

    def failing_once(batch):
        calls.append(len(batch))
        if len(calls) == 1:
            raise AttributeError("'sampling' internal detail XLA_SECRET")
        return real(batch)

    monkeypatch.setattr(engine, "run_batch", failing_once)
    with caplog.at_level(logging.ERROR, logger="sedd.serve"), socket.create_connection((host, port)) as s:
        s.sendall(_request({**BODY, "seed": 2}, port))
        status, body = _answer(s)
        assert status == 500 and set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["code"] == "internal_error" and "SECRET" not in json.dumps(body)
        s.sendall(_request({**BODY, "seed": 2}, port))  # the same connection serves the next request
        assert _answer(s)[0] == 200
    logged = [r for r in caplog.records if r.name == "sedd.serve"]
    assert logged and logged[0].exc_info and "XLA_SECRET" in str(logged[0].exc_info[1])
    assert body["error"]["message"].split("reference ")[1].split()[0] in logged[0].getMessage()


def test_jobs_whose_client_hung_up_are_dropped_before_they_run(server, monkeypatch):
    """Finding 5: five hung-up jobs all ran (the request's task is not cancelled when its client leaves)."""
    host, port, app = server
    engine = app.state.engine
    real, gate, ran = engine.run_batch, threading.Event(), []

    def gated(batch):
        ran.append([j.plan.seed for j in batch])
        gate.wait(30)
        return real(batch)

    monkeypatch.setattr(engine, "run_batch", gated)
    base = f"http://{host}:{port}"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        blocker = pool.submit(httpx.post, f"{base}/v1/completions", json={**BODY, "seed": 100}, timeout=60)
        deadline = time.monotonic() + 30
        while not ran:  # the engine is busy with the blocker
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for seed in range(1, 6):
            with socket.create_connection((host, port)) as s:
                s.sendall(_request({**BODY, "seed": seed}, port))
                deadline = time.monotonic() + 10
                while len(engine.pending) < seed:  # queued; then the client hangs up
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
        deadline = time.monotonic() + 10
        while not all(j.future.cancelled() for j in engine.pending):
            assert time.monotonic() < deadline, "a hung-up job was not given up on"
            time.sleep(0.01)
        gate.set()
        assert blocker.result().status_code == 200
    assert httpx.post(f"{base}/v1/completions", json={**BODY, "seed": 200}, timeout=60).status_code == 200
    assert ran == [[100], [200]]


def test_stalled_headers_and_bodies_are_cut_off(server):
    """Finding 5: 200 partial-header and 50 stalled-body connections were all still held after 70 s."""
    host, port, _ = server
    with socket.create_connection((host, port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: local")  # never finishes its headers
        s.settimeout(10)
        t0 = time.monotonic()
        assert s.recv(1024) == b"" and time.monotonic() - t0 < 5  # closed after header_timeout_s
    with socket.create_connection((host, port)) as s:
        s.sendall(_request(BODY, port)[:-5])  # the headers promise 5 bytes more than come
        s.settimeout(10)
        status, body = _answer(s)
        assert status == 408 and body["error"]["code"] == "request_timeout"
    with socket.create_connection((host, port)) as s:  # an idle keep-alive connection after an answer
        s.sendall(_request({**BODY, "seed": 3}, port))
        assert _answer(s)[0] == 200
        s.sendall(b"POST /v1/comp")
        s.settimeout(10)
        assert s.recv(1024) == b""


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--port", "99999"], "--port must be an integer in [1, 65535] (a TCP port), got 99999"),
        (["--port", "0"], "--port must be an integer in [1, 65535]"),
        (["--timeout", "nan"], "--timeout must be a finite number in (0, 86400], got nan"),
        (["--timeout", "0"], "--timeout must be a finite number in (0, 86400]"),
        (["--body_timeout", "inf"], "--body_timeout must be a finite number in (0, 86400]"),
        (["--window_ms", "-1"], "--window_ms must be a finite number in [0, 60000]"),
        (["--max_queue", "0"], "--max_queue must be an integer in [1, 1048576]"),
        (["--max_batch", "2", "--max_n", "4"], "--max_batch 2 must be at least --max_n 4"),
        (["--warmup_steps", "5000"], "--warmup_steps 5000 must be in [1, --max_steps 1024]"),
        (["--api_key", ""], "--api_key must be a non-empty key"),
    ],
)
def test_bad_options_are_refused_at_start_up_in_one_line(tmp_path, capsys, flags, message):
    """Finding 5: --port 99999 bound another port while printing 99999; --timeout nan failed every completion."""
    assert serve.main(["--workdir", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sedd serve: error: ") and message in err and err.count("\n") == 1


def test_limits_are_checked_when_made():
    for bad in (
        {"timeout_s": float("nan")},
        {"window_s": -1.0},
        {"max_programs": 0},
        {"max_steps": 2.5},
        {"header_timeout_s": 0},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            serve.Limits(**bad)
