"""Semantic search on SQuAD dev (issue #25, "must show"): the MiniLM teacher, a 3-layer student distilled with
``embedding_mse``, and contrastive fine-tuning of the teacher in bertforge and in sentence-transformers.

Data: ``../shared/data/squad/dev-v1.1.json`` → a BEIR dir by :func:`bertforge.data.beir.squad_to_beir`: the 48
articles split disjointly (20% of the questions' articles for evaluation, seed 0). Training (distillation and
fine-tuning) reads only ``train.jsonl`` (questions and paragraphs of the train articles); every NDCG@10 is on the
eval articles (their questions against their paragraphs). Paragraphs are cut at ``--max-seq-len`` (256) tokens.

Rows:
  teacher             all-MiniLM-L6-v2 (mean pooling, normalised, as its dir declares)
  student-3L          ``bertforge distill --method embedding_mse --student layers:…`` on the train texts; which
                      three teacher blocks is chosen before training, on the train articles only: every
                      ``--student`` candidate is copied from the teacher untrained and scored (NDCG@10, train
                      questions against train paragraphs), the best one is distilled
  ft-bertforge        ``bertforge finetune --task retrieval`` (MNRL, scale 20) of the teacher on train pairs
  ft-st               the same training in sentence-transformers (MultipleNegativesRankingLoss, scale 20; same
                      pairs, batch, steps, lr, warm-up, schedule, weight decay, clipping)

Measured: NDCG@10 / MRR@10 / Recall@10 (bertforge's Embedder → exact search → retrieval_metrics, the same path
for every model), encoding throughput (texts/s: the eval paragraphs embedded in interleaved rounds, median and
spread, same ``--threads`` for every model; the student's speed-up is the median of the per-round ratios),
training examples/s (wall time of the training loop; bertforge's from its metrics.jsonl, sentence-transformers'
around ``trainer.train()``).

  python benchmarks/bench_retrieval.py --threads 2 --out benchmarks/results/retrieval.txt

sentence-transformers' Trainer needs ``accelerate`` (the ``peers`` extra); where the venv lacks it,
``pip install --no-deps --target DIR accelerate`` and pass ``--peers DIR``.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SQUAD = REPO.parent / "shared" / "data" / "squad" / "dev-v1.1.json"


def evaluate(path, beir, threads: int, max_seq_len: int) -> dict:
    """NDCG@10 etc. of the model dir ``path`` on the eval split, through bertforge's Embedder."""
    from bertforge.runtime.embedder import load_embedder
    from bertforge.metrics.retrieval import exact_search, retrieval_metrics, run_from_topk
    emb = load_embedder(path, threads=threads)
    qids, dids = list(beir.queries), list(beir.corpus)
    q = emb.embed([beir.queries[i] for i in qids], max_seq_len, batch_size=64)
    d = emb.embed([beir.corpus[i] for i in dids], max_seq_len, batch_size=32)
    m = retrieval_metrics(run_from_topk(qids, dids, *exact_search(q, d, top_k=100)), beir.qrels)
    return {k: m[k] for k in ("ndcg@10", "mrr@10", "recall@10", "recall@100")}


def scan_students(teacher, specs: list, beir_dir, work, threads: int, max_seq_len: int, n_queries: int) -> dict:
    """NDCG@10 on the *train* split of each student spec copied from the teacher without training (and of the
    teacher, as the reference): {spec: metrics}. Picks teacher blocks without looking at the eval articles."""
    import random

    from bertforge.data.beir import read_beir
    from bertforge.distillation.student import build_student
    from bertforge.checkpoint import load_pretrained
    from bertforge.models.pooling import read_pooling
    tr = read_beir(beir_dir, "train")
    docs = {d for q in tr.qrels for d in tr.qrels[q]}
    tr.corpus = {d: t for d, t in tr.corpus.items() if d in docs}
    if n_queries < len(tr.queries):
        keep = sorted(random.Random(0).sample(sorted(tr.queries), n_queries))
        tr.queries, tr.qrels = {q: tr.queries[q] for q in keep}, {q: tr.qrels[q] for q in keep}
    t_model = load_pretrained(teacher, head="base", notes=False)
    out = {"teacher": evaluate(teacher, tr, threads, max_seq_len)}
    for spec in specs:
        d = Path(work) / spec.replace(":", "-").replace(",", "")
        build_student(spec, t_model, notes=False).save_pretrained(d, tokenizer_dir=teacher, pooling=read_pooling(teacher))
        out[spec] = evaluate(d, tr, threads, max_seq_len)
        print(f"scan {spec}: NDCG@10 {out[spec]['ndcg@10']:.4f}", flush=True)
    return out


def throughputs(paths: dict, texts: list, threads: int, max_seq_len: int, rounds: int) -> dict:
    """texts/s of embedding ``texts`` (batch 32) per model, in interleaved rounds: {name: [per round]}."""
    from bertforge.runtime.embedder import load_embedder
    embs = {n: load_embedder(p, threads=threads) for n, p in paths.items()}
    for e in embs.values():  # warm-up
        e.embed(texts[:32], max_seq_len, batch_size=32)
    out = {n: [] for n in embs}
    for _ in range(rounds):
        for n, e in embs.items():
            t0 = time.perf_counter()
            e.embed(texts, max_seq_len, batch_size=32)
            out[n].append(len(texts) / (time.perf_counter() - t0))
    return out


def cli(argv: list) -> dict:
    """Run a bertforge verb in this process; returns its JSON result line."""
    import contextlib
    import io

    from bertforge.cli import main
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main([str(a) for a in argv])
    if rc != 0:
        raise SystemExit(f"bertforge {' '.join(map(str, argv))} failed ({rc})")
    return json.loads(buf.getvalue().strip().splitlines()[-1])


def bertforge_examples_per_s(run_dir: Path) -> float:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "examples_per_s" in r][-1]["examples_per_s"]


def st_finetune(model_dir, pairs: list, out: Path, batch: int, steps: int, lr: float, warmup_ratio: float,
                max_seq_len: int, seed: int) -> float:
    """The same contrastive fine-tuning in sentence-transformers; returns training examples/s."""
    import torch
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.sentence_transformer.training_args import SentenceTransformerTrainingArguments
    from transformers import TrainerCallback

    class Clock(TrainerCallback):  # the training loop's wall time, as bertforge's examples_per_s counts it
        def on_train_begin(self, *a, **k):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_train_end(self, *a, **k):
            self.t1, self.c1 = time.perf_counter(), time.process_time()

    torch.manual_seed(seed)
    model = SentenceTransformer(str(model_dir), device="cpu")
    model.max_seq_length = max_seq_len
    ds = Dataset.from_dict({"anchor": [p["query"] for p in pairs], "positive": [p["positive"] for p in pairs]})
    args = SentenceTransformerTrainingArguments(
        output_dir=str(out / "st-work"), per_device_train_batch_size=batch, max_steps=steps, learning_rate=lr,
        warmup_steps=warmup_ratio, lr_scheduler_type="linear", weight_decay=0.01, max_grad_norm=1.0,
        seed=seed, save_strategy="no", logging_steps=10, report_to=[], use_cpu=True,
        dataloader_drop_last=True, disable_tqdm=True)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=ds,
                                         loss=MultipleNegativesRankingLoss(model, scale=20.0), callbacks=[clock := Clock()])
    trainer.train()
    model.save(str(out))
    (out / "examples_per_s.json").write_text(json.dumps(steps * batch / (clock.t1 - clock.t0)))
    (out / "cpu_s.json").write_text(json.dumps(clock.c1 - clock.c0))
    return steps * batch / (clock.t1 - clock.t0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-seq-len", type=int, default=256)
    ap.add_argument("--distill-epochs", type=float, default=3)
    ap.add_argument("--student", nargs="+", default=["layers:0,2,4", "layers:0,3,5", "layers:0,4,5"],
                    help="student spec(s); with several, the best untrained copy on the train articles is distilled")
    ap.add_argument("--scan-queries", type=int, default=2000,
                    help="train questions the student scan scores (an even sample; every train paragraph stays)")
    ap.add_argument("--ft-steps", type=int, default=120)
    ap.add_argument("--ft-batch", type=int, default=32)
    ap.add_argument("--ft-lr", type=float, default=2e-5)
    ap.add_argument("--rounds", type=int, default=7,
                    help="interleaved throughput rounds; the speed-up is the median of the per-round ratios")
    ap.add_argument("--throughput-texts", type=int, default=256)
    ap.add_argument("--work", help="work dir (default: a temporary one)")
    ap.add_argument("--peers", help="a folder of extra packages (accelerate) put on sys.path")
    ap.add_argument("--train-max-seq-len", type=int, default=128,
                    help="tokens per text in training (distillation and both fine-tunings); evaluation uses --max-seq-len")
    ap.add_argument("--distill-lr", type=float, default=1e-4)
    ap.add_argument("--distill-max-seq-len", type=int, help="distillation: cut texts at N tokens (default: --train-max-seq-len)")
    ap.add_argument("--distill-samples", type=int, help="distil on the texts of the first N train pairs only")
    ap.add_argument("--eval-queries", type=int, help="evaluate on N eval questions (every eval paragraph stays)")
    ap.add_argument("--reuse", action="store_true", help="keep the trained models already in --work (rerun the report)")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/retrieval.txt"))
    args = ap.parse_args(argv)
    if args.peers:
        sys.path.append(args.peers)

    import torch
    torch.set_num_threads(args.threads)
    os.environ.setdefault("BERTFORGE_NO_PROGRESS", "1")
    from bertforge.data.beir import read_beir, squad_to_beir
    from bertforge.hardware import cpu_flags
    from bertforge.checkpoint import resolve_model_dir

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-retrieval-"))
    work.mkdir(parents=True, exist_ok=True)
    lines = ["command: python benchmarks/bench_retrieval.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
             f"cpu flags: {' '.join(cpu_flags())}",
             f"torch threads: {args.threads} for every model (encoding and training); the host was shared with "
             f"other jobs (2 cores, six sessions): throughput is given as median and spread of interleaved rounds"]

    def say(s):
        print(s, flush=True)
        lines.append(s)

    beir_dir = work / "squad-beir"
    counts = squad_to_beir(SQUAD, beir_dir, eval_fraction=0.2, seed=0)
    say(f"data: {SQUAD.name} → {json.dumps(counts)}")
    beir = read_beir(beir_dir, "test")
    # the corpus: the eval articles' paragraphs only (no text any model trained on is searched)
    eval_docs = {d for q in beir.qrels for d in beir.qrels[q]}
    beir.corpus = {d: t for d, t in beir.corpus.items() if d in eval_docs}
    if args.eval_queries and args.eval_queries < len(beir.queries):  # an even spread over the eval articles
        import random
        keep = sorted(random.Random(0).sample(sorted(beir.queries), args.eval_queries))
        beir.queries = {q: beir.queries[q] for q in keep}
        beir.qrels = {q: beir.qrels[q] for q in keep}
    train = beir_dir / "train.jsonl"
    pairs = [json.loads(x) for x in train.read_text().splitlines()]
    eval_texts = set(beir.corpus[d] for q in beir.qrels for d in beir.qrels[q])
    assert not eval_texts & {p["positive"] for p in pairs}, "an eval paragraph is in the training pairs"
    teacher = resolve_model_dir("minilm")
    common = [f"impl.threads={args.threads}", "--no-progress"]

    # ---- student: which teacher blocks, chosen on the train articles (never the eval ones)
    spec = args.student[0]
    if len(args.student) > 1:
        scan = scan_students(teacher, args.student, beir_dir, work / "scan", args.threads, args.max_seq_len,
                             args.scan_queries)
        t_scan = scan.pop("teacher")["ndcg@10"]
        spec = max(scan, key=lambda k: scan[k]["ndcg@10"])
        say(f"student scan (untrained copies of teacher blocks; {args.scan_queries} train questions against the "
            f"train paragraphs, NDCG@10; the teacher: {t_scan:.4f}): "
            + ", ".join(f"{k} {v['ndcg@10']:.4f}" for k, v in scan.items()) + f" → {spec}")

    # ---- student: embedding_mse distillation on the train articles' texts
    student = work / "student-3l"
    dlen = args.distill_max_seq_len or args.train_max_seq_len
    done = lambda p: args.reuse and (p / "model.safetensors").is_file()  # noqa: E731
    r = json.loads((student / "result.json").read_text()) if done(student) else cli(["distill", "--teacher", teacher, "--student", spec, "--method", "embedding_mse",
             "--task", "retrieval", "--train", train, "--out", student, "--max-seq-len", dlen,
             "--epochs", args.distill_epochs, "--batch-size", 32, "--lr", args.distill_lr, "--overwrite", *common,
             *(["--max-train-samples", args.distill_samples] if args.distill_samples else [])])
    (student / "result.json").write_text(json.dumps(r))
    say(f"distill embedding_mse ({spec}, texts of the first {args.distill_samples or len(pairs)} train pairs, "
        f"{args.distill_epochs} epochs, batch 32, lr {args.distill_lr:g}, texts cut at {dlen} tokens): {r['step']} steps")

    # ---- contrastive fine-tuning: bertforge then sentence-transformers, same settings
    ft = work / "ft-bertforge"
    done(ft) or cli(["finetune", "--model", teacher, "--task", "retrieval", "--train", train, "--out", ft,
         "--max-seq-len", args.train_max_seq_len, "--max-steps", args.ft_steps, "--batch-size", args.ft_batch,
         "--lr", args.ft_lr, "--overwrite", "train.warmup_ratio=0.1", "train.schedule=linear",
         "train.weight_decay=0.01", "train.max_grad_norm=1.0", f"train.save_every={args.ft_steps}", *common])
    bf_eps = bertforge_examples_per_s(ft)
    st_dir = work / "ft-st"
    st_eps = json.loads((st_dir / "examples_per_s.json").read_text()) if done(st_dir) else \
        st_finetune(teacher, pairs, st_dir, args.ft_batch, args.ft_steps, args.ft_lr, 0.1, args.train_max_seq_len, 42)
    say(f"fine-tuning: MNRL scale 20, {args.ft_steps} steps × batch {args.ft_batch} ({args.ft_steps * args.ft_batch}"
        f" of {len(pairs)} train pairs), lr {args.ft_lr}, linear, warm-up 10%, weight decay 0.01, clip 1.0, "
        f"texts cut at {args.train_max_seq_len} tokens; evaluation at {args.max_seq_len}")

    # ---- quality: one path for every model
    models = {"teacher": teacher, "student-3L": student, "ft-bertforge": ft, "ft-st": st_dir}
    q = {n: evaluate(p, beir, args.threads, args.max_seq_len) for n, p in models.items()}
    texts = [beir.corpus[d] for d in list(beir.corpus)[:args.throughput_texts]]
    tp = throughputs({"teacher": teacher, "student-3L": student}, texts, args.threads, args.max_seq_len, args.rounds)

    t_ndcg = q["teacher"]["ndcg@10"]
    say(f"\neval: {len(beir.queries)} questions (of {len(read_beir(beir_dir, 'test').queries)}), {len(beir.corpus)} "
        f"paragraphs (the eval articles' own: no training text is searched)")
    say(f"{'model':14s} {'NDCG@10':>8s} {'MRR@10':>7s} {'R@10':>6s} {'R@100':>6s} {'% teacher':>9s}  texts/s (median, rounds)")
    for n, m in q.items():
        tps = f"{statistics.median(tp[n]):7.1f}  [{', '.join(f'{x:.1f}' for x in tp[n])}]" if n in tp else ""
        say(f"{n:14s} {m['ndcg@10']:8.4f} {m['mrr@10']:7.4f} {m['recall@10']:6.3f} {m['recall@100']:6.3f} "
            f"{100 * m['ndcg@10'] / t_ndcg:8.1f}%  {tps}")
    keep = q["student-3L"]["ndcg@10"] / t_ndcg
    # paired: each round times the teacher then the student back to back, so a slow phase of a shared host
    # moves both; the median of the per-round ratios is the speed-up
    ratios = [s_ / t_ for s_, t_ in zip(tp["student-3L"], tp["teacher"])]
    speed = statistics.median(ratios)
    gain = q["ft-bertforge"]["ndcg@10"] - t_ndcg
    gap = 100 * abs(q["ft-bertforge"]["ndcg@10"] - q["ft-st"]["ndcg@10"])
    say("")
    say(f"student-3L keeps {100 * keep:.1f}% of the teacher's NDCG@10 (goal ≥ 95%) at {speed:.2f}× its throughput "
        f"(goal ≥ 1.9×; per round {min(ratios):.2f}–{max(ratios):.2f}×): {'MET' if keep >= 0.95 and speed >= 1.9 else 'NOT MET'}")
    say(f"fine-tuning raises eval NDCG@10 by {100 * gain:+.2f} points (goal > 0): {'MET' if gain > 0 else 'NOT MET'}")
    say(f"bertforge vs sentence-transformers NDCG@10: {gap:.2f} points apart (goal ≤ 1): {'MET' if gap <= 1 else 'NOT MET'}")
    say(f"training examples/s: bertforge {bf_eps:.2f}, sentence-transformers {st_eps:.2f} → {bf_eps / st_eps:.2f}× "
        f"(goal ≥ 1.3×): {'MET' if bf_eps / st_eps >= 1.3 else 'NOT MET'}")
    bf_cpu = [json.loads(x) for x in (ft / "metrics.jsonl").read_text().splitlines() if "cpu_s" in x][-1]["cpu_s"]
    if (st_dir / "cpu_s.json").is_file():  # CPU seconds of the loop (both processes run --threads threads)
        st_cpu = json.loads((st_dir / "cpu_s.json").read_text())
        say(f"training CPU seconds per example: bertforge {bf_cpu / (args.ft_steps * args.ft_batch):.3f}, "
            f"sentence-transformers {st_cpu / (args.ft_steps * args.ft_batch):.3f} → {st_cpu / bf_cpu:.2f}×")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
