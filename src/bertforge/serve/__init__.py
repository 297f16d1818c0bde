"""``bertforge serve``: an inference server for every dir bertforge reads or writes (cli layer).

* :mod:`~bertforge.serve.models` — the served models (a :mod:`bertforge.runtime` runner each, and the task
  adapter that encodes and decodes a task model's texts), tokenization;
* :mod:`~bertforge.serve.batching` — one queue, scheduler and inference thread per model (dynamic batching
  under a token budget);
* :mod:`~bertforge.serve.schemas` — what a request may hold (checks, 422 / 413) and the answers' encoding;
* :mod:`~bertforge.serve.routes` — the routes (text-embeddings-inference and OpenAI compatible, /ner, /qa);
* :mod:`~bertforge.serve.app` — the ASGI app: state, plumbing, /health, /info, /metrics:
  :func:`~bertforge.serve.app.build_app`;
* :mod:`~bertforge.serve.metrics` — Prometheus metrics;
* :mod:`~bertforge.serve.server` — binding, uvicorn, graceful shutdown: :func:`~bertforge.serve.server.serve`
  (the command);
* :mod:`~bertforge.serve.background` — the same server in a background thread, from Python.

This package is also a function: ``bertforge.serve(models, host="127.0.0.1", port=0, ...)`` is
:func:`~bertforge.serve.background.serve_in_background` — it returns a :class:`~bertforge.serve.background.
ServerHandle` (``.url``, ``.stop()``, a context manager) once the server listens::

    import bertforge
    with bertforge.serve({"sst2": "runs/sst2-int8"}) as srv:     # a free port
        ...                                                      # POST srv.url + "/predict"

In-process ASGI use (tests, benchmarks)::

    from bertforge.serve.app import build_app
    app = build_app({"minilm": "minilm"}, max_batch_tokens=8192)   # an ASGI app; run it with uvicorn

Nothing below the CLI imports this package (import-linter contracts in pyproject.toml).
"""
import sys
import types

from .background import ServerHandle, serve_in_background


class _ServePackage(types.ModuleType):
    """This package, callable: ``bertforge.serve(...)`` runs :func:`serve_in_background` (the package stays a
    package: ``bertforge.serve.app`` and the other modules are reached as ever)."""

    def __call__(self, models, host: str = "127.0.0.1", port: int = 0, **options) -> ServerHandle:
        return serve_in_background(models, host, port, **options)

    __call__.__doc__ = serve_in_background.__doc__


sys.modules[__name__].__class__ = _ServePackage

__all__ = ["ServerHandle", "serve_in_background"]
