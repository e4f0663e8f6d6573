"""`sedd serve`: an OpenAI-style completions server for a run directory, and its playground page.

  POST /v1/completions   OpenAI's request and response shapes, plus `steps`,
                         `sampler` and `diffusing` (one SSE event per denoising step)
  GET  /v1/models        the one model served
  GET  /health           liveness and the engine's queue
  GET  /                 the playground (sedd/static/playground.html)

A diffusion run's completion is one reverse diffusion over the model's
sequence: the prompt fixes the first positions, the suffix the positions
after the completion, exactly (the absorbing graph keeps fixed tokens fixed).
A run that speculates (an AR run with ``--draft``, a spec run) is served by
rounds of drafts checked by the run (``sedd.sampling.rounds``), its law
exactly. serve asks the run's kind for its program through its capability
(``sedd.kinds.capabilities``) and names no kind and no sampler.

An ``Engine`` (one worker thread) runs requests that can share a compiled
program and arrive within a short window as one batch (docs/serving.md,
"Batching"); before that the ``Gate`` checks the Host header, an optional API
key and the body. The package: ``api`` (limits, the request, its plan,
errors), ``engine`` (batching), ``texts`` (ids as text and frames), ``app``
(routes and gate), ``main`` (the command line).

Shapes: B batch rows, L length, N steps, V vocabulary, D = graph.dim.
"""

from sedd.serve.api import APIError, ClientGone, CompletionRequest, Limits, Plan, check_number, plan, validation_error
from sedd.serve.engine import BATCH_IDS, Busy, Engine, Job, batch_size, batch_sizes
from sedd.serve.texts import MASK_CHAR, Streamed, Texts
from sedd.serve.app import LOCAL_HOSTS, Gate, create_app, host_name, model_name
from sedd.serve.main import API_KEY_ENV, header_timeout_protocol, main

__all__ = [
    "APIError",
    "ClientGone",
    "CompletionRequest",
    "Limits",
    "Plan",
    "check_number",
    "plan",
    "validation_error",
    "BATCH_IDS",
    "Busy",
    "Engine",
    "Job",
    "batch_size",
    "batch_sizes",
    "MASK_CHAR",
    "Streamed",
    "Texts",
    "LOCAL_HOSTS",
    "Gate",
    "create_app",
    "host_name",
    "model_name",
    "API_KEY_ENV",
    "header_timeout_protocol",
    "main",
]
