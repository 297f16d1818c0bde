"""Each objective pretrains a tiny model on WikiText-2 (raw valid+test) + the Gutenberg selections.

For every objective: ``bertforge pretrain --objective X --size tiny`` for a few hundred steps, then
* loss fall: last logged training loss vs the first logged one (must fall ≥ 30%);
* held-out masked-token accuracy (documents never trained on, fixed masks) vs the unigram baseline
  (always predicting the most frequent training token);
* the saved dir reloads in bertforge and loads in ``transformers`` (same logits).

Usage: python benchmarks/pretrain_quality.py [--steps 1000] [--batch-size 32] [--bf16] [--objectives bert,...]
Writes benchmarks/results/pretrain_quality.txt.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("BERTFORGE_DATA", ROOT.parent / "shared" / "data"))
HF_CLASS = {"bert": "BertForPreTraining", "roberta": "RobertaForMaskedLM", "albert": "AlbertForPreTraining",
            "electra": "ElectraForPreTraining", "spanbert": "BertForMaskedLM", "modernbert": "ModernBertForMaskedLM"}


def corpus_files() -> list:
    files = sorted(glob.glob(str(DATA / "wikitext-2-raw" / "wiki.*.raw")))
    files += sorted(glob.glob(str(DATA / "gutenberg" / "*.txt")))
    if not files:
        sys.exit(f"no corpus under {DATA}; set BERTFORGE_DATA")
    return files


def check_dir(obj: str, out: Path) -> dict:
    import torch
    import transformers
    from bertforge.checkpoint import load_pretrained
    from bertforge.objectives.electra import ElectraPretrainModel
    from bertforge.tokenizer import load_tokenizer
    tok = load_tokenizer(out)
    enc = tok.encode("The quick brown fox jumps over the lazy dog. It was a sunny day.")
    ids = torch.tensor([enc.ids])
    am = torch.ones_like(ids)
    tt = torch.tensor([enc.type_ids])
    if obj == "electra":
        ours = ElectraPretrainModel.from_pretrained(out).eval()
        with torch.no_grad():
            mine = ours.discriminator(ids, am, tt).logits
            gen_mine = ours.generator(ids, am, tt).logits
        theirs = transformers.ElectraForPreTraining.from_pretrained(out).eval()
        gen = transformers.ElectraForMaskedLM.from_pretrained(out / "generator").eval()
        with torch.no_grad():
            ref = theirs(input_ids=ids, attention_mask=am, token_type_ids=tt).logits
            gref = gen(input_ids=ids, attention_mask=am, token_type_ids=tt).logits
        diff = max(float((mine - ref).abs().max()), float((gen_mine - gref).abs().max()))
    else:
        ours = load_pretrained(out).eval()
        cls = getattr(transformers, HF_CLASS[obj])
        theirs = cls.from_pretrained(out).eval()
        segments = {} if obj == "modernbert" else {"token_type_ids": tt}  # ModernBERT has no segments
        with torch.no_grad():
            mine = ours(ids, am, tt).logits
            r = theirs(input_ids=ids, attention_mask=am, **segments)
            ref = r.prediction_logits if hasattr(r, "prediction_logits") else r.logits
        diff = float((mine - ref).abs().max())
    return {"hf_class": HF_CLASS[obj] + (" + generator/ElectraForMaskedLM" if obj == "electra" else ""),
            "hf_max_abs_diff": diff}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--objectives", default="bert,roberta,albert,electra,spanbert")
    ap.add_argument("--work", default="/tmp/bertforge-pretrain-quality")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (impl.dtype=bfloat16)")
    ap.add_argument("--parallel", action="store_true", help="run the objectives concurrently")
    ap.add_argument("--dropout-off", action="store_true", help="no dropout (cramming, Geiping & Goldstein 2022)")
    ap.add_argument("--model", default="",
                    help="model.* overrides of the tiny shape (comma-separated key=value), e.g. hidden_size=64")
    ap.add_argument("--append", action="store_true", help="append to --result instead of replacing it")
    ap.add_argument("--result", default=str(ROOT / "benchmarks" / "results" / "pretrain_quality.txt"))
    a = ap.parse_args()
    files = corpus_files()
    rows = []
    lines = [f"corpus: {len(files)} files ({', '.join(Path(f).name for f in files)})",
             f"shape: tiny (recipes/pretrain/tiny.yaml: 2 layers, H128, vocab 8192) with model overrides "
             f"{a.model or 'none'}, batch {a.batch_size}, seq {a.seq}, {a.steps} steps, lr {a.lr}, dropout "
             f"{'off' if a.dropout_off else '0.1'}, {'bf16' if a.bf16 else 'fp32'}, {a.threads} threads, "
             f"{'parallel' if a.parallel else 'one after another'}; load average {os.getloadavg()[0]:.1f} at start", ""]
    procs = {}
    for obj in a.objectives.split(","):
        out = Path(a.work) / obj
        cmd = [sys.executable, "-m", "bertforge", "pretrain", "--objective", obj, "--corpus", *files,
               "--out", str(out), "--size", "tiny", "--max-steps", str(a.steps), "--batch-size",
               str(a.batch_size), "--max-seq-len", str(a.seq), "--overwrite", "--no-progress",
               "--cache-dir", str(Path(a.work) / "cache"), "--lr", str(a.lr), "train.log_every=5",
               f"train.eval_every={max(1, a.steps // 2)}", f"impl.threads={a.threads}",
               f"train.dropout_off={str(a.dropout_off).lower()}", *(["--bf16"] if a.bf16 else []),
               *[f"model.{kv}" for kv in a.model.split(",") if kv]]
        procs[obj] = (subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
                      time.time(), out)
        if not a.parallel:
            procs[obj][0].wait()
    for obj, (proc, t0, out) in procs.items():
        stdout, stderr = proc.communicate()
        dt = time.time() - t0
        p = proc
        p.stderr = stderr
        if p.returncode != 0:
            lines.append(f"{obj}: FAILED rc={p.returncode}: {p.stderr.strip().splitlines()[-1:]}")
            rows.append({"objective": obj, "ok": False})
            continue
        recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in recs if "loss" in r]
        evals = [r["eval"] for r in recs if "eval" in r]
        first, last = train[0], train[-1]
        ev = evals[-1]
        fall = 1 - last["loss"] / first["loss"]
        row = {"objective": obj, "seconds": round(dt, 1), "loss_first": round(first["loss"], 4),
               "loss_last": round(last["loss"], 4), "loss_fall": round(fall, 4),
               "heldout_mlm_acc": round(ev["mlm_acc"], 4), "unigram_acc": round(ev["unigram_acc"], 4),
               "heldout_masked_tokens": ev["masked_tokens"],
               "terms_last": {k: round(v, 4) for k, v in last.items()
                              if k.endswith(("_loss", "_acc")) or k == "replaced"}}
        row.update(check_dir(obj, out))
        # beat the baseline by at least one whole masked token (not by float rounding)
        beats = ev["mlm_acc"] > ev["unigram_acc"] + 0.5 / max(1, ev["masked_tokens"])
        row["beats_unigram"] = bool(beats)
        row["ok"] = bool(fall >= 0.30 and beats and row["hf_max_abs_diff"] < 1e-3)
        rows.append(row)
        lines.append(json.dumps(row))
        print(json.dumps(row), flush=True)
    lines.append("")
    lines.append("objective  loss first→last (fall)   held-out MLM acc  unigram acc  loads in transformers  ok")
    for r in rows:
        if "loss_first" in r:
            lines.append(f"{r['objective']:<10} {r['loss_first']:7.3f} → {r['loss_last']:6.3f} ({100 * r['loss_fall']:4.1f}%)"
                         f"   {r['heldout_mlm_acc']:.4f}            {r['unigram_acc']:.4f}       "
                         f"{r['hf_class']} (max|Δ| {r['hf_max_abs_diff']:.1e})  {r['ok']}")
        else:
            lines.append(f"{r['objective']:<10} FAILED")
    text = "\n".join(lines) + "\n"
    Path(a.result).parent.mkdir(parents=True, exist_ok=True)
    with open(a.result, "a" if a.append else "w", encoding="utf-8") as f:  # --append: keep earlier runs
        f.write(("\n" if a.append else "") + "# python benchmarks/pretrain_quality.py " + " ".join(sys.argv[1:])
                + "\n" + text)
    print(text)
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
