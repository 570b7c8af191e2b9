"""A megafuse server on a free port of 127.0.0.1, in this process (uvicorn on a thread), for the
tests of this directory; always shut down."""
import contextlib
import socket
import threading
import time

from helpers import hang_timeout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port, seconds, alive, why):
    """Wait until GET /health on 127.0.0.1:port answers 200; fail, with why(), once `seconds`
    pass or alive() is False (the server's thread or process is gone)."""
    import httpx
    deadline = time.monotonic() + seconds
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or not alive():
            raise RuntimeError(f"the test server did not start: {why()}")
        time.sleep(0.05)


@contextlib.contextmanager
def running_server(model, **options):
    """Serve create_app(model, **options) on a free port; yields its base URL (".../v1")."""
    import uvicorn

    from megafuse.serve.app import create_app
    port = free_port()
    app = create_app(model, **options)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_healthy(port, hang_timeout(60), thread.is_alive, lambda: "in-process uvicorn")
        yield f"http://127.0.0.1:{port}/v1", app
    finally:
        server.should_exit = True
        thread.join(hang_timeout(30))
