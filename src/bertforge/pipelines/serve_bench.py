"""Served models timed from Python: :func:`serve_bench` (what ``bertforge serve-bench`` runs) — one ``bertforge
serve`` child process holding every model on loopback, a short, bounded burst of real requests per model.

The server binds 127.0.0.1 on a free port; once ``GET /health`` answers 200 each model gets ``requests``
requests on the route ``GET /info`` says it answers (:data:`BENCH_ROUTES`: ``POST /v1/embeddings``, OpenAI shape
``{"model": NAME, "input": [texts]}``, where it can embed; else ``POST /predict`` or ``POST /ner`` with
``{"model": NAME, "inputs": [texts]}``; each row of the result names its route) from ``concurrency``
closed-loop clients, ``texts_per_request`` real sentences each (the 200 Pang–Lee polarity sentences shipped with
gensim, or the lines of ``texts``), the models taking turns in ``rounds`` rounds
(:func:`bertforge.runtime.loadgen.interleaved_bursts`). Per model: texts/s (texts in 200 answers per wall
second of its bursts), latency p50/p95/p99 (ms), answers by status; then the server is stopped (SIGTERM).

    >>> import bertforge
    >>> r = bertforge.serve_bench({"teacher": "minilm", "int8": "runs/minilm-int8"}, requests=100)
    >>> [(m["name"], m["texts_per_s"], m["p50_ms"]) for m in r.models], r.failed
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from ..checkpoint.modeldir import resolve
from ..errors import BertforgeError, ConfigError, require_at_least
from .options import options_from, python_names

#: the options of ``bertforge serve`` a run passes on when the server offers them (the verb passes the ones its
#: build's ``serve`` has; a Python caller gets this package's)
SERVE_FLAGS = frozenset({"--threads", "--max-batch-requests"})


@dataclass
class ServeBenchOptions:
    """Options of :func:`serve_bench` — the flags of ``bertforge serve-bench`` with ``_`` for ``-``, same
    defaults. ``threads``: intra-op threads of the server (default its own choice); ``max_seconds``: wall-clock
    bound of each model's bursts; ``startup_timeout``: seconds to wait for ``GET /health`` → 200; ``out``: also
    write the result to this JSON file (an existing one only with ``overwrite``)."""

    requests: int = 200
    concurrency: int = 8
    texts_per_request: int = 1
    rounds: int = 2
    texts: Optional[str] = None
    threads: Optional[int] = None
    max_seconds: float = 120.0
    startup_timeout: float = 300.0
    out: Optional[str] = None
    overwrite: bool = False


@dataclass
class ServeBenchResult:
    """``record``: ``server`` (command, startup seconds, RSS after warm-up, exit status), ``texts``, ``route``,
    ``models`` (one row per model: ``texts_per_s``, ``p50_ms`` / ``p95_ms`` / ``p99_ms``, ``ok``, ``requests``,
    ``status`` …) and ``date``."""

    record: dict

    @property
    def models(self) -> list:
        return self.record["models"]

    @property
    def failed(self) -> list:
        """The names of the models some request to which got no 200 answer (or that got no request)."""
        return [r["name"] for r in self.models if r["ok"] != r["requests"] or r["requests"] == 0]


def serve_bench(models: Union[dict, list, str], **options) -> ServeBenchResult:
    """Serve ``models`` — ``{name: dir}``, or a list of ``"[NAME=]DIR"`` strings (the name defaults to the
    folder's) — and time each; ``options``: the fields of :class:`ServeBenchOptions`.

    Raises:
        ConfigError: an option out of range, a name given twice; BertforgeError: a model dir or ``texts`` file
            that does not exist, a refused ``out``, a server that does not start."""
    if isinstance(models, (str, Path)):
        models = [str(models)]
    specs = [f"{n}={p}" for n, p in models.items()] if isinstance(models, dict) else [str(m) for m in models]
    opts = options_from(ServeBenchOptions, "serve_bench", options)
    with python_names(ServeBenchOptions):
        return serve_bench_with(specs, opts)


def model_dirs(specs: list) -> dict:
    """``"[NAME=]DIR"`` strings → {name: dir}; the name defaults to the folder's (``minilm`` for the bundled
    model). BertforgeError for a dir that does not exist, ConfigError for a name given twice."""
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = "", spec
        d = resolve(path)
        if not d.exists():
            raise BertforgeError(f"--model {spec}: {path} does not exist; pass a checkpoint, export or quantize dir")
        name = name or (path if path.lower() in ("minilm",) else d.name)
        if name in out:
            raise ConfigError(f"--model {spec}: the name {name!r} is given twice; name them NAME=DIR")
        out[name] = d
    return out


def read_texts(path) -> tuple:
    """``(texts, what they are)``: the non-empty lines of ``path``, or the Pang–Lee sentences of gensim."""
    if path:
        p = Path(path)
        if not p.is_file():
            raise BertforgeError(f"--texts {path} is not a file; pass a text file with one text per line")
        texts = [ln.strip() for ln in p.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
        if not texts:
            raise BertforgeError(f"--texts {path} has no non-empty line")
        return texts, f"{len(texts)} lines of {p.name}"
    from ..data.bundled import polarity_sentences
    texts = polarity_sentences()[0]
    return texts, f"the {len(texts)} Pang–Lee polarity sentences (gensim)"


#: the route a model is timed on, by what it answers (GET /info's ``routes``), in this order of preference:
#: embeddings where the model can embed, else its own task's route (texts in, as ``inputs``)
BENCH_ROUTES = (("embed", "/v1/embeddings"), ("predict", "/predict"), ("ner", "/ner"))


def bench_routes(info: bytes) -> dict:
    """{model name: POST path it is timed on} from the body of ``GET /info``. Raises ConfigError for a model
    that answers none of :data:`BENCH_ROUTES` (a QA model needs question + context pairs, which serve-bench's
    single texts are not)."""
    out = {}
    for m in json.loads(info)["models"]:
        path = next((p for r, p in BENCH_ROUTES if r in m["routes"]), None)
        if path is None:
            raise ConfigError(f"--model {m['name']}: a {m['kind']} model answers {', '.join(m['routes'])}; "
                              "serve-bench times embedding, classification and NER models")
        out[m["name"]] = path
    return out


def check_options(args: ServeBenchOptions) -> None:
    """ConfigError naming the flag for a count below 1 or a bound that is not positive."""
    for flag, v in (("--requests", args.requests), ("--concurrency", args.concurrency),
                    ("--texts-per-request", args.texts_per_request), ("--rounds", args.rounds)):
        require_at_least(flag, v, 1)
    if args.threads is not None:
        require_at_least("--threads", args.threads, 1)
    if args.max_seconds <= 0 or args.startup_timeout <= 0:
        raise ConfigError("--max-seconds and --startup-timeout must be positive")


def serve_bench_with(models: list, args: ServeBenchOptions, serve_flags=SERVE_FLAGS) -> ServeBenchResult:
    """:func:`serve_bench` from ``"[NAME=]DIR"`` strings and a complete :class:`ServeBenchOptions` (what the verb
    builds from its flags); ``serve_flags``: the options ``bertforge serve`` accepts here."""
    from ..runtime import loadgen as lg
    check_options(args)
    dirs = model_dirs(models)
    if args.out:
        from .outputs import check_out_file
        check_out_file(Path(args.out), [d if d.is_dir() else d.parent for d in dirs.values()], (args.texts,),
                       args.overwrite)
    texts, about = read_texts(args.texts)
    host, port = "127.0.0.1", lg.free_port("127.0.0.1")
    env = {"BERTFORGE_NO_PROGRESS": "1"}
    extra = []
    if args.threads is not None:
        env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
        if "--threads" in serve_flags:
            extra = ["--threads", str(args.threads)]
    if "--max-batch-requests" in serve_flags:  # at least a whole request's texts in one batch
        extra += ["--max-batch-requests", str(max(32, args.texts_per_request))]
    argv = lg.bertforge_serve_argv({n: str(d) for n, d in dirs.items()}, host, port, extra)
    k = args.texts_per_request

    routes = {}

    def make(name):
        def f(i):
            s = (i * k) % len(texts)
            chunk = [texts[(s + j) % len(texts)] for j in range(k)]
            path = routes[name]
            body = {"model": name, "input": chunk} if path == "/v1/embeddings" else {"model": name, "inputs": chunk}
            return lg.json_request(path, body, texts=k)
        return f

    print(f"serve-bench: starting bertforge serve with {', '.join(dirs)} on {host}:{port}", file=sys.stderr,
          flush=True)
    with lg.ServerProcess(argv, host, port, env=env, startup_timeout=args.startup_timeout,
                          name="bertforge serve") as srv:
        startup = srv.startup_seconds
        routes.update(bench_routes(lg.http_get(host, port, "/info")[1]))
        for name in dirs:  # warm-up, untimed: a few requests per model
            lg.run_load(host, port, make(name), min(8, args.requests), min(2, args.concurrency), max_seconds=60)
        rss = srv.rss()
        per = lg.interleaved_bursts(host, port, {n: make(n) for n in dirs}, args.requests, args.concurrency,
                                    args.rounds, args.max_seconds)
        code = srv.stop()
    rows = []
    for name, d in dirs.items():
        s = lg.summarize(*per[name])
        rows.append({"name": name, "dir": str(d), "route": f"POST {routes[name]}", "concurrency": args.concurrency,
                     "texts_per_request": k,
                     **{key: (round(v, 3) if isinstance(v, float) else v) for key, v in s.items()}})
    result = {"server": {"command": "bertforge " + " ".join(argv[3:]), "startup_seconds": round(startup, 1),
                         "rss_mib_after_warmup": round(rss / 2**20, 1) if rss else None, "exit_status": code,
                         "cpus": os.cpu_count(), "threads": args.threads},
              "texts": about, "route": ", ".join(sorted({f"POST {r}" for r in routes.values()})), "models": rows,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if args.out:
        from ..io import atomic_write_text
        atomic_write_text(Path(args.out), json.dumps(result, indent=2))
    return ServeBenchResult(result)


__all__ = ["ServeBenchOptions", "ServeBenchResult", "serve_bench", "serve_bench_with", "SERVE_FLAGS"]
