"""Every kind streams exactly what it answers: the chunks of each choice add up to its unstreamed text.

A served spec run once streamed text that was not its answer (its first event
filled every position not yet written with id 0, later events added nothing):
the kind did not say which id an unwritten position holds. Here a spec run,
an AR run with n-gram drafts, a block run and a SEDD run each answer the same
request of n = 2 choices streamed and unstreamed, with and without `stop`.
"""

import functools
import json

import ml_collections
import pytest
from flax import nnx

pytest.importorskip("starlette")
pytest.importorskip("sse_starlette")

from starlette.testclient import TestClient  # noqa: E402

import reference  # noqa: E402
from sedd import config as config_lib  # noqa: E402
from sedd import kinds, runs, serve  # noqa: E402
from sedd.data.tokenizers import CharTokenizer  # noqa: E402

pytestmark = pytest.mark.dtypes  # .ci/run runs this file again in the other compute dtype

CHARS = "abcdefgh ,.\n"
L = 16
LIMITS = serve.Limits(max_steps=16, max_n=2, max_batch=2, max_queue=8, timeout_s=300, window_s=0.0)
KINDS = {
    "spec": ["--config.model.kind=spec", "--config.model.draft_k=3"],
    "ar": ["--config.model.kind=ar"],
    "block": ["--config.model.kind=block", "--config.model.block_size=4"],
    "ddit": ["--config.sampling.steps=8"],
}


@functools.lru_cache(maxsize=None)
def _run(kind: str) -> runs.Run:
    """A tiny run of `kind` over 12 characters, L = 16, weights perturbed so its law depends on the text."""
    tokenizer = CharTokenizer(CHARS)
    config = config_lib.load_config("tiny", ["--config.model.n_layers=1", f"--config.data.seq_len={L}", *KINDS[kind]])
    config = ml_collections.ConfigDict(config.to_dict())
    config.vocab_size = tokenizer.vocab_size
    graphdef, params, rest = nnx.split(kinds.get(config).network(0), nnx.Param, ...)
    return runs.from_parts(config, tokenizer, graphdef, reference.perturbed(params, 0.5, 7), rest)


@functools.lru_cache(maxsize=None)
def _client(kind: str) -> TestClient:
    draft = {"ar": "ngram"}.get(kind)
    client = TestClient(serve.create_app(_run(kind), f"sedd-{kind}", LIMITS, draft=draft), base_url="http://localhost")
    client.__enter__()  # the engine runs for the session
    return client


def _streamed(client: TestClient, body: dict) -> list[str]:
    """The text each choice of a streamed request received, its chunks joined."""
    texts = [""] * body["n"]
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                for choice in json.loads(line[5:])["choices"]:
                    texts[choice["index"]] += choice["text"]
    return texts


@pytest.mark.parametrize("stop", [None, ["a"], [" ", "h,"]])
@pytest.mark.parametrize("kind", list(KINDS))
def test_streamed_chunks_add_up_to_the_answer(kind, stop):
    client = _client(kind)
    body = {"prompt": "ab c", "n": 2, "max_tokens": 10, "seed": 1, **({"stop": stop} if stop else {})}
    answer = client.post("/v1/completions", json=body)
    assert answer.status_code == 200, answer.text
    texts = [c["text"] for c in sorted(answer.json()["choices"], key=lambda c: c["index"])]
    assert _streamed(client, body) == texts
    if stop is None:  # 10 tokens of one character each (none is a mask or the unwritten id's text)
        assert all(len(t) == 10 for t in texts), texts
