"""megafuse.serve: serving a model to many clients.

- ``engine.py``: ``Engine``, many requests on one model's sequences, one batched step at a time
  on a worker thread;
- ``app.py``: the OpenAI-compatible HTTP API (FastAPI), ``create_app``; ``megafuse serve`` runs
  it under uvicorn;
- ``ray_serve.py``: the same app as a Ray Serve deployment of N replicas.

Needs the ``serve`` extra: pip install 'megafuse[serve]' (fastapi, uvicorn, llguidance; ray[serve]
for Ray).  See docs/serving.md.
"""
