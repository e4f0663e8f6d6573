"""A sedd serve app on a free localhost port, uvicorn in a background thread: the tests' one way to start it."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


def free_port() -> int:
    """A localhost port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(app, *, start_timeout: float = 30, **config):
    """Yield the port of `app` served by uvicorn on 127.0.0.1 (config: more ``uvicorn.Config`` keywords)."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=30)
