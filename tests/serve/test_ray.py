"""The server's app as a Ray Serve deployment: a local Ray instance, 2 replicas of 1 thread each,
requests through the official openai client (both replicas answer; greedy answers equal the
in-process engine's)."""
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")
ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from helpers import hang_timeout  # noqa: E402
from server_helpers import free_port  # noqa: E402
from megafuse.llm import completion as C  # noqa: E402

MODEL = "SmolLM2-135M-Instruct.Q4_1"


def test_two_replicas_answer_through_the_openai_client(smollm2_path, float_model, monkeypatch):
    from megafuse.serve.ray_serve import deployment
    port = free_port()
    # Serve's controller kills an HTTP proxy actor that is not ready within 5 s (then 10, ...),
    # and serve.start() fails with ActorDiedError: on a loaded machine (CI beside other jobs)
    # the proxy's imports alone take longer.  The controller reads the bound from its environment,
    # which the Ray processes ray.init() starts inherit.
    monkeypatch.setenv("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", str(hang_timeout(60)))
    monkeypatch.setenv("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", str(hang_timeout(60)))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(deployment(model_path=smollm2_path, num_replicas=2, threads=1, parallel=2,
                             activations="float", ctx=256), route_prefix="/", name="megafuse")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                               max_retries=0, timeout=hang_timeout(120))
        assert [m.id for m in client.models.list().data] == [MODEL]

        def ask(i):
            return client.chat.completions.create(
                model=MODEL, temperature=0, max_tokens=12,
                messages=[{"role": "user", "content": "What is the capital of France?"}])
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(ask, range(8)))
        want = C.create_chat_completion(
            float_model.new_sequence(256),
            [{"role": "user", "content": "What is the capital of France?"}], temperature=0,
            max_tokens=12)["choices"][0]["message"]["content"]
        assert "Paris" in want
        assert {a.choices[0].message.content for a in answers} == {want}
        stream = client.completions.create(model=MODEL, prompt="The capital of France is",
                                           max_tokens=3, temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in stream).startswith(" Paris")
        # both replicas are up and serving
        status = serve.status().applications["megafuse"].deployments["megafuse"]
        assert status.replica_states.get("RUNNING") == 2
        seen = set()
        deadline = time.monotonic() + hang_timeout(60)
        while len(seen) < 2 and time.monotonic() < deadline:
            seen.add(httpx.get(f"http://127.0.0.1:{port}/health",
                                timeout=hang_timeout(30)).json()["replica"])
        assert len(seen) == 2, seen
    finally:
        serve.shutdown()
        ray.shutdown()
