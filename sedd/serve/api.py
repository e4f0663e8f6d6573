"""What `sedd serve` accepts: its limits, the request's body, its plan in token positions, and its errors."""

from __future__ import annotations

import dataclasses
import math
import secrets

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.responses import JSONResponse

from sedd import runs, sampling, validate
from sedd.kinds import capabilities


# --------------------------------------------------------------------------- limits and errors


def check_number(name: str, value, low: float, strict: bool, integer: bool, high: float = math.inf) -> None:
    """Raise ValueError unless value is a finite number (an integer when asked) >= low (> low when strict), <= high."""
    types = (int,) if integer else (int, float)
    ok = isinstance(value, types) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < low or (strict and value == low):
        what = "an integer" if integer else "a finite number"
        raise ValueError(f"{name} must be {what} {'>' if strict else '>='} {low:g}, got {value!r}")
    if value > high:
        raise ValueError(f"{name} must be at most {high:g}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the server accepts and how it batches; each value is checked when the Limits are made.

    Attributes:
      max_steps: most denoising steps a request may ask for.
      max_n: most completions (`n`) per request.
      max_batch: most rows in one batch of the engine (>= max_n).
      max_queue: most requests waiting; beyond it a request gets 503.
      timeout_s: most seconds a request waits for its result; then 503.
      window_s: how long the engine waits for more requests to batch with the first.
      max_body_bytes: largest request body; beyond it 413.
      max_programs: compiled programs kept (one per batch size, steps, sampler
        and kind of answer); beyond it the least recently used is dropped.
      header_timeout_s: seconds a connection may take to send a request's
        headers (from its opening or its previous answer); then it is closed.
      body_timeout_s: seconds a request's body may take to arrive; then 408.
      send_timeout_s: seconds one event of a stream may take to be sent (a
        client that reads nothing); then the stream is dropped with what it
        holds (the trajectory of a diffusing request).
    """

    max_steps: int = 1024
    max_n: int = 16
    max_batch: int = 64
    max_queue: int = 256
    timeout_s: float = 120.0
    window_s: float = 0.005
    max_body_bytes: int = 65536
    max_programs: int = 64
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    send_timeout_s: float = 30.0

    def __post_init__(self):
        for name in ("max_steps", "max_n", "max_batch", "max_queue", "max_body_bytes", "max_programs"):
            check_number(name, getattr(self, name), 1, strict=False, integer=True)
        # At most a day: a threading wait of ~1e9 s or more overflows (a window of 1e297 s killed the engine).
        for name in ("timeout_s", "header_timeout_s", "body_timeout_s", "send_timeout_s"):
            check_number(name, getattr(self, name), 0, strict=True, integer=False, high=86_400.0)
        check_number("window_s", self.window_s, 0, strict=False, integer=False, high=60.0)


class APIError(Exception):
    """An error answered in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict | None = None,
    ):
        message = validate.clipped(message)  # a 400 may echo a request's value: never whole
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers

    def response_body(self) -> dict:
        """The error object: {"message", "type", "param", "code"}."""
        return {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.response_body()}, status_code=self.status, headers=self.headers)


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


def validation_error(e: ValidationError) -> APIError:
    """The first problem pydantic found, as a 400 naming the field."""
    err = e.errors()[0]
    param = ".".join(str(p) for p in err["loc"]) or None
    if err["type"] == "extra_forbidden":
        return APIError(400, f"unknown field {param!r}", param, "unknown_field")
    if err["type"] == "json_invalid":
        return APIError(400, f"the body is not valid JSON: {err['msg']}", None, "invalid_json")
    if err["type"] == "missing":
        return APIError(400, f"{param} is required", param, "missing_field")
    return APIError(400, f"{param}: {err['msg']} (got {err.get('input')!r})", param, "invalid_value")


# --------------------------------------------------------------------------- the request


MAX_STOPS = 16
MAX_STOP_CHARS = 1024


class CompletionRequest(BaseModel):
    """The body of POST /v1/completions: OpenAI's fields, plus steps, sampler and diffusing."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    prompt: str = ""
    suffix: str | None = None
    max_tokens: int | None = Field(None, ge=1)  # default: up to the end of the model's length
    n: int = Field(1, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, lt=2**32)
    stop: str | list[str] | None = None
    stream: bool = False
    user: str | None = None
    steps: int | None = Field(None, ge=1)
    sampler: str | None = None
    diffusing: bool = False

    @field_validator("stop")
    @classmethod
    def _few_short_stops(cls, stop):
        """At most MAX_STOPS stop strings of at most MAX_STOP_CHARS characters: each costs the server CPU at
        every step (docs/reliability.md measured it)."""
        items = [stop] if isinstance(stop, str) else stop or []
        if len(items) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in items):
            raise ValueError(
                f"at most {MAX_STOPS} stop strings of at most {MAX_STOP_CHARS} characters each (OpenAI takes 4)"
            )
        return stop


@dataclasses.dataclass
class Plan:
    """A validated request, in token positions: prompt [0, P), completion [P, P + M), suffix after."""

    n: int
    steps: int
    sampler: str
    seed: int
    mask: np.ndarray  # bool[L], True where the token is given
    tokens: np.ndarray  # int32[L]
    start: int  # P
    length: int  # M
    suffix_start: int  # P + M
    suffix_len: int  # S
    temperature: float = 1.0  # on the denoiser (sedd.sampling.sample); 0 = argmax
    top_p: float = 1.0  # nucleus of the denoiser


def plan(run: runs.Run, req: CompletionRequest, limits: Limits) -> Plan:
    """Check a request against the model and the limits, and place prompt, completion and suffix.

    Raises:
      APIError: 400 naming the field at fault.
    """
    s = run.config.sampling
    for name, value in (("steps", req.steps), ("sampler", req.sampler)):
        try:  # the kind's own refusal, as `sedd sample` gives it
            capabilities.check_given(run.kind, **{name: value})
        except ValueError as e:
            raise APIError(400, str(e), name, "unsupported_value") from None
    sampler = req.sampler or s.sampler
    try:
        run.kind.check_sampler(sampler)
    except sampling.UnknownSampler:
        why = f"unknown sampler {sampler!r}; expected one of {sorted(sampling.SAMPLERS)}"
        raise APIError(400, why, "sampler", "unknown_sampler") from None
    except ValueError as e:
        why = f"sampler {sampler!r} cannot sample this model: {e}"
        raise APIError(400, why, "sampler", "unsupported_value") from None
    for name, value in (("temperature", req.temperature), ("top_p", req.top_p)):
        try:
            run.kind.check_options(sampler, **{name: value})
        except ValueError as e:
            why = f"{name}={value} is not supported by sampler {sampler!r} on this model ({e}); only {name}=1.0 is"
            raise APIError(400, why, name, "unsupported_value") from None
    steps = s.steps if req.steps is None else req.steps
    for name, value, most in (("steps", steps, limits.max_steps), ("n", req.n, limits.max_n)):
        if value > most:
            raise APIError(400, f"{name}={value} is over this server's limit of {most}", name, f"{name}_over_limit")
    L = run.seq_len
    for name, text in (("prompt", req.prompt), ("suffix", req.suffix or "")):  # before any encoding
        try:
            sampling.check_length(run.tokenizer, text, L, name)
        except ValueError as e:
            raise APIError(400, str(e), name, "context_length_exceeded") from None
    encoded = {}
    for name, text in (("prompt", req.prompt), ("suffix", req.suffix or "")):
        try:
            encoded[name] = np.asarray(run.tokenizer.encode(text), np.int32) if text else np.zeros(0, np.int32)
        except ValueError as e:
            raise APIError(400, f"{name}: {e}", name, "unencodable_text") from None
    pre, suf = encoded["prompt"], encoded["suffix"]
    try:
        capabilities.check_given(run.kind, patterns=("suffix",) if len(suf) else ())
    except ValueError as e:
        raise APIError(400, str(e), "suffix", "unsupported_value") from None
    room = L - len(pre) - len(suf)
    if room < 1:
        raise APIError(
            400,
            f"prompt ({len(pre)} tokens) + suffix ({len(suf)} tokens) leave no room in the "
            f"model's sequence length of {L} tokens",
            "prompt",
            "context_length_exceeded",
        )
    length = room if req.max_tokens is None else req.max_tokens
    if length > room:
        raise APIError(
            400,
            f"max_tokens={length} is over the {room} tokens the model's length of {L} leaves "
            f"after a prompt of {len(pre)} and a suffix of {len(suf)} tokens",
            "max_tokens",
            "context_length_exceeded",
        )
    mask, tokens = np.zeros(L, bool), np.zeros(L, np.int32)
    p, q = len(pre), len(pre) + length
    mask[:p], tokens[:p] = True, pre
    mask[q : q + len(suf)], tokens[q : q + len(suf)] = True, suf
    seed = secrets.randbits(32) if req.seed is None else req.seed
    return Plan(
        req.n, steps, sampler, seed, mask, tokens, p, length, q, len(suf), float(req.temperature), float(req.top_p)
    )
