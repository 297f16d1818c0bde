"""Serve models over HTTP: text-embeddings-inference / OpenAI compatible routes, /ner, /qa, dynamic batching.

Serves any dir bertforge reads or writes (PyTorch FP32 / INT8, the ONNX / INT8 dirs of `export` and
`quantize`, `transformers` dirs, `minilm`), several at once. Binds 127.0.0.1 unless --host says otherwise;
SIGTERM / Ctrl-C finish the requests in flight and exit 0. GET /openapi.json describes every route (GET /docs
renders it); docs/serve.md has the field-by-field table.

Example:
  bertforge serve --model minilm --model sst2=runs/sst2-int8 --port 8080
  curl -s localhost:8080/embed -H 'Content-Type: application/json' -d '{"inputs": ["a text"]}'
"""
from __future__ import annotations

import os

from ..names import BACKENDS


def add_arguments(p) -> None:
    p.add_argument("--model", action="append", required=True, metavar="[NAME=]DIR",
                   help="a model dir (or minilm); repeat for several models; NAME is what requests call it "
                        "(default: the folder's name)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="how models run (default: by what each dir holds)")
    p.add_argument("--threads", type=int, help="intra-op threads of the models (default: the library's)")
    p.add_argument("--max-batch-tokens", type=int, default=16384,
                   help="padded tokens (sequences × longest) per forward pass")
    p.add_argument("--max-batch-requests", type=int, default=32, help="sequences per forward pass")
    p.add_argument("--max-wait-ms", type=float, default=0.0,
                   help="how long a batch may wait to fill (default 0: a free model takes what is queued)")
    p.add_argument("--max-concurrent-requests", type=int, default=512,
                   help="requests in flight before new ones get 429")
    p.add_argument("--max-client-batch-size", type=int, default=32,
                   help="inputs per request before 413")
    p.add_argument("--payload-limit", type=int, default=2_000_000, help="largest request body in bytes (413)")
    p.add_argument("--auto-truncate", action="store_true",
                   help="truncate too-long inputs unless a request says \"truncate\": false (default: 422)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (default: $BERTFORGE_API_KEY)")
    p.add_argument("--grace", type=float, default=30.0,
                   help="seconds the requests in flight get to finish after SIGTERM / SIGINT")


#: libgomp's spin before an idle intra-op thread sleeps (iterations, ~100 000 per ms). Its default, 300 000
#: (~3 ms), keeps threads spinning after each forward pass on the cores the event loop and the clients need;
#: on a shared 2-core host it made one-text requests 6–10× slower than 100–1 000 spins (c=1 p50 350–620 ms
#: vs 34–89 ms, load ~20). Read when torch loads, so set before it does; an explicit GOMP_SPINCOUNT or
#: OMP_WAIT_POLICY in the environment wins.
GOMP_SPINCOUNT = "1000"
#: oneDNN keeps a compiled primitive per input shape (default: the last 1 024). A server sees a new (rows ×
#: tokens) shape with almost every batch, so that cache grows to ~30 MB of resident memory before it stops
#: (measured: MiniLM-sized entries, benchmarks/soak_serve.py); 64 keeps the hot shapes and bounds it to ~2 MB.
#: An explicit ONEDNN_PRIMITIVE_CACHE_CAPACITY in the environment wins.
ONEDNN_PRIMITIVE_CACHE_CAPACITY = "64"


def run(args) -> int:
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", GOMP_SPINCOUNT)
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", ONEDNN_PRIMITIVE_CACHE_CAPACITY)  # read lazily
    from ...errors import require_at_least
    from ...server.models import parse_model_args
    from ...server.server import serve
    require_at_least("--threads", args.threads, 1)
    models = dict(parse_model_args(args.model))
    key = args.api_key if args.api_key is not None else os.environ.get("BERTFORGE_API_KEY") or None
    return serve(models, host=args.host, port=args.port, grace=args.grace, backend=args.backend,
                 threads=args.threads, max_batch_tokens=args.max_batch_tokens,
                 max_batch_requests=args.max_batch_requests, max_wait_ms=args.max_wait_ms,
                 max_concurrent_requests=args.max_concurrent_requests,
                 max_client_batch_size=args.max_client_batch_size, payload_limit=args.payload_limit,
                 auto_truncate=args.auto_truncate, api_key=key)
