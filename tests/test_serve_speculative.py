"""sedd serve with speculative decoding: an AR run with n-gram drafts or a smaller AR run's, its rounds streamed."""

import functools
import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

pytest.importorskip("starlette")
pytest.importorskip("sse_starlette")

from starlette.testclient import TestClient  # noqa: E402

import reference  # noqa: E402
import servers  # noqa: E402
from sedd import kinds, runs, serve  # noqa: E402
from sedd.kinds import causal
from sedd import config as config_lib  # noqa: E402
from sedd.data.tokenizers import CharTokenizer  # noqa: E402

CHARS = "abcdefgh ,.\n"
L = 16
LIMITS = serve.Limits(max_steps=16, max_n=4, max_batch=4, max_queue=32, timeout_s=300, window_s=0.0)


@functools.lru_cache(maxsize=None)
def _ar_run(seed: int, width: int = 0) -> runs.Run:
    """A tiny AR run over 12 characters, L = 16, its weights perturbed (so its law depends on the text)."""
    tokenizer = CharTokenizer(CHARS)
    extra = [f"--config.model.hidden_size={width}", "--config.model.cond_dim=16"] if width else []
    config = config_lib.load_config(
        "tiny", ["--config.model.kind=ar", "--config.model.n_layers=1", f"--config.data.seq_len={L}", *extra]
    )
    config = ml_collections.ConfigDict(config.to_dict())
    config.vocab_size = tokenizer.vocab_size
    graphdef, params, rest = nnx.split(kinds.get(config).network(seed), nnx.Param, ...)
    return runs.from_parts(config, tokenizer, graphdef, reference.perturbed(params, 0.5, 7 + seed), rest)


@functools.lru_cache(maxsize=None)
def _block_run() -> runs.Run:
    """A tiny block-diffusion run (b = 4) over the same characters: a drafter of one block a call."""
    tokenizer = CharTokenizer(CHARS)
    config = config_lib.load_config(
        "tiny",
        [
            "--config.model.kind=block",
            "--config.model.block_size=4",
            "--config.model.n_layers=1",
            f"--config.data.seq_len={L}",
        ],
    )
    config = ml_collections.ConfigDict(config.to_dict())
    config.vocab_size = tokenizer.vocab_size
    graphdef, params, rest = nnx.split(kinds.get(config).network(3), nnx.Param, ...)
    return runs.from_parts(config, tokenizer, graphdef, reference.perturbed(params, 0.3, 11), rest)


@functools.lru_cache(maxsize=None)
def _client(draft: str) -> TestClient:
    run = _ar_run(0)
    other = {"ngram": "ngram", "ar": _ar_run(1, 32), "block": _block_run(), "none": None}[draft]
    app = serve.create_app(
        run,
        "sedd-ar",
        LIMITS,
        draft=other,
        draft_k=None if other is None else 3,
        draft_name="sedd-small" if draft == "ar" else None,
    )
    client = TestClient(app, base_url="http://localhost")
    client.__enter__()  # the engine runs for the session
    return client


def _greedy(run: runs.Run, prompt: str, length: int) -> str:
    """The argmax continuation by full forward passes (no cache): the text at temperature 0."""
    ids = reference.greedy_by_full_passes(run.model, run.tokenizer.encode(prompt), length)
    return run.tokenizer.decode(ids[len(prompt) :])


# The AR and prompt-lookup drafters' servers behind -m slow (the block drafter's stays; prompt lookup's law is
# tests/test_speculative.py's), to keep the default suite within 900 CPU s.
@pytest.mark.parametrize(
    "draft", [pytest.param("ngram", marks=pytest.mark.slow), pytest.param("ar", marks=pytest.mark.slow), "block"]
)
def test_temperature_zero_gives_the_greedy_text_and_consistent_stats(draft):
    client, run = _client(draft), _ar_run(0)
    models = client.get("/v1/models").json()["data"][0]
    assert models["kind"] == "ar" and models["draft_k"] == 3
    assert models["draft"] == {"ngram": "ngram", "ar": "sedd-small", "block": "block"}[draft]
    body = {"prompt": "ab c", "max_tokens": 9, "temperature": 0.0, "seed": 1}
    out = client.post("/v1/completions", json=body).json()
    assert out["choices"][0]["text"] == _greedy(run, "ab c", 9)  # the target's argmax, whatever the drafts
    s = out["speculative"]
    assert s["draft_k"] == 3 and s["tokens"] == 9 == out["usage"]["completion_tokens"]
    assert s["target_calls"] == s["rounds"] >= 9 / 4 and s["network_calls"] >= s["rounds"]
    assert s["draft_calls"] == {"ngram": 0, "ar": 4 * s["rounds"], "block": s["rounds"]}[draft]
    assert s["tokens_per_call"] == pytest.approx(9 / s["network_calls"])
    acc = s["acceptance_by_position"]
    assert len(acc) == 3 and all(0 <= a <= 1 for a in acc) and acc == sorted(acc, reverse=True)
    assert s["accepted"] == round(sum(acc) * s["rounds"])
    # every round wrote accepted + 1 tokens: the rounds and the drafts kept account for the text (a last
    # round may write past the completion's end)
    assert 9 <= s["rounds"] + s["accepted"] <= 9 + 3
    if draft == "ar":  # a drafter that draws its argmax too: kept where it agrees with the target
        assert out["diffusion"]["nfe"] == s["rounds"]


def test_seeded_completions_repeat_and_rows_differ():
    client = _client("ngram")
    body = {"prompt": "a", "max_tokens": 12, "n": 2, "seed": 4, "temperature": 1.0, "top_p": 0.9}
    first = client.post("/v1/completions", json=body).json()
    again = client.post("/v1/completions", json=body).json()
    texts = [c["text"] for c in first["choices"]]
    assert texts == [c["text"] for c in again["choices"]] and texts[0] != texts[1]
    assert all(len(t) == 12 and set(t) <= set(CHARS) for t in texts)
    assert first["speculative"]["tokens"] == 24
    engine = client.app.state.engine
    compiles = engine.compiles
    for field, value in (("steps", 3), ("sampler", "euler")):  # not for a run written left to right: refused
        r = client.post("/v1/completions", json={**body, field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field and "model.kind 'ddit'" in r.text
    assert engine.compiles == compiles
    # a row's text is its own: alone (n=1 and the same seed, row 0) it is the same as in the batch of two
    alone = client.post("/v1/completions", json={**body, "n": 1}).json()
    assert alone["choices"][0]["text"] == texts[0]


def test_plain_ar_run_writes_one_token_a_call():
    client = _client("none")
    assert client.get("/v1/models").json()["data"][0]["draft"] is None
    out = client.post("/v1/completions", json={"prompt": "h", "max_tokens": 7, "temperature": 0.0}).json()
    assert out["choices"][0]["text"] == _greedy(_ar_run(0), "h", 7)
    assert out["speculative"]["rounds"] == 7 and out["speculative"]["acceptance_by_position"] == []


def _events(client, body) -> list:
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [line[len("data:") :].strip() for line in r.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


@pytest.mark.parametrize("draft", ["ngram", "ar"])
def test_stream_delivers_each_round_drafted_accepted_and_written(draft):
    client = _client(draft)
    body = {"prompt": "abc", "max_tokens": 10, "n": 2, "seed": 3}
    events = _events(client, body)
    plain = client.post("/v1/completions", json=body).json()
    stats = events[-1]
    assert stats["choices"] == [] and stats["speculative"] == plain["speculative"]
    for i in range(2):
        mine = [c for e in events[:-1] for c in e["choices"] if c["index"] == i]
        assert "".join(c["text"] for c in mine) == plain["choices"][i]["text"]
        rounds = [c["speculative"] for c in mine if "speculative" in c]
        assert len(rounds) >= 1 and [r["round"] for r in rounds] == list(range(len(rounds)))
        text = plain["choices"][i]["text"]
        for r in rounds:  # the kept drafts and the token after them are the text at the round's offset
            assert len(r["drafted"]) == 3 and 0 <= r["accepted"] <= 3
            kept = "".join(r["drafted"][: r["accepted"]]) + r["written"]
            assert text[r["offset"] : r["offset"] + len(kept)] == kept[: max(len(text) - r["offset"], 0)]
        assert rounds[0]["offset"] == 0 and rounds[-1]["offset"] + rounds[-1]["accepted"] + 1 >= 10
        assert sum(r["accepted"] + 1 for r in rounds) >= 10


def test_requests_a_speculative_run_cannot_honour_are_refused():
    client = _client("ngram")
    r = client.post("/v1/completions", json={"prompt": "a", "diffusing": True})
    assert r.status_code == 400 and "stream: true" in r.json()["error"]["message"]
    r = client.post("/v1/completions", json={"prompt": "a", "suffix": "b"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"


@pytest.mark.parametrize("k", [0, -1, 65, 2.5, True, "4", 10**9])
def test_hostile_draft_k_is_refused_in_one_line(k):
    with pytest.raises(ValueError) as e:
        serve.create_app(_ar_run(0), "x", LIMITS, draft="ngram", draft_k=k)
    assert "draft_k must be an integer in [1, 64]" in str(e.value) and "\n" not in str(e.value)


def test_drafts_the_run_cannot_take_are_refused(tiny_run):
    with pytest.raises(ValueError, match="draft_k needs a draft"):
        serve.create_app(_ar_run(0), "x", LIMITS, draft_k=4)
    with pytest.raises(ValueError, match="'ngram', a smaller AR run or a block-diffusion run"):
        serve.create_app(_ar_run(0), "x", LIMITS, draft="bigram")
    ddit = runs.load(tiny_run[0])
    with pytest.raises(ValueError, match="model.kind='ddit' run cannot draft"):  # the drafts: ngram, AR or block
        serve.create_app(_ar_run(0), "x", LIMITS, draft=ddit)
    with pytest.raises(ValueError, match=r"a draft \(--draft\): a model.kind='ddit' run cannot decode by speculative"):
        serve.create_app(ddit, "x", LIMITS, draft="ngram")


def _port() -> int:
    return servers.free_port()


@pytest.mark.parametrize(
    "argv, says",
    [
        (
            ["--draft", "ngram"],
            "a draft (--draft): a model.kind='ddit' run cannot decode by speculative rounds; "
            "model.kind 'ar' or 'spec' can",
        ),
        (["--draft", "ngram", "--draft_k", "0"], "error: draft_k must be an integer in [1, 64]"),
        (["--draft", "ngram", "--draft_k", "100000"], "error: draft_k must be an integer in [1, 64]"),
        (["--draft", "/no/such/run"], "--draft /no/such/run"),
    ],
)
def test_cli_refuses_a_draft_for_a_diffusion_run_and_hostile_draft_k(tiny_run, capsys, argv, says):
    assert serve.main(["--workdir", str(tiny_run[0]), "--port", str(_port()), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err


@pytest.fixture
def browser_server():
    """The base URL of the n-gram-drafted AR run's server on a free localhost port (uvicorn, in a thread)."""
    pytest.importorskip("uvicorn")
    app = serve.create_app(_ar_run(0), "sedd-ar", LIMITS, draft="ngram", draft_k=3)
    with servers.serving(app) as port:
        yield f"http://127.0.0.1:{port}"


def test_playground_shows_kept_and_rejected_drafts_in_headless_chromium(browser_server, tmp_path):
    import time

    from test_serve import _chromium

    browser = _chromium()
    try:
        browser.get(browser_server + "/")
        deadline = time.monotonic() + 30
        while "speculative decoding" not in browser.find_element("id", "model").text:
            assert time.monotonic() < deadline, "the page did not describe the run"
            time.sleep(0.05)
        assert browser.find_element("id", "suffix").get_attribute("disabled")
        for id_, value in (("prompt", "abc"), ("seed", "2"), ("max_tokens", "12")):
            browser.find_element("id", id_).clear()
            browser.find_element("id", id_).send_keys(value)
        browser.find_element("id", "go").click()
        deadline = time.monotonic() + 300
        while browser.execute_script("return document.getElementById('replay').disabled"):
            assert time.monotonic() < deadline, "the stream did not end"
            time.sleep(0.05)
        assert browser.find_element("id", "error").text == ""
        rounds = browser.execute_script("return rounds")
        assert rounds and all(len(r["drafted"]) == 3 for r in rounds)
        classes = browser.execute_script("return Array.from(document.querySelectorAll('#out span'), s => s.className)")
        assert classes[0] == "fixed" and classes.count("written") == len(rounds)
        assert ("rejected" in classes) == any(r["accepted"] < 3 for r in rounds)
        assert ("kept" in classes) == any(r["accepted"] > 0 for r in rounds)
        stats = browser.find_element("id", "stats").text
        assert f"round {len(rounds)} / {len(rounds)}" in stats and "acceptance by draft position" in stats
        assert "12 tokens in" in stats
        browser.save_screenshot(str(tmp_path / "playground_speculative.png"))
    finally:
        browser.quit()


def test_a_round_past_the_models_length_sees_the_whole_text():
    """A round at the text's end scores positions past max_len: the cache keeps room, no position is lost."""
    run = _ar_run(0)
    prefill, target = causal.speculative_target(run.graphdef)
    rng = np.random.default_rng(0)
    text = jnp.asarray(rng.integers(0, len(CHARS), (1, L + 5)), jnp.int32)  # positions 14, 15 and past L drafted
    p, _ = target(prefill((run.params, run.rest), text[:, :14]), text, jnp.asarray([14]), 4)
    full = jax.nn.softmax(causal.next_token_logits(run.model, text[:, :L]), -1)[0, 14:16]
    np.testing.assert_allclose(np.asarray(p[0, :2]), np.asarray(full), rtol=1e-4, atol=1e-5)
