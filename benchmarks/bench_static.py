"""Static embeddings on SQuAD-dev retrieval: the teacher, bertforge's static student and model2vec's `distill`.

On the retrieval set `bertforge beir-from-squad` builds from ../shared/data/squad/dev-v1.1.json (article-
disjoint split, seed 0; the `test` qrels = questions of the eval articles, ranked against all 2,067
paragraphs), measured in one run with the same threads for every model:

* NDCG@10 (and MRR@10, Recall@1/10/100) by `retrieval-eval`'s own `evaluate_retrieval` (exact cosine search);
* encoding throughput, texts/s = (documents + queries) / seconds to embed them (cut at 256 tokens), on the
  first ``--speed-docs`` paragraphs and ``--speed-queries`` questions of the eval set (the same texts for
  every model), in ``--rounds`` interleaved rounds (median and min–max reported; the host is shared);
* the static student: `bertforge distill --method static --teacher minilm --dim 256` (defaults: SIF a = 1e-4,
  8 top components removed); model2vec 0.10: `model2vec.distill.distill(<MiniLM dir>, pca_dims=256)` (its
  defaults). model2vec's distill needs `skeletoken`: `pip install -c constraints.txt -e ".[peers]"` installs
  both (the run recorded in results/static.txt had it on PYTHONPATH from a `.peers/` folder instead).

Goals (issue 25): the static student keeps ≥ 80% of the teacher's NDCG@10 at ≥ 50× its texts/s, and is above
model2vec's distill at the same dimension.

Usage:
  python benchmarks/bench_static.py --threads 2 --rounds 3 --work /tmp/bench-static \
      --out benchmarks/results/static.txt
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SQUAD = REPO.parent / "shared" / "data" / "squad" / "dev-v1.1.json"


class Model2VecEmbedder:
    """model2vec's StaticModel behind the ``embed(texts, max_seq_len, batch_size)`` of bertforge's Embedder."""

    def __init__(self, model, name="model2vec"):
        self.model, self.name = model, name

    def embed(self, texts, max_seq_len=256, batch_size=1024):
        import numpy as np
        return np.asarray(self.model.encode(list(texts), max_length=max_seq_len, batch_size=batch_size,
                                            use_multiprocessing=False), dtype=np.float32)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--teacher-batch", type=int, default=32, help="teacher texts per forward (retrieval-eval's)")
    ap.add_argument("--static-batch", type=int, default=1024, help="static models' texts per call (model2vec's)")
    ap.add_argument("--speed-docs", type=int, default=400, help="paragraphs timed per round")
    ap.add_argument("--speed-queries", type=int, default=400, help="questions timed per round")
    ap.add_argument("--work", help="work dir (default: a temporary dir); the models, model2vec's distilled dir "
                                   "and each model's quality figures are kept there and reused by a re-run")
    ap.add_argument("--out", help="results file")
    args = ap.parse_args(argv)
    os.environ.setdefault("BERTFORGE_NO_PROGRESS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import numpy as np
    import torch
    torch.set_num_threads(args.threads)
    from bertforge.cli import main as bertforge
    from bertforge.runtime.embedder import evaluate_retrieval
    from bertforge.data.beir import read_beir, squad_to_beir
    from bertforge.runtime.embedder import load_embedder
    from bertforge.hardware import cpu_flags
    from bertforge.checkpoint import resolve_model_dir

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-static-"))
    work.mkdir(parents=True, exist_ok=True)
    lines = [f"# python benchmarks/bench_static.py {' '.join(argv if argv is not None else sys.argv[1:])}",
             f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; torch {torch.__version__}; threads "
             f"{args.threads}; load average at start {os.getloadavg()[0]:.1f} (host shared with other jobs)",
             f"# cpu flags: {' '.join(f for f in cpu_flags() if f.startswith(('avx', 'amx', 'fma', 'sse4')))}"]

    def log(s=""):
        print(s, flush=True)
        lines.append(s)
        if args.out:  # written as it goes: a run cut short still leaves what it measured
            Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")

    beir = work / "squad-beir"
    if not (beir / "corpus.jsonl").is_file():
        squad_to_beir(SQUAD, beir)
    data = read_beir(beir, "test")
    texts_d = list(data.corpus.values())[:args.speed_docs]
    texts_q = list(data.queries.values())[:args.speed_queries]
    log(f"retrieval set: {SQUAD.name} eval articles: {len(data.queries)} questions against {len(data.corpus)} "
        f"paragraphs (split seed 0, eval fraction 0.2)")

    teacher_dir = resolve_model_dir("minilm")
    static_dir = work / f"minilm-static-{args.dim}"
    t0 = time.perf_counter()
    if not static_dir.is_dir():
        assert bertforge(["distill", "--method", "static", "--teacher", "minilm", "--dim", str(args.dim),
                          "--out", str(static_dir), "--no-progress"]) == 0
    t_static = time.perf_counter() - t0
    rec = json.loads((static_dir / "config.json").read_text())["bertforge"]
    log(f"bertforge distill --method static --teacher minilm --dim {args.dim}: {t_static:.0f} s "
        f"(removed top {rec['removed_components']} components, SIF a={rec['sif_coefficient']}, "
        f"{rec['tokens_embedded']} tokens)")

    models = {"teacher (MiniLM-L6)": (load_embedder(teacher_dir, "teacher", threads=args.threads),
                                      args.teacher_batch),
              "bertforge static": (load_embedder(static_dir, "static", threads=args.threads), args.static_batch)}
    m2v_note = None
    m2v_dir = work / f"model2vec-{args.dim}"
    try:
        from model2vec import StaticModel
        if not (m2v_dir / "model.safetensors").is_file():
            from model2vec.distill import distill
            t0 = time.perf_counter()
            distill(str(teacher_dir), pca_dims=args.dim).save_pretrained(str(m2v_dir))
            log(f"model2vec.distill.distill(<MiniLM dir>, pca_dims={args.dim}): {time.perf_counter() - t0:.0f} s")
        else:
            log(f"model2vec.distill.distill(<MiniLM dir>, pca_dims={args.dim}): saved in {m2v_dir} by an earlier run")
        models["model2vec distill"] = (Model2VecEmbedder(StaticModel.from_pretrained(str(m2v_dir))),
                                       args.static_batch)
    except ImportError as e:
        m2v_note = f"model2vec distill unavailable ({e}); add skeletoken to PYTHONPATH"
        log(m2v_note)

    quality = {}
    for name, (emb, bs) in models.items():
        cache = work / f"quality-{name.split()[0]}-{args.dim}.json"
        if cache.is_file():
            quality[name] = json.loads(cache.read_text())
        else:
            quality[name] = evaluate_retrieval(emb, data, batch_size=bs, max_seq_len=256)
            cache.write_text(json.dumps(quality[name]))
        q = quality[name]
        log(f"  {name}: NDCG@10 {q['ndcg@10']:.4f} (all {len(data.queries)} questions, {len(data.corpus)} paragraphs)")
    speeds = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, (emb, bs) in models.items():
            t0 = time.perf_counter()
            emb.embed(texts_d, 256, bs)
            emb.embed(texts_q, 256, bs)
            speeds[name].append((len(texts_d) + len(texts_q)) / (time.perf_counter() - t0))
    log()
    log(f"throughput on {len(texts_d)} paragraphs + {len(texts_q)} questions, {args.rounds} interleaved rounds:")
    log(f"{'model':22s} {'NDCG@10':>8s} {'MRR@10':>7s} {'R@1':>6s} {'R@10':>6s} {'R@100':>6s}  "
        f"{'texts/s median (min-max)':>28s}  batch")
    for name, (emb, bs) in models.items():
        q, s = quality[name], speeds[name]
        log(f"{name:22s} {q['ndcg@10']:8.4f} {q['mrr@10']:7.4f} {q['recall@1']:6.3f} {q['recall@10']:6.3f} "
            f"{q['recall@100']:6.3f}  {statistics.median(s):12.0f} ({min(s):.0f}-{max(s):.0f})  {bs:5d}")
    t, st = "teacher (MiniLM-L6)", "bertforge static"
    keep = quality[st]["ndcg@10"] / quality[t]["ndcg@10"]
    speed = statistics.median(speeds[st]) / statistics.median(speeds[t])
    per_round = [a / b for a, b in zip(speeds[st], speeds[t])]
    log()
    log(f"static / teacher: NDCG@10 kept {100 * keep:.1f}% (goal >= 80%): {'MET' if keep >= 0.8 else 'NOT MET'}")
    log(f"static / teacher: throughput {speed:.1f}x (per round {', '.join(f'{x:.0f}x' for x in per_round)}; "
        f"goal >= 50x): {'MET' if speed >= 50 else 'NOT MET'}")
    if "model2vec distill" in quality:
        m = quality["model2vec distill"]["ndcg@10"]
        log(f"static vs model2vec distill (d={args.dim}): NDCG@10 {quality[st]['ndcg@10']:.4f} vs {m:.4f} "
            f"({100 * m / quality[t]['ndcg@10']:.1f}% of the teacher): "
            f"{'MET (above)' if quality[st]['ndcg@10'] > m else 'NOT MET'}; throughput static / model2vec "
            f"{statistics.median(speeds[st]) / statistics.median(speeds['model2vec distill']):.2f}x")
    else:
        log(f"static vs model2vec: NOT MEASURED ({m2v_note})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
