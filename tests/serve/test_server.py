"""megafuse serve, driven by the official openai client over real sockets on 127.0.0.1:
SmolLM2 in float mode answers "Paris" streamed and not; JSON schemas give JSON that validates;
32 concurrent streaming clients and 200 requests each get what the request gets alone;
clients that disconnect mid-stream leave the server serving the rest; OpenAI-shaped errors
(400, 401, 404, 429); embeddings; SIGTERM ends a subprocess server cleanly."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from helpers import hang_timeout  # noqa: E402
from server_helpers import free_port, running_server, wait_healthy  # noqa: E402

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
MODEL = "SmolLM2-135M-Instruct.Q4_1"


@pytest.fixture(scope="module")
def server(float_model):
    with running_server(float_model, parallel=8, max_queue=256, ctx=512,
                        model_name=MODEL) as (url, app):
        yield url, app


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0], api_key="unused", max_retries=0,
                         timeout=hang_timeout(120))


def test_models_and_health(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    health = httpx.get(server[0].replace("/v1", "/health")).json()
    assert health["status"] == "ok" and health["sequences"] == 8


def test_paris_not_streamed(client):
    r = client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0)
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop" and r.usage.prompt_tokens == 37
    assert r.usage.completion_tokens > 0 and r.object == "chat.completion"


def test_paris_streamed(client):
    stream = client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and all(f is None for f in finishes[:-1])
    assert chunks[-1].usage.prompt_tokens == 37 and not chunks[-1].choices
    r = client.completions.create(model=MODEL, prompt="The capital of France is",
                                  max_tokens=3, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in r).startswith(" Paris")


SCHEMAS = [
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
     "required": ["city"], "additionalProperties": False},
    {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
     "required": ["answer"], "additionalProperties": False},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
     "required": ["n"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
     "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {
        "type": "string", "maxLength": 10}, "minItems": 1, "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
     "required": ["x", "y"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                      "count": {"type": "integer", "maximum": 9, "minimum": 1}},
     "required": ["color", "count"], "additionalProperties": False},
    {"type": "object", "properties": {"point": {
        "type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
        "required": ["lat", "lon"], "additionalProperties": False}},
     "required": ["point"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2,
     "maxItems": 4},
    {"type": "object", "properties": {"title": {"type": "string", "minLength": 1,
                                                "maxLength": 24}},
     "required": ["title"], "additionalProperties": False},
    {"type": "object", "properties": {"word": {"type": "string", "pattern": "^[a-z]{1,8}$"}},
     "required": ["word"], "additionalProperties": False},
    {"type": "object", "properties": {"date": {"type": "string",
                                               "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
     "required": ["date"], "additionalProperties": False},
    {"type": "object", "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}},
     "required": ["score"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"id": {"type": "integer", "minimum": 0,
                                                "maximum": 999}},
        "required": ["id"], "additionalProperties": False}}},
     "required": ["items"], "additionalProperties": False},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "maximum": 999,
                                                           "minimum": -999},
                                                          {"type": "null"}]}},
     "required": ["value"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "string", "maxLength": 8},
                                      "b": {"type": "string", "maxLength": 8},
                                      "c": {"type": "boolean"}},
     "required": ["a", "b", "c"], "additionalProperties": False},
    {"type": "object", "properties": {"planet": {"enum": ["Mercury", "Venus", "Earth", "Mars"]},
                                      "moons": {"type": "integer", "minimum": 0, "maximum": 99}},
     "required": ["planet", "moons"], "additionalProperties": False},
    {"type": "object", "properties": {"matrix": {"type": "array", "maxItems": 2, "minItems": 1,
                                                 "items": {"type": "array", "maxItems": 2,
                                                           "minItems": 1, "items": {
                                                               "type": "integer", "minimum": 0,
                                                               "maximum": 9}}}},
     "required": ["matrix"], "additionalProperties": False},
    {"type": "object", "properties": {"language": {"type": "string", "maxLength": 12},
                                      "typed": {"type": "boolean"},
                                      "year": {"type": "integer", "minimum": 1950,
                                               "maximum": 2030}},
     "required": ["language", "typed", "year"], "additionalProperties": False},
]


def test_json_schemas_give_json_that_validates(client):
    jsonschema = pytest.importorskip("jsonschema")
    assert len(SCHEMAS) == 20

    def ask(i_schema):
        i, schema = i_schema
        r = client.chat.completions.create(
            model=MODEL, temperature=0, max_tokens=120,
            messages=[{"role": "user", "content": "Answer in JSON."}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": f"s{i}", "schema": schema}})
        return r.choices[0].message.content, r.choices[0].finish_reason
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, enumerate(SCHEMAS)))
    for schema, (text, finish) in zip(SCHEMAS, answers):
        assert finish == "stop", (schema, text)
        jsonschema.validate(json.loads(text), schema)
    r = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=60, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Give a small JSON object."}])
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(model=MODEL, messages=FRANCE, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 7}}})


LOAD_PROMPTS = [f"Fact number {i}: the {w} is" for i, w in enumerate(
    ["sky", "sea", "sun", "moon", "river", "forest", "mountain", "desert", "city", "garden"])]
LOAD_PROMPTS += ["Write a list of fruits:" + " apple," * 70]        # two prefill chunks
LOAD_PROMPTS += ["def add(a, b):", "Once upon a time", "The recipe needs",
                 "In 1969, astronauts", "My favourite number is"]


def stream_text(client, prompt, max_tokens):
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens,
                                       temperature=0, stream=True)
    pieces, finish = [], None
    for chunk in stream:
        pieces.append(chunk.choices[0].text)
        finish = chunk.choices[0].finish_reason or finish
    return "".join(pieces), finish


def test_load_32_streaming_clients_200_requests_each_as_alone(server, client):
    requests = [(LOAD_PROMPTS[i % len(LOAD_PROMPTS)], 2 + (i % len(LOAD_PROMPTS)) % 5)
                for i in range(200)]
    alone = {r: stream_text(client, *r) for r in sorted(set(requests))}   # one at a time
    t0 = time.perf_counter()
    with ThreadPoolExecutor(32) as pool:
        got = list(pool.map(lambda r: stream_text(client, *r), requests))
    elapsed = time.perf_counter() - t0
    assert len(got) == 200
    mismatches = [(r, g, alone[r]) for r, g in zip(requests, got) if g != alone[r]]
    assert not mismatches, mismatches[:3]
    assert all(finish in ("length", "stop") for _, finish in got)
    print(f"200 streamed requests by 32 clients in {elapsed:.1f} s")


def test_clients_disconnecting_mid_stream_free_their_sequences(server, client):
    url, app = server
    engine = app.state.server.engine
    gone = []

    def leave():
        stream = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=400,
                                                messages=[{"role": "user", "content":
                                                           "Tell me a very long story."}],
                                                stream=True)
        for i, _ in enumerate(stream):
            if i == 3:
                break
        stream.close()
        gone.append(True)
    with ThreadPoolExecutor(16) as pool:
        leavers = [pool.submit(leave) for _ in range(10)]
        stayers = [pool.submit(stream_text, client, "The capital of France is", 4)
                   for _ in range(4)]
        for f in leavers:
            f.result(timeout=hang_timeout(120))
        results = [f.result(timeout=hang_timeout(120)) for f in stayers]
    assert len(gone) == 10
    assert all(text.startswith(" Paris") for text, _ in results)
    deadline = time.monotonic() + hang_timeout(10)
    while engine.load["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.load["running"] == 0 and engine.load["free"] == 8
    r = client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0)
    assert "Paris" in r.choices[0].message.content


def test_embeddings_endpoint(client):
    r = client.embeddings.create(model=MODEL, input=["The cat sat.", "A cat was sitting."])
    v = np.array([d.embedding for d in r.data])
    assert v.shape == (2, 576) and r.usage.prompt_tokens > 0
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-5)
    r2 = client.embeddings.create(model=MODEL, input="The cat sat.", encoding_format="float")
    np.testing.assert_allclose(r2.data[0].embedding, v[0], rtol=0, atol=1e-6)


def test_openai_shaped_errors(server, client):
    url = server[0]
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="no-such-model", messages=FRANCE)
    assert exc.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=-1)
    assert exc.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=MODEL, prompt="word " * 600, max_tokens=2)
    assert exc.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=MODEL, prompt="x", stop=[""])
    assert exc.value.body["param"] == "stop"
    for body in (b"{not json", b"[1, 2]", b'{"messages": "hi"}'):
        r = httpx.post(f"{url}/chat/completions", content=body,
                       headers={"content-type": "application/json"})
        assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param",
                                                                   "code"}


def test_api_key_and_queue_limit(float_model):
    with running_server(float_model, parallel=1, max_queue=0, ctx=256, api_key="sekret",
                        model_name=MODEL) as (url, app):
        bad = openai.OpenAI(base_url=url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        r = httpx.post(f"{url}/chat/completions", json={"messages": FRANCE})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        good = openai.OpenAI(base_url=url, api_key="sekret", max_retries=0)
        stream = good.chat.completions.create(model=MODEL, messages=[
            {"role": "user", "content": "Tell me a long story."}], max_tokens=200, stream=True)
        next(iter(stream))                     # the only sequence is busy, no queue
        with pytest.raises(openai.RateLimitError):
            good.chat.completions.create(model=MODEL, messages=FRANCE)
        stream.close()
        deadline = time.monotonic() + hang_timeout(10)
        while app.state.server.engine.load["running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "Paris" in good.chat.completions.create(
            model=MODEL, messages=FRANCE, temperature=0).choices[0].message.content


def test_sigterm_lets_the_request_in_flight_finish_and_exits(smollm2_path, tmp_path):
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "megafuse", "serve", "--model", smollm2_path,
                             "--port", str(port), "--parallel", "2", "--ctx", "256",
                             "--graceful-seconds", str(hang_timeout(30))],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        wait_healthy(port, hang_timeout(120), lambda: proc.poll() is None,
                     lambda: proc.stdout.read())
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                               max_retries=0)
        result = {}
        started = threading.Event()

        def stream():
            chunks = client.completions.create(model="SmolLM2-135M-Instruct.Q4_1",
                                               prompt="Once upon a time", max_tokens=40,
                                               temperature=0, stream=True)
            pieces = []
            for c in chunks:
                started.set()
                pieces.append(c.choices[0])
            result["finish"] = pieces[-1].finish_reason
            result["n"] = len(pieces)
        t = threading.Thread(target=stream)
        t.start()
        assert started.wait(hang_timeout(60))
        proc.send_signal(signal.SIGTERM)
        t.join(hang_timeout(60))
        assert result == {"finish": "length", "n": 40}
        assert proc.wait(hang_timeout(60)) == 0
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
