"""`sedd serve`'s answers that stream: server-sent events of a completion as its text settles (``stream``), of a
diffusing completion's frames (``frames``), each bounded by a send timeout (``SendBounded``); and the answers'
`usage` and `diffusion` objects, the 500 of a server fault (``internal_error``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import uuid

from sse_starlette.sse import EventSourceResponse, SendTimeoutError

from sedd.serve.api import APIError, CompletionRequest, Limits, Plan
from sedd.serve.texts import Streamed, Texts

logger = logging.getLogger("sedd.serve")


def internal_error(what: str) -> APIError:
    """Log the exception being handled with its traceback; the 500 the client gets instead of its text."""
    ref = uuid.uuid4().hex[:12]
    logger.exception("sedd serve: internal error %s on %s", ref, what)
    why = f"the server failed on this request (reference {ref} in its log)"
    return APIError(500, why, None, "internal_error", kind="server_error")


def timed_out(timeout_s: float) -> APIError:
    """The 503 of a request that waited more than timeout_s for its result."""
    why = f"the request waited more than {timeout_s:g} s; the server is busy, retry later"
    return APIError(503, why, None, "timeout", kind="server_error")


def data(obj) -> dict:
    """A server-sent event of obj as JSON."""
    return {"data": json.dumps(obj)}


def sse(events, streams: list, limits: Limits) -> SendBounded:
    """A stream of events (counted in streams[0] while open), dropped with what it holds when one event waits
    send_timeout_s to be sent."""
    return SendBounded(
        EventSourceResponse(counted(events, streams), ping=600, send_timeout=limits.send_timeout_s),
        limits.send_timeout_s,
    )


def progress() -> tuple[asyncio.Queue, object]:
    """(queue, progress): progress(i, ids, *more), called on the engine's thread, puts (i, ids, *more) on the queue."""
    queue, loop = asyncio.Queue(), asyncio.get_running_loop()
    return queue, lambda i, ids, *more: loop.call_soon_threadsafe(queue.put_nowait, (i, ids.copy(), *more))


class SendBounded:
    """An ASGI response whose send timeout (sse-starlette's SendTimeoutError) ends it quietly, with a log line.

    A client that opens a stream and reads nothing fills its socket, then the
    server's buffer for it (asyncio pauses writing past 64 KiB); the next
    send then waits. After send_timeout_s the response ends: its events'
    generator is closed, and what it held (a diffusing request's trajectory,
    n x (N + 1) x L tokens) is freed. The connection is closed once its
    buffered bytes are read or the socket fails.
    """

    def __init__(self, response, timeout_s: float):
        self.response, self.timeout_s = response, timeout_s

    async def __call__(self, scope, receive, send):
        try:
            await self.response(scope, receive, send)
        except BaseException as e:  # anyio's task group may wrap it in an exception group
            if not only_of(e, SendTimeoutError):
                raise
            logger.warning(
                "sedd serve: a client read nothing of its stream for %g s; the stream was dropped", self.timeout_s
            )


def only_of(e: BaseException, kind: type) -> bool:
    """Whether e is a `kind`, or an exception group of nothing else."""
    inner = getattr(e, "exceptions", None)
    return isinstance(e, kind) or (inner is not None and all(only_of(x, kind) for x in inner))


async def counted(events, count: list):
    """The events of an async generator, counted in count[0] while it is open; closed with this one."""
    count[0] += 1
    try:
        async for event in events:
            yield event
    finally:
        count[0] -= 1
        await events.aclose()


def diffusion(p: Plan, info: dict) -> dict:
    """The response's `diffusion` object: steps, sampler, seed, the batch's figures, tokens/s."""
    return {
        "steps": p.steps,
        "sampler": p.sampler,
        "seed": p.seed,
        **info,
        "tokens_per_second": p.n * p.length / max(info["seconds"], 1e-9),
    }


def usage(p: Plan) -> dict:
    """The response's `usage` object: the prompt's tokens (prompt and suffix), the completions', their sum."""
    return {
        "prompt_tokens": p.start + p.suffix_len,
        "completion_tokens": p.n * p.length,
        "total_tokens": p.start + p.suffix_len + p.n * p.length,
    }


async def stream(
    texts: Texts,
    p: Plan,
    stop: list[str],
    head: dict,
    future: concurrent.futures.Future,
    queue: asyncio.Queue | None,
    timeout_s: float,
):
    """OpenAI's streamed completion, sent as the text settles: chunks that concatenate to each choice's text.

    With a `queue` (a sampler that ``settles``), the states the engine hands
    over at each network call become chunks of new settled text while the
    sampling runs; the last chunk of each choice holds the rest and its
    finish_reason, then [DONE]. A failure after the stream has begun is an
    event {"error": ...}. A client that hangs up (sse-starlette then cancels
    this generator) or a timeout drops the job if it has not started.

    The job's end is one more item of the queue (None, after the states it
    handed over), so the stream waits on one queue and starts no task of its
    own: a task left waiting on the queue of a stream whose client hung up
    was destroyed pending ("Task was destroyed but it is pending!" in the log).
    """
    streamed = Streamed(texts, p, stop)
    queue = asyncio.Queue() if queue is None else queue
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s

    def finished(_):  # on the engine's thread
        try:
            loop.call_soon_threadsafe(queue.put_nowait, None)
        except RuntimeError:  # the loop is closed: the server has stopped, nobody waits
            pass

    def chunk(i, text, reason=None, more=None):
        choice = {"index": i, "text": text, "logprobs": None, "finish_reason": reason}
        if more is not None:  # a speculative round of this choice: its drafts, those kept, the token written
            choice["speculative"] = texts.round(more, p)
        return data({**head, "choices": [choice]})

    future.add_done_callback(finished)
    try:
        while (item := await next_item(queue, deadline - loop.time())) is not None:
            if item is TimeoutError:
                yield data({"error": timed_out(timeout_s).response_body()})
                return
            i, ids, *more = item
            text = streamed.update(i, ids)
            more = more[0] if more else None
            if text or more is not None:
                yield chunk(i, text, more=more)
        try:
            ids, _, info = future.result()
        except Exception:  # noqa: BLE001  the engine failed: the client hears of it, the log has the traceback
            yield data({"error": internal_error("a streamed completion").response_body()})
            return
        for i, row in enumerate(ids):
            text, reason = texts.completion(row, p, stop)
            yield chunk(i, streamed.rest(i, text), reason)
        report = info.get("report")
        if report:  # as OpenAI's stream_options.include_usage: a last chunk without choices
            timing = diffusion(p, {k: v for k, v in info.items() if k != "report"})
            yield data({**head, "choices": [], "usage": usage(p), **report, "diffusion": timing})
        yield {"data": "[DONE]"}
    finally:
        future.cancel()  # no effect once it has run


async def next_item(queue: asyncio.Queue, seconds: float):
    """The queue's next item, or TimeoutError (the class) when none came within `seconds`."""
    try:
        return await asyncio.wait_for(queue.get(), max(seconds, 0.0))
    except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11
        return TimeoutError


async def frames(
    texts: Texts,
    p: Plan,
    req: CompletionRequest,
    frames: tuple,
    choices: list[dict],
    head: dict,
    diffusion: dict,
    usage: dict,
):
    """The diffusing stream: the frames of the sampling, then the final text.

    `frames` is (traj int[n, F, L], calls int[F], labels: F dicts or None), the
    kind's reading of its trajectory (``Engine.read_frames``): for a
    full-sequence run the N + 1 states, the state after k steps and the
    network calls made so far (a step of the absorbing graph whose state has
    no mask left makes none); for a run that draws part of the text at a
    time, the frames of the parts that hold completion positions, "step" and
    "steps" counting those frames and the labels naming the part. The last frame
    holds the final text, after the last step and the denoise, and the
    sampler's own count.
    """
    prompt, suffix = req.prompt, req.suffix or ""
    traj, calls, labels = frames
    steps = len(calls)
    head = {**head, "object": "text_completion.diffusion", "steps": steps}
    for k in range(steps):
        # A send that finds room in the socket's buffer returns without giving the event loop a turn, so a
        # stream read as fast as it is written held every other request (docs/reliability.md).
        await asyncio.sleep(0)
        frame = []
        for i in range(p.n):
            text, masked = texts.frame(traj[i, k], p, prompt, suffix)
            frame.append({"index": i, "text": text, "masked": masked, "finish_reason": None})
        yield data({**head, "step": k, **({} if labels is None else labels[k]), "nfe": int(calls[k]), "choices": frame})
    final = [
        {
            "index": i,
            "text": prompt + c["text"] + suffix,
            "completion": c["text"],
            "masked": [],
            "finish_reason": c["finish_reason"],
        }
        for i, c in enumerate(choices)
    ]
    yield data(
        {**head, "step": steps, "nfe": diffusion["nfe"], "choices": final, "usage": usage, "diffusion": diffusion}
    )
    yield {"data": "[DONE]"}
