"""Serve models with `bertforge serve` on loopback and time a short, bounded burst of real requests per model.

Starts one `bertforge serve` child process holding every --model (127.0.0.1, a free port), waits until
`GET /health` answers 200, then sends each model --requests `POST /v1/embeddings` requests (OpenAI shape:
{"model": NAME, "input": [texts]}) from --concurrency closed-loop clients, --texts-per-request real
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

import json
import os
import sys
import time
from pathlib import Path

from ...errors import BertforgeError, ConfigError, require_at_least
from ...io import atomic_write_text


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


def _models(specs: list) -> dict:
    from ._common import resolve_model_dir
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = "", spec
        d = resolve_model_dir(path)
        if not d.exists():
            raise BertforgeError(f"--model {spec}: {path} does not exist; pass a checkpoint, export or quantize dir")
        name = name or (path if path.lower() in ("minilm",) else d.name)
        if name in out:
            raise ConfigError(f"--model {spec}: the name {name!r} is given twice; name them NAME=DIR")
        out[name] = d
    return out


def _texts(path) -> tuple:
    if path:
        p = Path(path)
        if not p.is_file():
            raise BertforgeError(f"--texts {path} is not a file; pass a text file with one text per line")
        texts = [ln.strip() for ln in p.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
        if not texts:
            raise BertforgeError(f"--texts {path} has no non-empty line")
        return texts, f"{len(texts)} lines of {p.name}"
    from ...data.bundled import polarity_sentences
    texts = polarity_sentences()[0]
    return texts, f"the {len(texts)} Pang–Lee polarity sentences (gensim)"


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
    from ...runtime import loadgen as lg
    from ._common import check_out_file, print_json
    for flag, v in (("--requests", args.requests), ("--concurrency", args.concurrency),
                    ("--texts-per-request", args.texts_per_request), ("--rounds", args.rounds)):
        require_at_least(flag, v, 1)
    if args.threads is not None:
        require_at_least("--threads", args.threads, 1)
    if args.max_seconds <= 0 or args.startup_timeout <= 0:
        raise ConfigError("--max-seconds and --startup-timeout must be positive")
    flags = _serve_flags()
    if not flags:
        raise BertforgeError("`bertforge serve` is not in this build; serve-bench starts it")
    models = _models(args.model)
    if args.out:
        check_out_file(Path(args.out), [d if d.is_dir() else d.parent for d in models.values()], (args.texts,),
                       args.overwrite)
    texts, about = _texts(args.texts)
    host, port = "127.0.0.1", lg.free_port("127.0.0.1")
    env = {"BERTFORGE_NO_PROGRESS": "1"}
    extra = []
    if args.threads is not None:
        env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
        if "--threads" in flags:
            extra = ["--threads", str(args.threads)]
    if "--max-batch-requests" in flags:  # at least a whole request's texts in one batch
        extra += ["--max-batch-requests", str(max(32, args.texts_per_request))]
    argv = lg.bertforge_serve_argv({n: str(d) for n, d in models.items()}, host, port, extra)
    k = args.texts_per_request

    def make(name):
        def f(i):
            s = (i * k) % len(texts)
            chunk = [texts[(s + j) % len(texts)] for j in range(k)]
            return lg.json_request("/v1/embeddings", {"model": name, "input": chunk}, texts=k)
        return f

    per = {n: [] for n in models}
    walls = {n: 0.0 for n in models}
    print(f"serve-bench: starting bertforge serve with {', '.join(models)} on {host}:{port}", file=sys.stderr,
          flush=True)
    with lg.ServerProcess(argv, host, port, env=env, startup_timeout=args.startup_timeout,
                          name="bertforge serve") as srv:
        startup = srv.startup_seconds
        for name in models:  # warm-up, untimed: a few requests per model
            lg.run_load(host, port, make(name), min(8, args.requests), min(2, args.concurrency), max_seconds=60)
        rss = srv.rss()
        budget = {n: args.requests for n in models}
        t_end = {n: args.max_seconds for n in models}
        for r in range(args.rounds):
            order = list(models) if r % 2 == 0 else list(reversed(models))
            for name in order:
                n = budget[name] if r == args.rounds - 1 else args.requests // args.rounds
                if n < 1 or t_end[name] <= 0:
                    continue
                samples, wall = lg.run_load(host, port, make(name), n, args.concurrency, max_seconds=t_end[name])
                per[name] += samples
                walls[name] += wall
                budget[name] -= len(samples)
                t_end[name] -= wall
        code = srv.stop()
    rows = []
    for name, d in models.items():
        s = lg.summarize(per[name], walls[name])
        rows.append({"name": name, "dir": str(d), "concurrency": args.concurrency, "texts_per_request": k,
                     **{key: (round(v, 3) if isinstance(v, float) else v) for key, v in s.items()}})
    result = {"server": {"command": "bertforge " + " ".join(argv[3:]), "startup_seconds": round(startup, 1),
                         "rss_mib_after_warmup": round(rss / 2**20, 1) if rss else None, "exit_status": code,
                         "cpus": os.cpu_count(), "threads": args.threads},
              "texts": about, "route": "POST /v1/embeddings", "models": rows,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for r in rows:
        print(f"serve-bench: {r['name']}: {r['texts_per_s']:.1f} texts/s, p50 {r['p50_ms'] or float('nan'):.2f} ms, "
              f"p95 {r['p95_ms'] or float('nan'):.2f} ms, {r['ok']}/{r['requests']} answered 200", file=sys.stderr)
    print_json(result)
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(result, indent=2))
    bad = [r["name"] for r in rows if r["ok"] != r["requests"] or r["requests"] == 0]
    if bad:
        print(f"bertforge serve-bench: requests to {', '.join(bad)} got answers other than 200 "
              f"(see \"status\" in the result)", file=sys.stderr)
        return 1
    return 0
