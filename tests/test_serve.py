"""sedd.serve: the official openai client against a tiny trained run, the diffusing stream, errors, batching."""

import concurrent.futures
import json
import os
import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("sse_starlette")
openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

from starlette.testclient import TestClient  # noqa: E402

import servers  # noqa: E402
from sedd import runs, serve  # noqa: E402
from sedd.sampling import lanes as lanes_lib  # noqa: E402

LIMITS = serve.Limits(
    max_steps=16, max_n=4, max_batch=8, max_queue=32, timeout_s=120, window_s=0.3, max_body_bytes=2048
)
NAME = "sedd-tiny"


@pytest.fixture(scope="module")
def server(tiny_run):
    """(base URL, run) of a server on a free localhost port, in a background thread."""
    run = runs.load(tiny_run[0])
    with servers.serving(serve.create_app(run, NAME, LIMITS)) as port:
        yield f"http://127.0.0.1:{port}", run


def client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.dtypes  # end to end: .ci/run runs it again in the other compute dtype
def test_openai_client_non_streaming_and_streaming(server):
    base, run = server
    c = client(base)
    assert [m.id for m in c.models.list().data] == [NAME]
    assert httpx.get(f"{base}/health").json()["status"] == "ok"
    args = dict(model=NAME, prompt="ROMEO:", max_tokens=10, n=2, seed=3, extra_body={"steps": 6})
    out = c.completions.create(**args)
    assert len(out.choices) == 2 and out.usage.prompt_tokens == 6 and out.usage.completion_tokens == 20
    for choice in out.choices:
        # One character per token; a shorter text must have stopped at the end-of-text token.
        assert len(choice.text) == 10 if choice.finish_reason == "length" else len(choice.text) < 10
        run.tokenizer.encode(choice.text)  # only characters of the vocabulary
    assert out.choices[0].text != out.choices[1].text  # rows have their own keys
    again = c.completions.create(**args)
    assert [ch.text for ch in again.choices] == [ch.text for ch in out.choices]  # seeded: reproducible

    chunks = list(c.completions.create(**args, stream=True))
    streamed = ["".join(ch.text for k in chunks for ch in k.choices if ch.index == i) for i in range(2)]
    assert streamed == [ch.text for ch in out.choices]
    assert {ch.finish_reason for k in chunks for ch in k.choices} - {None} <= {"length", "stop"}


class _SlowListeners(dict):
    """sedd.sampling.lanes.LISTENERS whose listeners take 50 ms a call: the sampling of a streamed batch lasts a while."""

    def get(self, key, default=None):
        listener = super().get(key, default)
        if listener is None:
            return None

        def slow(*update):
            listener(*update)
            time.sleep(0.05)

        return slow


def test_stream_sends_text_as_it_settles_while_sampling_runs(server, monkeypatch):
    """Issue 34: `stream: true` arrived as one chunk after sampling ended; now positions settled so far are sent."""
    base, run = server
    monkeypatch.setattr(lanes_lib, "LISTENERS", _SlowListeners())
    body = {"model": NAME, "prompt": "ROMEO:", "max_tokens": 24, "n": 2, "steps": 16, "seed": 7, "sampler": "analytic"}
    arrived = []
    with httpx.stream("POST", f"{base}/v1/completions", json={**body, "stream": True}, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                arrived.append((time.monotonic(), line[len("data:") :].strip()))
    assert arrived[-1][1] == "[DONE]"
    chunks = [(t, json.loads(d)) for t, d in arrived[:-1]]
    last = max(t for t, c in chunks if c["choices"][0]["finish_reason"] is not None)
    early = [c for t, c in chunks if c["choices"][0]["text"] and t < last - 0.1]  # sent while the sampling ran
    assert len(early) > 1
    plain = httpx.post(f"{base}/v1/completions", json=body, timeout=120).json()
    for i in range(2):
        streamed = "".join(c["choices"][0]["text"] for _, c in chunks if c["choices"][0]["index"] == i)
        assert streamed == plain["choices"][i]["text"]


def test_streamed_text_holds_back_what_a_stop_string_could_still_cut(server):
    _, run = server
    texts = serve.Texts(run)
    p = serve.plan(run, serve.CompletionRequest(prompt="a", max_tokens=8, steps=2, seed=0), serve.Limits())
    mask, ids = texts.mask_id, run.tokenizer.encode("aROMEO: x")
    state = np.full(run.seq_len, mask, np.int32)
    streamed = serve.Streamed(texts, p, ["EO:", "MEO"])
    state[:5] = ids[:5]  # "a" + "ROME" settled
    assert streamed.update(0, state) == "RO"  # "ME" could begin "MEO"
    state[5:7] = ids[5:7]  # "O:" settles: the first stop string wins, the choice is done
    assert streamed.update(0, state) == "" and streamed.done[0]
    assert streamed.rest(0, texts.completion(run.tokenizer.encode("aROMEO: x" + "a" * 23), p, ["EO:", "MEO"])[0]) == ""


def _events(response):
    """The JSON events of an SSE response, and whether it ended with [DONE]."""
    data = [line[len("data:") :].strip() for line in response.iter_lines() if line.startswith("data:")]
    return [json.loads(d) for d in data if d != "[DONE]"], data[-1] == "[DONE]"


def test_diffusing_stream_resolves_masks_and_keeps_prompt_and_suffix(server):
    base, run = server
    steps, prompt, suffix, m = 6, "ROMEO:", " END", 12
    body = {"model": NAME, "prompt": prompt, "suffix": suffix, "max_tokens": m, "steps": steps, "seed": 5}
    with httpx.stream("POST", f"{base}/v1/completions", json={**body, "diffusing": True}, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        frames, done = _events(r)
    assert done and len(frames) == steps + 1
    assert [f["step"] for f in frames] == list(range(steps + 1))
    counts = []
    for f in frames:
        (choice,) = f["choices"]
        text, masked = choice["text"], choice["masked"]
        assert text.startswith(prompt) and text.endswith(suffix)
        assert masked == [i for i, ch in enumerate(text) if ch == serve.MASK_CHAR]
        counts.append(len(masked))
    assert counts[0] == m and counts[-1] == 0
    assert all(a >= b for a, b in zip(counts, counts[1:]))
    assert any(0 < k < m for k in counts)  # frames in between show text resolving
    final = frames[-1]["choices"][0]
    plain = httpx.post(f"{base}/v1/completions", json=body, timeout=120).json()
    assert final["completion"] == plain["choices"][0]["text"]  # the same text with or without frames
    assert final["text"] == prompt + plain["choices"][0]["text"] + suffix
    # NFE as measured by the sampler: a call per step while a mask is left, then the denoise's (if one is left)
    nfes = [f["nfe"] for f in frames]
    assert nfes[0] == 0 and all(0 <= b - a <= 1 for a, b in zip(nfes, nfes[1:]))
    made = sum(c > 0 for c in counts[:-1])  # steps that began with a mask
    assert nfes[-1] == frames[-1]["diffusion"]["nfe"] in (made, made + 1)
    assert frames[-1]["diffusion"]["tokens_per_second"] > 0


BAD = [  # (body or raw bytes, status, code, param)
    ({"prompt": "a", "foo": 1}, 400, "unknown_field", "foo"),
    ({"prompt": "a", "max_tokens": "5"}, 400, "invalid_value", "max_tokens"),
    ({"prompt": 7}, 400, "invalid_value", "prompt"),
    ({"prompt": "a", "stream": "yes"}, 400, "invalid_value", "stream"),
    (b"{not json", 400, "invalid_json", None),
    ({"prompt": "ROMEO " * 6}, 400, "context_length_exceeded", "prompt"),  # 36 tokens > L = 32
    ({"prompt": "ROMEO:", "max_tokens": 27}, 400, "context_length_exceeded", "max_tokens"),
    ({"prompt": "a", "steps": LIMITS.max_steps + 1}, 400, "steps_over_limit", "steps"),
    ({"prompt": "a", "n": LIMITS.max_n + 1}, 400, "n_over_limit", "n"),
    ({"prompt": "a", "sampler": "no_such_sampler"}, 400, "unknown_sampler", "sampler"),
    ({"prompt": "caf\u00e9 \u4e2d"}, 400, "unencodable_text", "prompt"),
    ({"prompt": "a", "suffix": "\u4e2d"}, 400, "unencodable_text", "suffix"),
    ({"prompt": "a", "temperature": 2.5}, 400, "invalid_value", "temperature"),
    ({"prompt": "a", "top_p": 0.0}, 400, "invalid_value", "top_p"),
    ({"prompt": "a", "model": "gpt-4"}, 404, "model_not_found", "model"),
    ({"prompt": "a" * 3000}, 413, "request_too_large", None),
]


def test_bad_requests_get_openai_errors_and_the_server_stays_up(server):
    base, run = server
    for body, status, code, param in BAD:
        kwargs = (
            {"content": body, "headers": {"content-type": "application/json"}}
            if isinstance(body, bytes)
            else {"json": body}
        )
        r = httpx.post(f"{base}/v1/completions", timeout=60, **kwargs)
        assert r.status_code == status, (body, r.text)
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        assert (error["code"], error["param"]) == (code, param), (body, error)
    r = httpx.get(f"{base}/no/such/route")
    assert r.status_code == 404 and "error" in r.json()
    with pytest.raises(openai.BadRequestError) as e:
        client(base).completions.create(model=NAME, prompt="a", extra_body={"sampler": "nope"})
    assert e.value.body["code"] == "unknown_sampler"
    good = httpx.post(
        f"{base}/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 4, "steps": 6, "seed": 0}, timeout=120
    )
    assert good.status_code == 200 and len(good.json()["choices"]) == 1


def test_concurrent_requests_share_a_batch_and_keep_their_seeded_text(server):
    base, _ = server
    body = {"prompt": "ROMEO:", "max_tokens": 8, "steps": 6}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        outs = list(
            pool.map(
                lambda s: httpx.post(f"{base}/v1/completions", json={**body, "seed": s}, timeout=120), [10, 11, 12, 13]
            )
        )
    outs = [o.json() for o in outs]
    assert max(o["diffusion"]["batch_rows"] for o in outs) > 1  # within the 0.3 s window
    alone = httpx.post(f"{base}/v1/completions", json={**body, "seed": 12}, timeout=120).json()
    assert alone["choices"][0]["text"] == outs[2]["choices"][0]["text"]


def _plan(n=1, steps=4):
    mask, tokens = np.zeros(8, bool), np.zeros(8, np.int32)
    return serve.Plan(n, steps, "analytic", 0, mask, tokens, 0, 8, 8, 0)


def test_engine_batches_one_program_in_arrival_order_and_refuses_when_full(server):
    _, run = server
    engine = serve.Engine(run, serve.Limits(max_queue=4, max_batch=4, window_s=0.0))  # not started: no thread
    futures = [engine.submit(_plan(n, s), False) for n, s in [(2, 4), (1, 8), (1, 4), (2, 4)]]
    with pytest.raises(serve.Busy):
        engine.submit(_plan(), False)
    batch = engine._take()
    assert [j.future for j in batch] == [futures[0], futures[2]]  # steps 4, rows 2 + 1 (+ 2 would be over 4)
    assert [j.future for j in engine.pending] == [futures[1], futures[3]]
    futures[1].cancel()  # a caller that gave up is dropped, the oldest left runs next
    assert [j.future for j in engine._take()] == [futures[3]]
    assert engine.queued == 0
    assert serve.batch_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]


def test_engine_waits_out_its_window_unless_the_rows_fill_a_batch(server):
    _, run = server
    engine = serve.Engine(run, serve.Limits(max_queue=8, max_batch=4, window_s=60.0))  # not started: no thread
    taken = concurrent.futures.ThreadPoolExecutor(1).submit(engine._take)
    first = engine.submit(_plan(2), False)  # opens the 60 s window
    time.sleep(0.3)
    assert not taken.done()  # 2 of 4 rows: the engine waits for more
    engine.submit(_plan(1, 8), False)  # another program's row does not fill this batch
    time.sleep(0.3)
    assert not taken.done()
    second = engine.submit(_plan(2), False)  # 4 rows of the program: the batch starts now, not in 60 s
    batch = taken.result(timeout=10)
    assert [j.future for j in batch] == [first, second]
    assert engine.rows == 1 and engine.queued == 1  # the other program's job waits for the next batch


def test_a_full_queue_and_a_timeout_answer_503(server):
    _, run = server
    app = serve.create_app(run, NAME, serve.Limits(max_queue=1, timeout_s=0.2))
    c = TestClient(app, base_url="http://localhost")  # without `with`: the lifespan never starts the engine
    r = c.post("/v1/completions", json={"prompt": "a", "steps": 2})
    assert r.status_code == 503 and r.json()["error"]["code"] == "timeout"
    r = c.post("/v1/completions", json={"prompt": "a", "steps": 2})  # a job given up on holds no place
    assert r.status_code == 503 and r.json()["error"]["code"] == "timeout"
    app.state.engine.submit(_plan(), False)  # a job still waiting fills the queue of one
    r = c.post("/v1/completions", json={"prompt": "a", "steps": 2})
    assert r.status_code == 503 and r.json()["error"]["code"] == "server_busy"


def _chromium():
    """A headless Chromium driven by selenium, or a skip naming what is missing (Debian: chromium chromium-driver)."""
    webdriver = pytest.importorskip("selenium.webdriver")
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (binary and driver):
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1000,700",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))


@pytest.fixture
def playground_server(server):
    """(base URL, steps, suffix) the playground test drives: the tiny run's server at 8 steps, or another run.

    SEDD_PLAYGROUND_RUN=DIR serves that run instead, at its own sampler and
    steps (SEDD_PLAYGROUND_STEPS to change them), without a suffix: the
    command that takes the README's picture of the default run,

      SEDD_PLAYGROUND_RUN=checkpoints/shakespeare_char SEDD_PLAYGROUND_SCREENSHOT=docs/figures/playground.png \\
        python -m pytest -q tests/test_serve.py -k playground
    """
    workdir = os.environ.get("SEDD_PLAYGROUND_RUN")
    if not workdir:
        yield server[0], 8, " END"
        return
    run = runs.load(workdir)
    steps = int(os.environ.get("SEDD_PLAYGROUND_STEPS", run.config.sampling.steps))
    app = serve.create_app(run, serve.model_name(workdir), serve.Limits(max_steps=max(steps, 1024)))
    with servers.serving(app, start_timeout=60) as port:
        yield f"http://127.0.0.1:{port}", steps, ""


def test_playground_resolves_text_in_headless_chromium(playground_server, tmp_path):
    base, steps, suffix = playground_server
    browser = _chromium()
    try:
        browser.get(base + "/")
        find = lambda id_: browser.find_element("id", id_)  # noqa: E731
        shown = lambda: browser.execute_script("return document.getElementById('out').textContent")  # noqa: E731
        deadline = time.monotonic() + 30
        while not browser.execute_script("return document.getElementById('sampler').options.length"):
            assert time.monotonic() < deadline, "the page did not list the samplers"
            time.sleep(0.05)
        for id_, value in (("prompt", "ROMEO:"), ("suffix", suffix), ("steps", str(steps)), ("seed", "2")):
            find(id_).clear()
            if value:
                find(id_).send_keys(value)
        find("go").click()
        seen, deadline = set(), time.monotonic() + 300
        while True:  # the page animates the frames; record what it shows on the way
            out = shown()
            if serve.MASK_CHAR in out:
                seen.add(out)
            # The slider is enabled when the stream has ended; the timer is cleared when the replay has.
            done = browser.execute_script("return !document.getElementById('replay').disabled && !timer")
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert find("error").text == ""
        frames = browser.execute_script("return frames")
        assert len(frames) == steps + 1
        final = frames[-1]["choices"][0]["text"]
        assert shown() == final and final.startswith("ROMEO:") and final.endswith(suffix)
        assert len(seen) >= 2  # intermediate frames with masks were on screen
        stats = find("stats").text  # the measured NFE: at most the steps + the denoise
        assert f"NFE {frames[-1]['nfe']}" in stats and 0 < frames[-1]["nfe"] <= steps + 1 and "tokens/s" in stats
        browser.execute_script(
            "const r = document.getElementById('replay'); r.value = 3;r.dispatchEvent(new Event('input'))"
        )  # the slider replays step 3
        assert shown() == frames[3]["choices"][0]["text"] and f"step 3 / {steps}" in find("stats").text
        # Two pictures: mid-denoising (the step where about half the completion is unmasked) and the end.
        masked = [len(f["choices"][0]["masked"]) for f in frames]
        mid = min(range(len(frames)), key=lambda k: abs(masked[k] - masked[0] / 2))
        shot = Path(os.environ.get("SEDD_PLAYGROUND_SCREENSHOT", str(tmp_path / "playground.png")))
        for k, path in ((mid, shot), (steps, shot.with_name(shot.stem + "_end" + shot.suffix))):
            browser.execute_script(
                f"const r = document.getElementById('replay'); r.value = {k};r.dispatchEvent(new Event('input'))"
            )
            browser.save_screenshot(str(path))
    finally:
        browser.quit()


def test_main_reports_a_directory_that_is_not_a_run(tmp_path, capsys):
    assert serve.main(["--workdir", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err
