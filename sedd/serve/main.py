"""`sedd serve`'s command line: its options checked, the run loaded, uvicorn started."""

from __future__ import annotations

import argparse
import gc
import os
import socket
import sys
import time

import uvicorn

from sedd import runs, validate
from sedd.kinds import capabilities
from sedd.serve.api import Limits
from sedd.serve.app import LOCAL_HOSTS, create_app, model_name

API_KEY_ENV = "SEDD_API_KEY"  # read when --api_key is not given (a key on the command line shows in `ps`)
DESCRIPTION = "`sedd serve`: an OpenAI-style completions server for a run directory, and its playground page."


def header_timeout_protocol(seconds: float):
    """uvicorn's httptools protocol, closing a connection whose request headers take over `seconds`.

    The clock runs from the connection's opening and from each answer's end
    to the end of the next request's headers; uvicorn itself waits for
    headers for ever once a byte of them has arrived. Returns None where
    httptools is missing (uvicorn then uses h11, without this timeout).
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # optional dependency: httptools
    except ImportError:
        return None

    class HeaderTimeout(HttpToolsProtocol):
        _timer = None

        def _arm(self):
            self._disarm()
            self._timer = self.loop.call_later(seconds, self._late)

        def _disarm(self):
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _late(self):
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def on_headers_complete(self):
            self._disarm()
            super().on_headers_complete()

        def on_response_complete(self):
            waiting = bool(self.pipeline)  # a pipelined request whose headers are in runs next
            super().on_response_complete()
            if not waiting and not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc):
            self._disarm()
            super().connection_lost(exc)

    return HeaderTimeout


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's
LIMIT_FLAGS = {  # flag -> (the ``Limits`` field it sets, its help); --window_ms sets window_s in milliseconds
    "max_steps": ("max_steps", "most steps a request may ask for"),
    "max_n": ("max_n", "most completions per request"),
    "max_batch": ("max_batch", "most rows in one batch"),
    "max_queue": ("max_queue", "most waiting requests (then 503)"),
    "max_programs": ("max_programs", "compiled programs kept (the least recently used is dropped beyond)"),
    "timeout": ("timeout_s", "seconds a request may wait (then 503)"),
    "header_timeout": ("header_timeout_s", "seconds a connection may take to send a request's headers (then closed)"),
    "body_timeout": ("body_timeout_s", "seconds a request's body may take to arrive (then 408)"),
    "send_timeout": ("send_timeout_s", "seconds one stream event may take to be sent (then the stream is dropped)"),
    "window_ms": ("window_s", "collection window of a batch, in milliseconds (0: no batching wait)"),
    "max_body": ("max_body_bytes", "largest request body, bytes"),
}


def check_address(host: str, port: int) -> None:
    """Raise ValueError unless this machine can listen on host:port: resolved and bound once, then let go.

    Checked before the run is read, so a name that does not resolve, an
    address of another machine or a port in use is one line, not uvicorn's
    error after the model has loaded.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError) as e:
        raise ValueError(f"--host {host!r} is not an address of this machine ({e})") from None
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind(address)
        except OSError as e:
            raise ValueError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e})") from None


def _parser() -> argparse.ArgumentParser:
    d = Limits()
    parser = validate.OneLineParser(prog="sedd serve", description=DESCRIPTION)
    parser.add_argument("--workdir", required=True, help="the run directory to serve")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: localhost only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--allowed_hosts",
        default="",
        help="comma-separated names a request's Host header may give, besides localhost, "
        "127.0.0.1, ::1 and a --host other than 0.0.0.0 / :: ('*': any; see docs/serving.md)",
    )
    parser.add_argument(
        "--api_key",
        default=None,
        help=f"require `Authorization: Bearer KEY` on /v1/ (default: ${API_KEY_ENV}, else none)",
    )
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
    parser.add_argument("--model_name", default=None, help="the model id (default: sedd-<run directory name>)")
    for flag, (field, what) in LIMIT_FLAGS.items():
        default = getattr(d, field) * (1e3 if flag == "window_ms" else 1)
        parser.add_argument(f"--{flag}", type=type(default), default=default, help=what)
    parser.add_argument(
        "--log_level", default="info", choices=LOG_LEVELS, help="uvicorn's log level (warning: no line per request)"
    )
    parser.add_argument(
        "--warmup",
        action="store_true",
        help="compile every batch size of the warm-up steps and the default sampler before serving",
    )
    parser.add_argument("--warmup_steps", type=int, default=None, help="steps to compile (default: the run's)")
    parser.add_argument(
        "--draft",
        default="",
        help="an AR run only: speculative decoding, the run's own law in fewer calls, with drafts "
        "from 'ngram' (prompt lookup), a smaller AR run's or a block-diffusion run's directory "
        "(default: its draft head's, else one token a call; a model.kind='spec' run drafts for itself)",
    )
    parser.add_argument(
        "--draft_k",
        type=int,
        default=None,
        help="drafts a round with --draft (default 4), or of a run's own drafts (at most its model.draft_k)",
    )
    parser.add_argument(
        "--layout",
        default=None,
        help="a spec run's round, 'K,GROUPS', or an AR run's with a draft head, 'K' ('0': no drafts) or "
        "'auto' (the default: the fastest on this device at batch 1, timed once and kept in the run's "
        "layouts.json; docs/speculative.md)",
    )
    return parser


def _options(args) -> tuple[Limits, tuple[str, ...], str | None]:
    """(limits, allowed hosts, API key) of the command line, each value checked.

    Raises:
      ValueError: naming the option and the value refused.
    """
    validate.check_args("serve", args)  # every number in its bounds (sedd.validate.CLI_BOUNDS["serve"])
    check_address(args.host, args.port)
    if args.max_batch < args.max_n:
        raise ValueError(f"--max_batch {args.max_batch} must be at least --max_n {args.max_n}")
    if args.warmup_steps is not None and not 1 <= args.warmup_steps <= args.max_steps:
        raise ValueError(f"--warmup_steps {args.warmup_steps} must be in [1, --max_steps {args.max_steps}]")
    values = {field: getattr(args, flag) for flag, (field, _) in LIMIT_FLAGS.items()}
    limits = Limits(**{**values, "window_s": args.window_ms / 1e3})
    hosts = [*LOCAL_HOSTS, *(h.strip() for h in args.allowed_hosts.split(",") if h.strip())]
    if args.host not in ("0.0.0.0", "::", ""):
        hosts.append(args.host)
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    if key is not None and (not key or any(c.isspace() for c in key)):
        raise ValueError("--api_key must be a non-empty key without spaces")
    return limits, tuple(dict.fromkeys(hosts)), key


def main(argv: list[str] | None = None) -> int:
    """`sedd serve --workdir RUN [--host 127.0.0.1] [--port 8000] [--draft ngram|RUN] [limits ...]`; the exit code."""
    args = _parser().parse_args(argv)
    try:
        limits, hosts, key = _options(args)
        run = runs.load(args.workdir, step=args.step)
        draft = args.draft if args.draft in ("", "ngram") else runs.load(args.draft)
        given = {
            "layout": None if args.layout == "auto" else args.layout,
            "draft_k": args.draft_k,
            "draft": draft or None,
        }
        if line := capabilities.tune(run.kind, run.net, given, args.workdir, 1, progress=True):
            print(line, flush=True)  # its sampling's settings: the fastest here unless asked
        app = create_app(
            run,
            args.model_name or model_name(args.workdir),
            limits,
            hosts,
            key,
            draft=draft or None,
            draft_k=args.draft_k,
            draft_name=model_name(args.draft) if args.draft not in ("", "ngram") else None,
        )
    except (FileNotFoundError, RuntimeError, ValueError) as e:
        print(f"sedd serve: error: {validate.clipped(str(e))}", file=sys.stderr)
        return 2
    name = app.state.name
    if args.warmup:
        t0 = time.perf_counter()
        app.state.engine.warmup(steps=args.warmup_steps)
        print(f"compiled the batch sizes up to {limits.max_batch} in {time.perf_counter() - t0:.1f} s")
    access = "an API key is required" if key else "no API key: whoever can reach the port can use it"
    drafts = "" if not args.draft else f", speculative decoding with {args.draft} drafts"
    print(
        f"serving {name} (step {run.step}, length {run.seq_len}{drafts}) on http://{args.host}:{args.port}/ "
        f"for the hosts {', '.join(hosts)}; {access}"
    )
    protocol = header_timeout_protocol(limits.header_timeout_s)
    if protocol is None:
        print(
            "sedd serve: warning: without httptools (pip install 'uvicorn[standard]') there is no header timeout",
            file=sys.stderr,
        )
    # JAX, the model and the compiled programs are millions of long-lived objects; a full collection walks
    # them all, pausing the whole server (GIL held) under load (docs/serving.md). Frozen, the collector
    # skips them.
    gc.collect()
    gc.freeze()
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, http=protocol or "auto")
    return 0
