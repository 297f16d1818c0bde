"""``bertforge serve``: an inference server for every dir bertforge reads or writes (cli layer).

* :mod:`~bertforge.server.models` — the served models (a :mod:`bertforge.runtime` runner each, and the task
  adapter that encodes and decodes a task model's texts), tokenization;
* :mod:`~bertforge.server.batching` — one queue, scheduler and inference thread per model (dynamic batching
  under a token budget);
* :mod:`~bertforge.server.schemas` — what a request may hold (checks, 422 / 413) and the answers' encoding;
* :mod:`~bertforge.server.routes` — the routes (text-embeddings-inference and OpenAI compatible, /ner, /qa);
* :mod:`~bertforge.server.app` — the ASGI app: state, plumbing, /health, /info, /metrics:
  :func:`~bertforge.server.app.build_app`;
* :mod:`~bertforge.server.metrics` — Prometheus metrics;
* :mod:`~bertforge.server.server` — binding, uvicorn, graceful shutdown: :func:`~bertforge.server.server.serve`
  (the command);
* :mod:`~bertforge.server.background` — the same server in a background thread, from Python.

From Python, ``bertforge.serve(models, host="127.0.0.1", port=0, ...)`` (:func:`~bertforge.server.background.serve`,
a function; this package is ``bertforge.server``) runs :func:`~bertforge.server.background.serve_in_background` — it
returns a :class:`~bertforge.server.background.
ServerHandle` (``.url``, ``.stop()``, a context manager) once the server listens::

    import bertforge
    with bertforge.serve({"sst2": "runs/sst2-int8"}) as srv:     # a free port
        ...                                                      # POST srv.url + "/predict"

In-process ASGI use (tests, benchmarks)::

    from bertforge.server.app import build_app
    app = build_app({"minilm": "minilm"}, max_batch_tokens=8192)   # an ASGI app; run it with uvicorn

Nothing below the CLI imports this package (import-linter contracts in pyproject.toml).
"""
from .background import ServerHandle, serve, serve_in_background

__all__ = ["ServerHandle", "serve", "serve_in_background"]
