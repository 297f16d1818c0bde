"""`bertforge embed` at scale: peak memory on a generated 1M-line corpus, resume after kill -9, torchrun split.

1. Generates ``--lines`` lines (default 1,000,000) of 3–15 random words (the model's whole-word vocabulary,
   Zipf-weighted, seed 0) into one .txt file.
2. One run: `bertforge embed --model M --input corpus.txt --out one --shard-size 100000`; peak RSS of that
   process (ru_maxrss of the child, MB = 2^20 bytes) and texts/s. Goal: < 1.5 GB.
3. Kill -9: the same command into another dir, killed with SIGKILL once ``--kill-after`` shard records exist;
   then rerun. Checks that the rerun computed none of the shards finished before the kill (its ``kept`` list,
   and those files' mtimes unchanged) and that every shard then equals the one-shot run's (sha256).
4. torchrun: `python -m torch.distributed.run --nproc_per_node 2 -m bertforge embed … --threads 1`; every
   shard's sha256 equals the one-process run's.

The model is the static student of benchmarks/bench_static.py (`distill --method static --teacher minilm
--dim 256`; made here when ``--model`` is not given) — a transformer teacher would take hours for 1M lines
on 2 cores.

Usage:
  PYTHONPATH=src python benchmarks/bench_embed.py --model /tmp/st/bs/minilm-static-256 --out benchmarks/results/embed.txt
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def gen_corpus(path: Path, n: int, vocab_file: Path, seed: int = 0) -> None:
    """``n`` lines of 3–15 words drawn (Zipf-like: word k with weight 1/k) from the model's whole-word
    vocabulary, deterministic in ``seed``."""
    rng = random.Random(seed)
    words = [w for w in json.loads(vocab_file.read_text(encoding="utf-8"))["model"]["vocab"]
             if w.isascii() and w.isalpha() and w.islower() and len(w) > 1]
    cum = list(__import__("itertools").accumulate(1.0 / (k + 1) for k in range(len(words))))
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            f.write(" ".join(rng.choices(words, cum_weights=cum, k=rng.randint(3, 15))) + "\n")


def env() -> dict:
    e = dict(os.environ)
    e.update(BERTFORGE_NO_PROGRESS="1", PYTHONPATH=str(REPO / "src") + os.pathsep + e.get("PYTHONPATH", ""))
    return e


def records(out: Path) -> dict:
    return {f.name: json.loads(f.read_text()) for f in sorted(out.glob("shard-*.json")) if ".ids" not in f.name}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="embedding model dir (default: distil the static student)")
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--shard-size", type=int, default=100_000)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kill-after", type=int, default=3, help="kill -9 once this many shards are done")
    ap.add_argument("--work", help="work dir (default: temporary)")
    ap.add_argument("--out", help="results file")
    args = ap.parse_args(argv)
    from bertforge.hardware import cpu_flags
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-embed-"))
    work.mkdir(parents=True, exist_ok=True)
    lines = [f"# python benchmarks/bench_embed.py {' '.join(argv if argv is not None else sys.argv[1:])}",
             f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average at start "
             f"{os.getloadavg()[0]:.1f} (2 cores shared with other jobs)",
             f"# cpu flags: {' '.join(f for f in cpu_flags() if f.startswith(('avx', 'amx', 'fma', 'sse4')))}"]

    def log(s=""):
        print(s, flush=True)
        lines.append(s)

    model = args.model
    if model is None:
        model = str(work / "minilm-static-256")
        if not Path(model).is_dir():
            subprocess.run([sys.executable, "-m", "bertforge", "distill", "--method", "static", "--teacher",
                            "minilm", "--dim", "256", "--out", model], check=True, env=env())
    corpus = work / "corpus-1m.txt"
    if not corpus.is_file() or sum(1 for _ in open(corpus, "rb")) != args.lines:
        gen_corpus(corpus, args.lines, Path(model) / "tokenizer.json")
    log(f"corpus: {args.lines} lines, {corpus.stat().st_size / 2**20:.0f} MB; model: {model} "
        f"({json.loads((Path(model) / 'config.json').read_text()).get('model_type')}, "
        f"{json.loads((Path(model) / 'config.json').read_text()).get('hidden_size')}-d)")
    base = [sys.executable, "-m", "bertforge", "embed", "--model", model, "--input", str(corpus),
            "--shard-size", str(args.shard_size), "--batch-size", str(args.batch_size)]

    # 1. one process: peak RSS and throughput
    one = work / "one"
    subprocess.run(["rm", "-rf", str(one), str(work / "killed"), str(work / "ranks")], check=True)
    t0 = time.perf_counter()
    p = subprocess.Popen(base + ["--out", str(one), "--threads", str(args.threads)], env=env(),
                         stdout=subprocess.PIPE, text=True)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    res = json.loads(p.stdout.read().strip().splitlines()[-1])
    rss_mb = ru.ru_maxrss / 1024
    log(f"1 process, {args.threads} threads: {res['records']} texts in {wall:.0f} s wall "
        f"({res['texts_per_s']} texts/s embedding), {res['shards']} shards, peak RSS {rss_mb:.0f} MB "
        f"(goal < 1536 MB): {'MET' if rss_mb < 1536 and os.waitstatus_to_exitcode(status) == 0 else 'NOT MET'}")
    ref = records(one)

    # 2. kill -9 after some shards, then rerun
    killed = work / "killed"
    p = subprocess.Popen(base + ["--out", str(killed), "--threads", str(args.threads)], env=env(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while p.poll() is None and len(records(killed) if killed.is_dir() else {}) < args.kill_after:
        time.sleep(0.2)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    done = records(killed)
    stamps = {n: (killed / n.replace(".json", ".npy")).stat().st_mtime_ns for n in done}
    partial = sorted(f.name for f in killed.glob(".shard-*"))
    log(f"kill -9 after {len(done)} finished shards ({', '.join(done)}); temporaries left: {partial or 'none'}")
    out = subprocess.run(base + ["--out", str(killed), "--threads", str(args.threads)], env=env(),
                         capture_output=True, text=True, check=True)
    rerun = json.loads(out.stdout.strip().splitlines()[-1])
    done_idx = sorted(int(n[6:11]) for n in done)
    redone = sorted(set(rerun["computed"]) & set(done_idx))
    unchanged = all((killed / n.replace(".json", ".npy")).stat().st_mtime_ns == t for n, t in stamps.items())
    same = records(killed) == ref
    log(f"rerun: kept {rerun['kept']}, computed {rerun['computed']}; finished shards recomputed: "
        f"{redone or 'none'}; their files untouched: {unchanged}; all shards equal the one-shot run's "
        f"(sha256): {same} -> {'MET' if not redone and unchanged and same else 'NOT MET'}")

    # 3. torchrun, 2 ranks
    ranks = work / "ranks"
    t0 = time.perf_counter()
    tr = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "bertforge",
          *base[3:], "--out", str(ranks), "--threads", "1"]
    out = subprocess.run(tr, env=env(), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        log(f"torchrun failed ({out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
    else:
        r0 = json.loads(out.stdout.strip().splitlines()[-1])
        ev = [json.loads(x) for x in (ranks / "events.jsonl").read_text().splitlines()]
        by_rank = {r: sorted(e["shard"] for e in ev if e["rank"] == r) for r in (0, 1)}
        same = records(ranks) == ref
        log(f"torchrun 2 ranks x 1 thread: {wall:.0f} s wall; rank 0 shards {by_rank[0]}, rank 1 shards "
            f"{by_rank[1]}; complete: {r0.get('complete')}; every shard equals the 1-process run's (sha256): "
            f"{same} -> {'MET' if same else 'NOT MET'}")
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
