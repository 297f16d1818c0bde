"""In-batch negatives with repeated texts (issue 39, item 3): SQuAD retrieval fine-tuning of MiniLM on the train
pairs as they come — a paragraph is the positive of ~4.6 questions, so a batch of 32 often holds one paragraph
twice and MNRL then scores a question's own paragraph as its negative — with ``train.no_duplicates`` (the
default: no batch repeats a text; deferred / dropped pairs counted on stderr), against the same data with the
repeats removed by hand (one question per paragraph), and against the plain shuffled batches
(``train.no_duplicates=false``, what ran before).

Data and evaluation as ``bench_retrieval.py``: ``squad_to_beir`` of ``../shared/data/squad/dev-v1.1.json``
(articles split disjointly, seed 0), training on ``train.jsonl`` of the train articles, NDCG@10 of the eval
articles' questions against their own paragraphs (bertforge's Embedder, exact search). Every arm: the same
steps, batch, lr (the retrieval task's default, 2e-5), warm-up, sequence lengths and seed.

    nice -n 10 python benchmarks/bench_no_duplicates.py --threads 2 --steps 48

Writes benchmarks/results/no_duplicates.txt (command, CPU flags, one line per arm, the counts, the goal).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))


def run_cli(argv: list) -> tuple:
    """A bertforge verb in this process → (its JSON result line, its stderr lines that start with bertforge)."""
    from bertforge.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    if rc != 0:
        raise SystemExit(f"bertforge {' '.join(map(str, argv))} failed ({rc}): {err.getvalue()[-600:]}")
    notes = [ln for ln in err.getvalue().splitlines() if "no_duplicates" in ln]
    return json.loads(out.getvalue().strip().splitlines()[-1]), notes


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--epochs", type=int, default=0, help="train every arm this many epochs of its own data instead "
                                                          "of --steps (a user's default run: raw pairs vs cleaned)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--train-max-seq-len", type=int, default=128)
    ap.add_argument("--max-seq-len", type=int, default=256, help="evaluation: texts cut at this many tokens")
    ap.add_argument("--arms", default="sampler,hand,off")
    ap.add_argument("--eval-queries", type=int, default=0, help="score this many eval questions (0: all), an even "
                                                                "spread over the eval articles (seed 0)")
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/no_duplicates.txt"))
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(args.threads)
    os.environ.setdefault("BERTFORGE_NO_PROGRESS", "1")
    from bench_retrieval import SQUAD, evaluate
    from bertforge.checkpoint import resolve_model_dir
    from bertforge.data.beir import read_beir, squad_to_beir
    from bertforge.hardware import cpu_flags

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-nodup-"))
    work.mkdir(parents=True, exist_ok=True)
    lines = ["command: nice -n 10 python benchmarks/bench_no_duplicates.py "
             + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
             f"cpu flags: {' '.join(cpu_flags())}",
             f"torch threads: {args.threads}; host: 2 cores shared with other sessions"]

    def say(s):
        print(s, flush=True)
        lines.append(s)

    beir_dir = work / "squad-beir"
    counts = squad_to_beir(SQUAD, beir_dir, eval_fraction=0.2, seed=0)
    beir = read_beir(beir_dir, "test")
    eval_docs = {d for q in beir.qrels for d in beir.qrels[q]}
    beir.corpus = {d: t for d, t in beir.corpus.items() if d in eval_docs}
    if args.eval_queries and args.eval_queries < len(beir.queries):  # as bench_retrieval.py --eval-queries
        import random
        keep = sorted(random.Random(0).sample(sorted(beir.queries), args.eval_queries))
        beir.queries, beir.qrels = {q: beir.queries[q] for q in keep}, {q: beir.qrels[q] for q in keep}
    pairs = [json.loads(x) for x in (beir_dir / "train.jsonl").read_text().splitlines()]
    seen_q, seen_p, hand = set(), set(), []
    for p in pairs:  # by hand: the first question of each paragraph (and each question text once)
        if p["query"] in seen_q or p["positive"] in seen_p:
            continue
        seen_q.add(p["query"])
        seen_p.add(p["positive"])
        hand.append(p)
    hand_file = work / "train_hand.jsonl"
    hand_file.write_text("".join(json.dumps(p) + "\n" for p in hand))
    say(f"data: {SQUAD.name} → {json.dumps(counts)}; train pairs {len(pairs)} ({len({p['positive'] for p in pairs})} "
        f"distinct paragraphs), by hand {len(hand)}")
    length = f"{args.epochs} epoch(s) of each arm's own pairs" if args.epochs else f"{args.steps} steps"
    say(f"training: MNRL scale 20, {length} × batch {args.batch}, lr 2e-05 (the retrieval default), "
        f"linear, warm-up 10%, texts cut at {args.train_max_seq_len}; eval {len(beir.queries)} questions × "
        f"{len(beir.corpus)} paragraphs at {args.max_seq_len}")
    teacher = resolve_model_dir("minilm")
    arms = {"sampler": (beir_dir / "train.jsonl", []), "hand": (hand_file, []),
            "off": (beir_dir / "train.jsonl", ["train.no_duplicates=false"])}
    res = {}
    for name in [a for a in args.arms.split(",") if a]:
        data, extra = arms[name]
        out = work / f"ft-{name}"
        r, notes = run_cli(["finetune", "--model", teacher, "--task", "retrieval", "--train", data, "--out", out,
                            "--max-seq-len", args.train_max_seq_len,
                            *(["--epochs", args.epochs] if args.epochs
                              else ["--max-steps", args.steps, f"train.save_every={args.steps}"]),
                            "--batch-size", args.batch, "--overwrite", "train.warmup_ratio=0.1",
                            f"impl.threads={args.threads}", "--no-progress", *extra])
        m = evaluate(out, beir, args.threads, args.max_seq_len)
        res[name] = m
        steps = r.get("step", r.get("steps", "?"))
        say(f"{name:<8} train={data.name:<17} {' '.join(extra) or '(defaults)':<27} steps {steps}  NDCG@10 {m['ndcg@10']:.4f}  "
            f"MRR@10 {m['mrr@10']:.4f}  R@10 {m['recall@10']:.3f}  no_duplicates={json.dumps(r.get('no_duplicates'))}")
        for n in notes:
            say(f"    {n}")
    if "sampler" in res and "hand" in res:
        d = res["sampler"]["ndcg@10"] - res["hand"]["ndcg@10"]
        say(f"goal: the sampler on the raw pairs ≥ the pairs de-duplicated by hand (NDCG@10): {d * 100:+.2f} points -> "
            f"{'MET' if d >= 0 else 'NOT MET'}")
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
