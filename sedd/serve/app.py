"""`sedd serve`'s HTTP app: the routes, the gate in front of them, and the answers' shapes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import secrets
import time
import uuid
from importlib import resources
from pathlib import Path

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from sedd import runs, sampling
from sedd.kinds import capabilities
from sedd.serve.api import APIError, ClientGone, CompletionRequest, Limits, Plan, plan, validation_error
from sedd.serve.engine import Busy, Engine
from sedd.serve import streams
from sedd.serve.texts import Texts

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")  # the Host names answered by default
PLAN_TIMEOUT_S = 2.0
PLAN_CHARS_PER_S = 100_000  # a tenth of a GPT-2 BPE's pace on one core: a long prompt gets more time
"""A request's prompt and suffix may take PLAN_TIMEOUT_S seconds to encode, plus one per PLAN_CHARS_PER_S
characters; then 503. The budget runs from when the encoding starts on a thread of its own, not while the request
waits for one. Never on the event loop, so /health and the other requests are answered meanwhile; an encoding past
its budget cannot be interrupted and finishes on its thread (PLAN_THREADS at most at once), but the tokenizers sedd
reads take time linear in the text (sedd.data.tokenizers.check_pipeline)."""
PLAN_THREADS = 2  # encodings at once; one a tokenizer never returns from holds its thread, not the server


def model_name(workdir: str | Path) -> str:
    """The model id `GET /v1/models` reports: sedd-<run directory name>."""
    return f"sedd-{Path(workdir).resolve().name}"


def host_name(host: str) -> str:
    """The name of a Host header without its port, lower case: "[::1]:8000" -> "::1", "LocalHost." -> "localhost".

    Anything after the name but a port (`[::1]evil.example`, `localhost:evil`)
    leaves the header whole, which names no allowed host.
    """
    host = host.strip().lower()
    if host.startswith("[") and "]" in host:
        name, rest = host[1 : host.find("]")], host[host.find("]") + 1 :]
    elif host.count(":") == 1:
        name, rest = host.split(":")[0], host[host.find(":") :]
    else:
        name, rest = host, ""
    if rest and not (rest.startswith(":") and (rest[1:].isdigit() or not rest[1:])):
        return host
    return name.rstrip(".")


class Gate:
    """ASGI middleware: refuse, before any route, a request this server must not answer.

    - A Host header that is not in `hosts` (421): a page of another site that
      rebinds its own name to 127.0.0.1 sends its name, not ours. "*" admits any.
    - With `api_key`, a /v1/ request without ``Authorization: Bearer <api_key>``
      (401, as OpenAI answers a wrong key). The playground page and /health
      stay open.
    """

    def __init__(self, app, hosts: tuple[str, ...] = LOCAL_HOSTS, api_key: str | None = None):
        self.app = app
        self.hosts = frozenset(host_name(h) for h in hosts)
        self.bearer = None if api_key is None else f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                await refusal.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope) -> APIError | None:
        headers = dict(scope["headers"])  # ASGI gives the names lower case
        if "*" not in self.hosts:
            given = [v.decode("latin-1") for k, v in scope["headers"] if k == b"host"]
            host = given[0] if len(given) == 1 else " and ".join(given)  # two Host headers name no host (RFC 9112)
            if len(given) != 1 or host_name(host) not in self.hosts:
                return APIError(
                    421,
                    f"this server does not answer requests for the host {host!r}; it answers "
                    f"{', '.join(sorted(self.hosts))} (start it with --allowed_hosts to add "
                    "names)",
                    None,
                    "host_not_allowed",
                )
        if self.bearer is not None and scope["path"].startswith("/v1/"):
            given = headers.get(b"authorization", b"")
            if not secrets.compare_digest(given, self.bearer):
                return APIError(
                    401,
                    "incorrect or missing API key: send the key this server was started with as "
                    "`Authorization: Bearer <key>`",
                    None,
                    "invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return None


def _guarded(endpoint):
    """The endpoint with its errors answered in OpenAI's shape and the connection kept usable.

    An ``APIError`` is answered as it is; any other exception is a fault of
    the server: logged with its traceback, answered 500 with a reference to
    the log line and no internal text. (Starlette's own handler of a 500
    re-raises after answering, which closes a keep-alive connection.)
    """

    @functools.wraps(endpoint)
    async def run(request: Request):
        try:
            return await endpoint(request)
        except APIError as e:
            return e.response()
        except ClientGone:
            return Response(status_code=204)  # nobody reads it
        except Exception:  # noqa: BLE001  the server's fault: logged, answered, the server keeps serving
            return streams.internal_error(f"{request.method} {request.url.path}").response()

    return run


def create_app(
    run: runs.Run,
    name: str = "sedd",
    limits: Limits = Limits(),
    allowed_hosts: tuple[str, ...] = LOCAL_HOSTS,
    api_key: str | None = None,
    draft=None,
    draft_k: int | None = None,
    draft_name: str | None = None,
) -> Starlette:
    """The ASGI app serving `run` (start and stop its engine with the app's lifespan).

    A bare Starlette app: four routes whose bodies pydantic validates, behind
    ``Gate`` (Host allow-list, optional API key), with no per-request
    dependency solving (docs/serving.md says what FastAPI's layers cost). The
    header timeout is the HTTP server's business: ``main`` gives uvicorn
    ``header_timeout_protocol``.

    Args:
      allowed_hosts: the names a request's Host header may give ("*": any).
      api_key: when given, every /v1/ request must carry ``Authorization: Bearer <api_key>``.
      draft, draft_k, draft_name: an AR run's speculative decoding (``_speculation``): "ngram" or another
        ``runs.Run``, drafts a round, the name /v1/models gives; answers then carry a `speculative` object.
    """
    speculation = _speculation(run, draft, draft_k, draft_name)
    if limits.max_batch < limits.max_n:
        raise ValueError(f"max_batch={limits.max_batch} must be at least max_n={limits.max_n}")
    if api_key is not None and not api_key:
        raise ValueError("api_key must not be empty")
    engine = Engine(run, limits, speculation)
    texts = Texts(run)
    planner = concurrent.futures.ThreadPoolExecutor(PLAN_THREADS, thread_name_prefix="sedd-serve-plan")
    open_streams = [0]  # streams open now (app.state.streams())

    sse = functools.partial(streams.sse, streams=open_streams, limits=limits)
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        engine.start()
        yield
        engine.stop()
        planner.shutdown(wait=False, cancel_futures=True)

    async def health(request: Request) -> JSONResponse:
        if engine.failed:  # every completion would wait for nothing: say so, not "ok"
            return JSONResponse({"status": "engine_failed", "model": name}, status_code=503)
        return JSONResponse(
            {"status": "ok", "model": name, "step": run.step, **engine.counts(), "streams": open_streams[0]}
        )

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [_model_card(run, name, created, speculation)]})

    async def completions(request: Request):
        req = _request(await _read_body(request, limits), name)
        p = await _planned(planner, run, req, limits)
        if speculation is not None:
            _by_rounds(req, p)
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        cid, now = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": cid, "object": "text_completion", "created": now, "model": name}
        progress, queue = None, None
        if req.stream and not req.diffusing and (speculation is not None or run.kind.settles(p.sampler)):
            queue, progress = streams.progress()
        try:
            future = engine.submit(p, trajectory=req.diffusing, progress=progress)
        except Busy as e:
            raise APIError(503, str(e), None, "server_busy", kind="server_error") from None
        if req.stream and not req.diffusing:
            return sse(streams.stream(texts, p, stop, head, future, queue, limits.timeout_s))
        ids, traj, info = await _result(request, future, limits.timeout_s)
        choices = [dict(zip(("text", "finish_reason"), texts.completion(row, p, stop))) for row in ids]
        report = info.pop("report", {})  # the program's own figures: {"speculative": ...}
        diffusion = streams.diffusion(p, info)
        if req.diffusing:
            return sse(
                streams.frames(texts, p, req, engine.read_frames(p, traj), choices, head, diffusion, streams.usage(p))
            )
        out = [
            {"index": i, "text": c["text"], "logprobs": None, "finish_reason": c["finish_reason"]}
            for i, c in enumerate(choices)
        ]
        return JSONResponse({**head, "choices": out, "usage": streams.usage(p), "diffusion": diffusion, **report})

    app = Starlette(
        routes=[
            Route("/health", _guarded(health)),
            Route("/v1/models", _guarded(models)),
            Route("/", _guarded(_playground)),
            Route("/favicon.ico", _guarded(_favicon)),
            Route("/v1/completions", _guarded(completions), methods=["POST"]),
        ],
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
    app.state.engine, app.state.name = engine, name
    app.state.streams = lambda: open_streams[0]
    app.add_middleware(Gate, hosts=tuple(allowed_hosts), api_key=api_key)
    return app


def _model_card(run: runs.Run, name: str, created: int, speculation) -> dict:
    """What /v1/models says of the served run: its name, length, step, data, kind and drafts, sampler and steps."""
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "sedd",
        "seq_len": run.seq_len,
        "step": run.step,
        "data": run.config.data.name,
        **run.kind.describe(),
        **(speculation.describe() if speculation else {}),
        "sampler": run.config.sampling.sampler,
        "steps": run.config.sampling.steps,
        "samplers": sorted(sampling.SAMPLERS),
    }


def _request(body: bytes, name: str) -> CompletionRequest:
    """The body of a completion request, validated (pydantic); 404 for a model this server does not serve."""
    try:
        req = CompletionRequest.model_validate_json(body)
    except ValidationError as e:
        raise validation_error(e) from None
    if req.model is not None and req.model != name:
        raise APIError(
            404, f"the model {req.model!r} does not exist; this server serves {name!r}", "model", "model_not_found"
        )
    return req


def _speculation(run: runs.Run, draft, draft_k: int | None, draft_name: str | None):
    """The run's ``sedd.sampling.rounds.Speculation`` (``capabilities.Speculates``), or None: served by its rows
    program (``capabilities.ServesLanes``).

    An AR run without a draft writes one token a call; with one, each answer carries a `speculative`
    object (calls, tokens a call, acceptance by draft position) and a stream each round's drafts.

    Raises:
      ValueError: a draft or draft_k the run cannot take, or a run served neither way (one line).
    """
    if isinstance(draft, runs.Run):
        draft = capabilities.drafter(draft.kind, draft.net)  # a sedd.drafts.Drafter, checked by the run's kind
    speculation = capabilities.speculation(run.kind, run.graphdef, draft, draft_k, draft_name)
    if speculation is None:
        capabilities.able(run.kind, capabilities.ServesLanes, "sedd serve")
    return speculation


def _by_rounds(req: CompletionRequest, p: Plan) -> None:
    """A request to a run decoded by speculative rounds: no diffusing (400); its rows stop at the completion's end."""
    if req.diffusing:
        raise APIError(
            400,
            "diffusing streams the denoising steps of a diffusion run; this run writes left to "
            "right in speculative rounds: ask with stream: true to see each round's drafts",
            "diffusing",
            "unsupported_value",
        )
    p.mask[p.suffix_start :] = True  # nothing to write after the completion: marked given, the row stops there


async def _favicon(request: Request) -> Response:
    """No icon: answered, so a browser's request is not a 404."""
    return Response(status_code=204)


async def _playground(request: Request) -> HTMLResponse:
    return HTMLResponse(resources.files("sedd").joinpath("static/playground.html").read_text(encoding="utf-8"))


async def _http_error(request, e: HTTPException) -> JSONResponse:
    """No such route (404), a wrong method (405): in OpenAI's error shape."""
    return APIError(e.status_code, str(e.detail)).response()


async def _planned(planner: concurrent.futures.Executor, run: runs.Run, req: CompletionRequest, limits: Limits) -> Plan:
    """``plan`` (the prompt encoded) on the planner's threads, within its budget (PLAN_TIMEOUT_S and the length).

    The budget runs from when a thread starts this request's encoding: the
    wait for a free thread is another request's encoding, not this one's.

    Raises:
      APIError: plan's 400s; 503 when the encoding takes too long (the
        thread finishes on its own; the request no longer waits for it).
    """
    budget = PLAN_TIMEOUT_S + (len(req.prompt) + len(req.suffix or "")) / PLAN_CHARS_PER_S
    loop = asyncio.get_running_loop()
    started = loop.create_future()  # done when a thread starts this request's encoding (or never will)

    def start(_=None) -> None:
        if not started.done():
            started.set_result(None)

    def encode() -> Plan:
        loop.call_soon_threadsafe(start)
        return plan(run, req, limits)

    job = loop.run_in_executor(planner, encode)
    job.add_done_callback(start)  # cancelled unstarted at shutdown
    try:
        await started
    except asyncio.CancelledError:  # the request is gone before a thread was free: its encoding never starts
        job.cancel()
        raise
    try:
        return await asyncio.wait_for(job, budget)
    except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11
        why = f"encoding the prompt took more than {budget:.3g} s; the run's tokenizer is too slow for this text"
        raise APIError(503, why, "prompt", "timeout", kind="server_error") from None


async def _read_body(request: Request, limits: Limits) -> bytes:
    """The JSON body: 415 unless it is sent as application/json, 413 over max_body_bytes, 408 if it stalls.

    Refusing other content types means a page of another site cannot post
    here with a "simple" request (text/plain needs no CORS preflight).

    Raises:
      APIError: 415, 413 (by its header or as it arrives), or 408 when the
        whole body has not arrived within body_timeout_s (the connection is
        then closed).
      ClientGone: the client left while sending it.
    """
    ctype = request.headers.get("content-type", "")
    if ctype.split(";", 1)[0].strip().lower() != "application/json":
        raise APIError(
            415,
            f"the body must be JSON sent with Content-Type: application/json (got {ctype!r})",
            None,
            "unsupported_media_type",
        )
    limit = limits.max_body_bytes
    too_big = APIError(413, f"the request body is over this server's limit of {limit} bytes", None, "request_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limits.body_timeout_s
    chunks, size = [], 0
    while True:
        try:
            message = await asyncio.wait_for(request.receive(), max(deadline - loop.time(), 0.0))
        except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11
            why = f"the request body did not arrive within {limits.body_timeout_s:g} s"
            raise APIError(408, why, None, "request_timeout", headers={"Connection": "close"}) from None
        if message["type"] == "http.disconnect":
            raise ClientGone()
        size += len(message.get("body", b""))
        if size > limit:
            raise too_big
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _result(request: Request, future: concurrent.futures.Future, timeout_s: float) -> tuple:
    """The engine's result for a job, or its job dropped when the client hangs up or the wait times out.

    A plain HTTP request's task is not cancelled when its client leaves, so
    the disconnect is watched for (the ASGI receive after the body).

    Raises:
      ClientGone: the client hung up (the job is dropped if it has not started).
      APIError: 503 after timeout_s.
    """
    waiter = asyncio.wrap_future(future)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        done, _ = await asyncio.wait({waiter, gone}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if waiter in done:
        return waiter.result()
    future.cancel()  # a job that has not started leaves the queue unrun
    waiter.cancel()
    if gone in done:
        raise ClientGone()
    raise streams.timed_out(timeout_s)


async def _disconnect(request: Request) -> None:
    """Return when the client has closed the connection."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
