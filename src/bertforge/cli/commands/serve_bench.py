"""Serve models with `bertforge serve` on loopback and time a short, bounded burst of real requests per model.

Starts one `bertforge serve` child process holding every --model (127.0.0.1, a free port), waits until
`GET /health` answers 200, then sends each model --requests requests on its route — `POST /v1/embeddings`
(OpenAI shape: {"model": NAME, "input": [texts]}) where the model can embed, else a classifier's `POST /predict`
or a tagger's `POST /ner` ({"model": NAME, "inputs": [texts]}); the result names each model's route — from
--concurrency closed-loop clients, --texts-per-request real
sentences each (the 200 Pang–Lee polarity sentences shipped with gensim, or the lines of --texts FILE).
The models take turns in --rounds rounds, so load from other processes hits each alike. Reports per model:
texts/s (texts in 200 answers per wall second of its bursts), latency p50/p95/p99 (ms), answers by status;
then stops the server (SIGTERM). Prints one JSON object; --out also writes it to a file. Exit 1 when any
request got no 200 answer.

The load generator is bertforge.runtime.loadgen (asyncio, HTTP/1.1 keep-alive; loopback only; bounded by
--requests and --max-seconds). `bertforge demo` ends with this verb on its teacher and INT8 student.

Examples:
  bertforge serve-bench --model teacher=minilm --model int8=runs/minilm-int8 --out runs/served.json
  bertforge serve-bench --model runs/sst2 --requests 500 --concurrency 32 --texts dev.txt
"""
from __future__ import annotations

import sys

from ...errors import BertforgeError


def add_arguments(p) -> None:
    p.add_argument("--model", action="append", required=True, metavar="[NAME=]DIR",
                   help="model to serve (repeat for several; NAME defaults to the folder's name)")
    p.add_argument("--requests", type=int, default=200, help="requests per model (default 200)")
    p.add_argument("--concurrency", type=int, default=8, help="clients sending at once (default 8)")
    p.add_argument("--texts-per-request", type=int, default=1, help="texts in each request (default 1)")
    p.add_argument("--rounds", type=int, default=2, help="turns the models take (default 2)")
    p.add_argument("--texts", help="text file, one text per line (default: the Pang–Lee sentences of gensim)")
    p.add_argument("--threads", type=int, help="intra-op threads of the server (default: its own choice)")
    p.add_argument("--max-seconds", type=float, default=120.0, help="wall-clock bound of each model's bursts")
    p.add_argument("--startup-timeout", type=float, default=300.0, help="seconds to wait for GET /health → 200")
    p.add_argument("--out", help="also write the JSON result to this file")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")


def _serve_flags() -> set:
    """The option strings `bertforge serve` accepts (empty when the verb is not in this build)."""
    import argparse
    import importlib

    from .. import _verbs
    mod = _verbs().get("serve")
    if mod is None:
        return set()
    p = argparse.ArgumentParser()
    importlib.import_module(mod).add_arguments(p)
    return {s for a in p._actions for s in a.option_strings}


def run(args) -> int:
    from ...pipelines.serve_bench import ServeBenchOptions, check_options, serve_bench_with
    from ._common import print_json
    opts = ServeBenchOptions(**{f: getattr(args, f) for f in ServeBenchOptions.__dataclass_fields__})
    check_options(opts)
    flags = _serve_flags()
    if not flags:
        raise BertforgeError("`bertforge serve` is not in this build; serve-bench starts it")
    result = serve_bench_with(args.model, opts, flags)
    for r in result.models:
        print(f"serve-bench: {r['name']}: {r['texts_per_s']:.1f} texts/s, p50 {r['p50_ms'] or float('nan'):.2f} ms, "
              f"p95 {r['p95_ms'] or float('nan'):.2f} ms, {r['ok']}/{r['requests']} answered 200", file=sys.stderr)
    print_json(result.record)
    if result.failed:
        print(f"bertforge serve-bench: requests to {', '.join(result.failed)} got answers other than 200 "
              f"(see \"status\" in the result)", file=sys.stderr)
        return 1
    return 0
