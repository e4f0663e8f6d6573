"""`sedd serve`: an OpenAI-style completions server for a run directory, and its playground page.

  POST /v1/completions   OpenAI's request and response shapes, plus `steps`,
                         `sampler` and `diffusing` (one SSE event per denoising step)
  GET  /v1/models        the one model served
  GET  /health           liveness and the engine's queue
  GET  /                 the playground (sedd/static/playground.html)

A completion is one reverse diffusion over the model's whole sequence (length
L). The prompt fixes the first P positions, the next M = max_tokens positions
are the completion, the suffix (if any) fixes the S positions after them, and
whatever lies beyond P + M + S is sampled too and cut from the answer, so
prompt and suffix are always conditioned on exactly (the absorbing graph keeps
fixed tokens fixed; see ``sedd.sampling.sample``).

An AR run is served by speculative decoding instead (``--draft``; each row
its own rounds of drafts checked by the run, ``sedd.kinds.Kind.speculation``
and ``sedd.sampling.rounds``): the prompt is a prefix, the text has the run's
law exactly, and each answer says the network calls and the drafts kept.

Requests go to an ``Engine``: one worker thread that runs the compiled
sampler the run's kind gives (``sedd.kinds.Kind.rows_program``; serve itself
knows no kind and no sampler). Requests that can share a program (same steps and sampler, and the
same kind of answer: plain, diffusing frames, or streamed as it settles) that
arrive within a short collection window run as one batch; every row has its
own key ``fold_in(key(seed), row)`` and its own temperature and top_p (traced
values, so no value compiles a program), and a seeded request gives the same
text whatever it was batched with. Batch sizes are rounded up to a few sizes
(``batch_size``) so a few compiled programs serve every load, and at most
``Limits.max_programs`` are kept. The queue is bounded (503 when full), a
request waits at most ``timeout_s`` seconds (then 503), and one whose client
hung up is dropped before it runs.

What a request meets before any of that (``Gate``): a Host header that must
name this server (localhost by default: a page of another site cannot reach
it through DNS rebinding), an optional API key (``Authorization: Bearer``),
a JSON body (``Content-Type: application/json``, so a page cannot post to it
cross-origin without a preflight) that arrives within ``body_timeout_s``.
docs/serving.md shows how to call it and what to set before exposing it.
The package: ``api`` (limits, the request, its plan, errors), ``engine``
(batching), ``texts`` (ids as text and frames), ``app`` (routes and gate),
``main`` (the command line).

Shapes: B batch rows, L length, N steps, V vocabulary, D = graph.dim.
"""

from sedd.serve.api import (APIError, ClientGone, CompletionRequest, Limits, Plan, check_number, plan,
                            validation_error)
from sedd.serve.engine import BATCH_IDS, Busy, Engine, Job, batch_size, batch_sizes
from sedd.serve.texts import MASK_CHAR, Streamed, Texts
from sedd.serve.app import LOCAL_HOSTS, Gate, create_app, host_name, model_name
from sedd.serve.main import API_KEY_ENV, header_timeout_protocol, main

__all__ = ["APIError", "ClientGone", "CompletionRequest", "Limits", "Plan", "check_number", "plan",
           "validation_error", "BATCH_IDS", "Busy", "Engine", "Job", "batch_size", "batch_sizes", "MASK_CHAR",
           "Streamed", "Texts", "LOCAL_HOSTS", "Gate", "create_app", "host_name", "model_name", "API_KEY_ENV",
           "header_timeout_protocol", "main"]

