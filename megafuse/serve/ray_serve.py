"""megafuse.serve.ray_serve: the server's app (megafuse.serve.app) as a Ray Serve deployment of
N replicas, each loading the model once and running its own engine.

    import ray
    from ray import serve
    from megafuse.serve.ray_serve import deployment

    ray.init()                                            # or ray.init(address="auto")
    serve.run(deployment(model_path="model.gguf", num_replicas=2, threads=1), route_prefix="/")
    # OpenAI clients: base_url="http://127.0.0.1:8000/v1"

or from the command line, with Ray's own CLI (an application builder):

    serve run megafuse.serve.ray_serve:app_builder model_path=/models/model.gguf num_replicas=4

The app is the same object ``megafuse serve`` runs under uvicorn: Ray Serve runs its lifespan in
each replica (the model is loaded there, not in the driver) and its routes behind Ray's HTTP
proxy, which spreads requests over the replicas.  Each replica asks Ray for ``threads`` CPUs
and runs the kernels on that many threads.  Needs ``pip install 'megafuse[ray]'``.
"""
from typing import Any, Dict, Optional

from megafuse.serve.app import create_app


def deployment(*, model_path: Optional[str] = None, num_replicas: int = 2, threads: int = 1,
               parallel: int = 4, max_queue: int = 64, ctx: Optional[int] = None,
               api_key: Optional[str] = None, activations: str = "int8",
               kv_dtype: str = "float32", model_name: Optional[str] = None) -> Any:
    """A bound Ray Serve application (for ``serve.run``): num_replicas replicas of the app, each
    with `threads` CPUs (Ray's num_cpus) and kernel threads, `parallel` sequences of `ctx`
    positions and the other options of ``megafuse.serve.app.create_app``.  model_path: a GGUF
    file every node can read (default: the default model, fetched once per node)."""
    from ray import serve
    from megafuse.llm.sampling import _integer
    num_replicas = _integer(num_replicas, "num_replicas", 1)
    threads = _integer(threads, "threads", 1)
    app = create_app(model_path=model_path, parallel=parallel, max_queue=max_queue, ctx=ctx,
                     api_key=api_key, threads=threads, activations=activations,
                     kv_dtype=kv_dtype, model_name=model_name)

    @serve.deployment(name="megafuse", num_replicas=num_replicas,
                      ray_actor_options={"num_cpus": threads})
    @serve.ingress(app)
    class MegafuseServer:
        """One replica: the app's lifespan loads the model and starts its engine."""

    return MegafuseServer.bind()


def app_builder(args: Dict[str, str]) -> Any:
    """``serve run megafuse.serve.ray_serve:app_builder key=value ...``: deployment()'s
    arguments as strings (num_replicas, threads, parallel, max_queue, ctx as integers)."""
    kwargs: Dict[str, Any] = dict(args)
    for key in ("num_replicas", "threads", "parallel", "max_queue", "ctx"):
        if key in kwargs:
            try:
                kwargs[key] = int(kwargs[key])
            except ValueError:
                raise ValueError(f"{key}: expected an integer, got {kwargs[key]!r}") from None
    return deployment(**kwargs)


__all__ = ["deployment", "app_builder"]
