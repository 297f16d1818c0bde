"""``bertforge serve``: an inference server for every dir bertforge reads or writes (cli layer).

* :mod:`~bertforge.serve.models` — the served models (a :mod:`bertforge.runtime` runner each), tokenization;
* :mod:`~bertforge.serve.batching` — one queue, scheduler and inference thread per model (dynamic batching
  under a token budget);
* :mod:`~bertforge.serve.app` — the HTTP API (text-embeddings-inference and OpenAI compatible routes, /ner,
  /qa, /health, /info, /metrics): :func:`~bertforge.serve.app.build_app`;
* :mod:`~bertforge.serve.metrics` — Prometheus metrics;
* :mod:`~bertforge.serve.server` — binding, uvicorn, graceful shutdown: :func:`~bertforge.serve.server.serve`.

In-process use (tests, benchmarks)::

    from bertforge.serve.app import build_app
    app = build_app({"minilm": "minilm"}, max_batch_tokens=8192)   # an ASGI app; run it with uvicorn

Nothing below the CLI imports this package (import-linter contracts in pyproject.toml).
"""
