"""megafuse.serve.app: the OpenAI-compatible HTTP API (FastAPI; ``megafuse serve`` runs it under
uvicorn, ``megafuse.serve.ray_serve`` as a Ray Serve deployment).

    GET  /health                  {"status": "ok", the replica (host:pid), running / waiting /
                                  free sequences}
    GET  /v1/models               the served model ({"object": "list", "data": [...]})
    GET  /v1/models/{id}          it, or 404
    POST /v1/completions          OpenAI's legacy completions (stream: server-sent events)
    POST /v1/chat/completions     OpenAI's chat completions (stream: server-sent events)
    POST /v1/embeddings           mean-pooled, L2-normalised final hidden states

Requests take OpenAI's fields, and llama.cpp's server's ``top_k``, ``min_p``,
``repeat_penalty`` beside them; ``response_format`` json_object / json_schema is enforced by
llguidance.  Defaults are OpenAI's (temperature 1, top_p 1, no top-k / min-p; completions
max_tokens 16, chat until the end of the answer or the context).

Errors have OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: 400 for a
malformed body, a bad argument (``param`` names it) or a prompt longer than the context
(``context_length_exceeded``), 401 for a missing or wrong bearer key when ``api_key`` is set,
404 for an unknown model, 429 when more requests wait than the engine's max_queue, 503 while
shutting down.

The model runs on the engine's worker thread, never on the event loop; prompts are tokenized
and grammars compiled in the thread pool.  A client that disconnects frees its sequence at the
engine's next step.
"""
import asyncio
import base64
import contextlib
import json
import os
import re
import socket
import time
from typing import Any, AsyncIterator, Dict, List, Optional

from megafuse.llm import completion as C
from megafuse.serve.engine import Engine, EngineClosed, Event, QueueFull

#: OpenAI's defaults where they differ from llama-cpp-python's Python API.
OPENAI_DEFAULTS = dict(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, repeat_penalty=1.0)

#: How often a non-streaming request checks whether its client is still there (seconds).
DISCONNECT_POLL_SECONDS = 0.5


class APIError(Exception):
    """An OpenAI-shaped error response."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (status, message, type,
                                                                         param, code)

    def body(self) -> Dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def _bad_argument(exc: Exception) -> APIError:
    """A ValueError / TypeError of the text API as a 400 naming the argument it names."""
    text = str(exc)
    match = re.match(r"([A-Za-z_][\w.\[\]]*):", text)
    param = match.group(1).split("[")[0].split(".")[0] if match else None
    code = "context_length_exceeded" if "leave no room" in text else None
    return APIError(400, text, param=param, code=code)


class Server:
    """What the app's routes share: the model, its engine, the served name and the key."""

    def __init__(self, model: Any, engine: Engine, name: str, api_key: Optional[str]) -> None:
        self.model, self.engine, self.name, self.api_key = model, engine, name, api_key
        self.created = int(time.time())
        self.replica = f"{socket.gethostname()}:{os.getpid()}"     # (which process answered)


def create_app(model: Any = None, *, model_path: Optional[str] = None, parallel: int = 4,
               max_queue: int = 64, ctx: Optional[int] = None, api_key: Optional[str] = None,
               threads: Optional[int] = None, activations: str = "int8",
               kv_dtype: str = "float32", model_name: Optional[str] = None) -> Any:
    """The FastAPI app.  The model -- `model` (a ``megafuse.Model``), else loaded from
    model_path (default: the default model, fetched once) with ``activations`` / ``kv_dtype``
    -- and its engine (`parallel` sequences of `ctx` positions each, default min(the model's
    context, 2048); `max_queue` waiting requests) are made when the app starts (its lifespan:
    under uvicorn, or in each Ray Serve replica) and closed when it stops.  threads: the
    kernels' thread count (default: megafuse's).  model_name: the id clients name (default:
    the file's name without .gguf)."""
    try:
        from fastapi import FastAPI, Request
        from fastapi.exceptions import RequestValidationError
        from fastapi.responses import JSONResponse, StreamingResponse
        from starlette.concurrency import run_in_threadpool
    except ImportError as exc:
        raise ImportError("megafuse serve needs fastapi and uvicorn: pip install "
                          "'megafuse[serve]'") from exc

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        import megafuse
        if threads:
            megafuse.set_num_threads(threads)
        m, name = model, model_name
        if m is None:
            from megafuse.llm import fetch
            from megafuse.llm.model import Model
            path = model_path or fetch.default_model_path()
            m = await run_in_threadpool(
                lambda: Model.from_gguf(path, cache_capacity=ctx, activations=activations,
                                        kv_dtype=kv_dtype))
            name = name or _file_id(path)
        capacity = ctx or min(m.cache_capacity, 2048)
        engine = await run_in_threadpool(
            lambda: Engine(m, parallel=parallel, max_queue=max_queue, cache_capacity=capacity))
        app.state.server = Server(m, engine, name or _file_id(model_path or "") or
                                  m.config.name or "megafuse", api_key)
        try:
            yield
        finally:
            await run_in_threadpool(engine.close, True)

    app = FastAPI(title="megafuse", lifespan=lifespan)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> Any:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: Exception) -> Any:
        return JSONResponse(APIError(400, f"malformed request: {exc}").body(), status_code=400)

    def server_of(request: Request) -> Server:
        server: Server = request.app.state.server
        if server.api_key is not None:
            header = request.headers.get("authorization", "")
            if header != f"Bearer {server.api_key}":
                raise APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer "
                               "<key>'", code="invalid_api_key")
        return server

    async def body_of(request: Request, server: Server) -> Dict[str, Any]:
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            raise APIError(400, f"malformed request: the body is not JSON ({exc})") from None
        if not isinstance(body, dict):
            raise APIError(400, "malformed request: the body must be a JSON object")
        name = body.get("model")
        if name is not None and name != server.name:
            raise APIError(404, f"The model '{name}' does not exist (this server serves "
                           f"'{server.name}')", param="model", code="model_not_found")
        return body

    @app.get("/health")
    async def health(request: Request) -> Any:
        server: Server = request.app.state.server
        return {"status": "ok", "model": server.name, "replica": server.replica,
                **server.engine.load}

    @app.get("/v1/models")
    async def models(request: Request) -> Any:
        server = server_of(request)
        return {"object": "list", "data": [_model_card(server)]}

    @app.get("/v1/models/{model_id:path}")
    async def model_card(model_id: str, request: Request) -> Any:
        server = server_of(request)
        if model_id != server.name:
            raise APIError(404, f"The model '{model_id}' does not exist", param="model",
                           code="model_not_found")
        return _model_card(server)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        server = server_of(request)
        body = await body_of(request, server)
        ids, s = await run_in_threadpool(_completion_request, server, body)
        return await _generate(request, server, ids, s, body, "text")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        server = server_of(request)
        body = await body_of(request, server)
        ids, s = await run_in_threadpool(_chat_request, server, body)
        return await _generate(request, server, ids, s, body, "chat")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Any:
        server = server_of(request)
        body = await body_of(request, server)
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise APIError(400, f"encoding_format: expected 'float' or 'base64', got {fmt!r}",
                           param="encoding_format")
        inputs = await run_in_threadpool(_embedding_inputs, server, body.get("input"))
        events = await _run_job(request, lambda cb: server.engine.submit_embeddings(inputs, cb))
        vectors = {e.index: e.vector for e in events if e.kind == "embedding"}
        data = []
        for i in range(len(inputs)):
            v = vectors[i]
            value: Any = (base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
                          if fmt == "base64" else v.tolist())
            data.append({"object": "embedding", "embedding": value, "index": i})
        tokens = sum(len(ids) for ids in inputs)
        return {"object": "list", "data": data, "model": server.name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    async def _generate(request: Request, server: Server, ids: List[int], s: C.Settings,
                        body: Dict[str, Any], kind: str) -> Any:
        rid, created = C.new_id(kind), int(time.time())
        if body.get("stream"):
            queue: asyncio.Queue[Event] = asyncio.Queue()
            job = _submit(server, ids, s, _forwarder(queue))
            options = body.get("stream_options") or {}
            usage = isinstance(options, dict) and bool(options.get("include_usage"))
            return StreamingResponse(
                _sse(_stream_events(queue, job, server, rid, created, kind, len(ids), usage)),
                media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        events = await _run_job(request, lambda cb: _submit(server, ids, s, cb))
        errors = [e.error for e in events if e.kind == "error"]
        if errors:
            raise APIError(500, f"generation failed: {errors[0]}", type="server_error")
        gens = sorted({id(e.generation): e.generation for e in events
                       if e.kind == "delta"}.values(), key=lambda g: g.index)
        build = C.chat_response if kind == "chat" else C.completion_response
        return build(rid, created, server.name, gens, len(ids))

    return app


# ---- requests ---------------------------------------------------------------------------------

def _file_id(path: str) -> str:
    base = os.path.basename(str(path))
    return base[:-5] if base.endswith(".gguf") else base


def _model_card(server: Server) -> Dict[str, Any]:
    return {"id": server.name, "object": "model", "created": server.created,
            "owned_by": "megafuse"}


_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty",
                    "presence_penalty", "frequency_penalty", "seed", "stop", "logit_bias", "n",
                    "response_format")


def _settings(server: Server, body: Dict[str, Any], **extra: Any) -> C.Settings:
    kwargs: Dict[str, Any] = dict(OPENAI_DEFAULTS)
    for key in _SAMPLING_FIELDS:
        if body.get(key) is not None:
            kwargs[key] = body[key]
    kwargs.update(extra)
    try:
        return C.settings(server.model, **kwargs)
    except (ValueError, TypeError) as exc:
        raise _bad_argument(exc) from None


def _unsupported(body: Dict[str, Any], names: List[str]) -> None:
    for name in names:
        if body.get(name):
            raise APIError(400, f"{name}: not supported by this server", param=name)


def _completion_request(server: Server, body: Dict[str, Any]) -> Any:
    _unsupported(body, ["echo", "suffix"])
    logprobs = body.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)):
        raise APIError(400, f"logprobs: expected an integer, got {logprobs!r}",
                       param="logprobs")
    s = _settings(server, body, max_tokens=body.get("max_tokens", 16), logprobs=logprobs)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]                              # one prompt in a list
    try:
        ids = C.prompt_ids(server.model, prompt, server.engine.cache_capacity)
    except (ValueError, TypeError) as exc:
        raise _bad_argument(exc) from None
    return ids, s


def _chat_request(server: Server, body: Dict[str, Any]) -> Any:
    _unsupported(body, ["tools", "functions", "tool_choice", "function_call"])
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise APIError(400, f"logprobs: expected a boolean, got {logprobs!r}", param="logprobs")
    top = body.get("top_logprobs")
    if top is not None and not logprobs:
        raise APIError(400, "top_logprobs: needs logprobs: true", param="top_logprobs")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    s = _settings(server, body, max_tokens=max_tokens,
                  logprobs=(top or 0) if logprobs else None)
    try:
        ids = C.chat_prompt_ids(server.model, body.get("messages"),
                                server.engine.cache_capacity)
    except (ValueError, TypeError) as exc:
        raise _bad_argument(exc) from None
    return ids, s


def _embedding_inputs(server: Server, value: Any) -> List[List[int]]:
    try:
        inputs = C.embedding_inputs(value)
        return [C.embedding_ids(server.model, text, server.engine.cache_capacity)
                for text in inputs]
    except (ValueError, TypeError) as exc:
        raise _bad_argument(exc) from None


def _submit(server: Server, ids: List[int], s: C.Settings, callback: Any) -> Any:
    try:
        return server.engine.submit_generation(ids, s, callback)
    except QueueFull as exc:
        raise APIError(429, str(exc), type="requests", code="rate_limit_exceeded") from None
    except EngineClosed as exc:
        raise APIError(503, str(exc), type="server_error") from None
    except (ValueError, TypeError) as exc:   # (the grammar's matcher, made per choice)
        raise _bad_argument(exc) from None


def _forwarder(queue: "asyncio.Queue[Event]") -> Any:
    """An engine callback (worker thread) that puts each event on the event loop's queue."""
    loop = asyncio.get_running_loop()

    def forward(event: Event) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, event)
    return forward


async def _run_job(request: Any, submit: Any) -> List[Event]:
    """Submit a job and collect its events until it is done; cancel it if the client goes."""
    queue: asyncio.Queue[Event] = asyncio.Queue()
    try:
        job = submit(_forwarder(queue))
    except QueueFull as exc:
        raise APIError(429, str(exc), type="requests", code="rate_limit_exceeded") from None
    except EngineClosed as exc:
        raise APIError(503, str(exc), type="server_error") from None
    events: List[Event] = []
    try:
        while True:
            try:
                event = await asyncio.wait_for(queue.get(), DISCONNECT_POLL_SECONDS)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    job.cancel()
                    raise APIError(499, "client disconnected") from None
                continue
            if event.kind == "done":
                return events
            events.append(event)
    finally:
        job.cancel()                                   # (a no-op once it is done)


async def _stream_events(queue: "asyncio.Queue[Event]", job: Any, server: Server, rid: str,
                         created: int, kind: str, prompt_tokens: int,
                         usage: bool) -> AsyncIterator[Dict[str, Any]]:
    """The chunk dicts of a streamed request.  The client going away cancels this generator
    (Starlette's StreamingResponse): the finally cancels the job, which frees its sequence."""
    started: set = set()
    completion_tokens: Dict[int, int] = {}
    try:
        while True:
            event = await queue.get()
            if event.kind == "done":
                break
            if event.kind == "error":
                yield APIError(500, f"generation failed: {event.error}",
                               type="server_error").body()
                continue
            gen, delta = event.generation, event.delta
            completion_tokens[gen.index] = len(gen.completion_ids)
            if kind == "chat":
                for chunk in C.chat_stream_chunks(rid, created, server.name, gen, delta,
                                                  gen.index not in started):
                    yield chunk
                started.add(gen.index)
            else:
                yield C.completion_chunk(rid, created, server.name, gen, delta)
        if usage:
            done = sum(completion_tokens.values())
            yield {"id": rid, "object": "chat.completion.chunk" if kind == "chat" else
                   "text_completion", "created": created, "model": server.name, "choices": [],
                   "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": done,
                             "total_tokens": prompt_tokens + done}}
    finally:
        job.cancel()


async def _sse(chunks: AsyncIterator[Dict[str, Any]]) -> AsyncIterator[bytes]:
    """Server-sent events: one ``data: <json>`` a chunk, then ``data: [DONE]``."""
    try:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode()
        yield b"data: [DONE]\n\n"
    finally:
        await chunks.aclose()   # type: ignore[attr-defined]


def run(app: Any, host: str = "127.0.0.1", port: int = 8000,
        graceful_seconds: float = 30.0, log_level: str = "info") -> None:
    """Serve app under uvicorn until SIGINT / SIGTERM: then it stops taking connections, lets
    the requests in flight finish (at most graceful_seconds, then they are cancelled), closes
    the engine and returns."""
    import signal
    import threading

    import uvicorn
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=graceful_seconds)
    if threading.current_thread() is threading.main_thread():
        # uvicorn handles the signals while it serves, then restores these handlers and raises
        # the signal it caught again: with them, a clean shutdown returns (exit status 0)
        # instead of the process dying of its SIGTERM after the shutdown.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
    uvicorn.Server(config).run()


__all__ = ["create_app", "run", "APIError", "OPENAI_DEFAULTS"]
