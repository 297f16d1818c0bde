"""SST-2 dev accuracy after INT8 quantization and after head pruning of a fine-tuned MiniLM.

Needs a fine-tuned checkpoint (about 5 min on an idle 2-core CPU):
  bertforge finetune --model minilm --task sst2 --train ../shared/data/glue/SST-2/train.tsv \
      --eval ../shared/data/glue/SST-2/dev.tsv --epochs 1 --max-train-samples 8000 --max-seq-len 64 \
      --batch-size 32 --out /tmp/ft2

Then:
  python benchmarks/compress_sst2.py --model /tmp/ft2

Reports FP32, PyTorch dynamic INT8 and ONNX Runtime INT8 dev accuracy (872 sentences), then prunes heads
iteratively (Michel et al. 2019 importance on 1024 SST-2 *train* sentences not used for fine-tuning,
re-scored before each 10% step, no retraining; per-layer or raw scores, whichever keeps more accuracy on
872 further unseen train sentences) and writes the accuracy-vs-heads-pruned curve to
benchmarks/results/prune_sst2_curve.csv / .png. Finally the 30%-pruned model is recovered by Hinton KD from
the unpruned model (`bertforge distill --student <pruned dir>`) on the fine-tune's own train rows, next to a
control that gets the same KD epoch unpruned.
"""
from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

warnings.filterwarnings("ignore")
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "glue" / "SST-2"
if not DATA.is_dir():
    DATA = Path("/work/shared/data/glue/SST-2")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="fine-tuned SST-2 checkpoint dir (see the docstring)")
    ap.add_argument("--importance-samples", type=int, default=1024)
    ap.add_argument("--selection-samples", type=int, default=872,
                    help="further unseen train rows on which the importance normalisation is chosen")
    ap.add_argument("--skip-train", type=int, default=8000, help="train rows used by the fine-tune")
    ap.add_argument("--max-fraction", type=float, default=0.9)
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--recover-epochs", type=float, default=1.0,
                    help="KD recovery of the 30%%-pruned model on the fine-tune's own train rows (0: skip)")
    ap.add_argument("--results", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args(argv)
    import logging
    logging.getLogger().setLevel(logging.ERROR)
    if args.threads:
        torch.set_num_threads(args.threads)
    from bertforge.pipelines.evaluate import load_for_task
    from bertforge.pipelines.prune import plot_curve
    from bertforge.compress import onnx as bo
    from bertforge.compress import prune as P
    from bertforge.compress import quantize as bq
    from bertforge.data.readers import read_examples
    from bertforge.data.collate import encode_examples
    from bertforge.runtime import load_runner

    model_dir, task, adapter, fp32_runner = load_for_task(args.model, "sst2")
    model = fp32_runner.model
    dev = adapter.load(str(DATA / "dev.tsv"))
    lines = []
    t0 = time.time()
    acc = lambda m: adapter.evaluate(m, dev, 64)["accuracy"]  # noqa: E731
    fp32 = acc(model)
    lines.append(f"compress_sst2: model {model_dir}, SST-2 dev n={len(dev)}, threads {torch.get_num_threads()}")
    lines.append(f"FP32 accuracy                      {100 * fp32:.2f}")
    q = bq.quantize_dynamic(model)
    a_torch = acc(q)
    lines.append(f"PyTorch dynamic INT8 accuracy (per-channel)      {100 * a_torch:.2f}  (delta {100 * (a_torch - fp32):+.2f} points)")
    tmp = tempfile.TemporaryDirectory(prefix="compress_sst2-")  # removed on exit, even after an error
    work = Path(tmp.name)
    rec = bo.deploy(model, work / "ort-int8", quantize=True)
    a_ort = acc(load_runner(work / "ort-int8"))
    lines.append(f"ONNX Runtime INT8 accuracy (per-channel)         {100 * a_ort:.2f}  (delta {100 * (a_ort - fp32):+.2f} points; "
                 f"FP32 graph parity {rec['fp32_max_abs_diff']:.1e}; {rec['file_mb']} MB vs "
                 f"{(model_dir / 'model.safetensors').stat().st_size / 2**20:.1f} MB FP32)")
    q_pt = bq.quantize_dynamic(model, per_channel=False)
    a_pt = acc(q_pt)
    bo.deploy(model, work / "ort-int8-pt", quantize=True, per_channel=False)
    a_ort_pt = acc(load_runner(work / "ort-int8-pt"))
    lines.append(f"  (per-tensor weight scales instead: PyTorch {100 * a_pt:.2f} ({100 * (a_pt - fp32):+.2f}), "
                 f"ONNX Runtime {100 * a_ort_pt:.2f} ({100 * (a_ort_pt - fp32):+.2f}))")
    print("\n".join(lines), flush=True)

    # importance sample: train rows after the ones fine-tuning saw; then a selection slice (more unseen
    # train rows) on which the importance normalisation is chosen, so dev is only reported, never tuned on
    n_sel = args.selection_samples
    ex = read_examples(str(DATA / "train.tsv"), task, args.skip_train + args.importance_samples + n_sel)
    imp_data = encode_examples(adapter.tok, ex[args.skip_train:args.skip_train + args.importance_samples],
                               adapter.max_seq_len)
    sel = adapter.load(str(DATA / "train.tsv"))[args.skip_train + args.importance_samples:][:n_sel]
    collate = adapter.collator()
    batches = [collate(imp_data[s:s + 32]) for s in range(0, len(imp_data), 32)]
    total = sum(P.head_counts(model))
    eval_fn = lambda m: {"accuracy": acc(m), "selection_accuracy": adapter.evaluate(m, sel, 64)["accuracy"]}  # noqa: E731
    hists = {}
    step30 = round(0.3 * args.steps / args.max_fraction)  # the step closest to 30% of the heads
    for norm in ("layer", "none"):
        pm = load_for_task(args.model, "sst2")[3].model

        def log(r, norm=norm, pm=pm):
            print(f"  [{norm}] step {r['step']}: {r['heads_pruned']:3d}/{total} heads pruned "
                  f"({100 * r['heads_fraction']:.1f}%), dev accuracy {100 * r['accuracy']:.2f}, selection "
                  f"{100 * r['selection_accuracy']:.2f}, heads/layer {r['heads_per_layer']}", flush=True)
            if r["step"] == step30 and args.recover_epochs > 0:  # kept for the recovery below
                pm.save_pretrained(work / f"pruned30-{norm}", tokenizer_dir=model_dir)
        hists[norm] = P.iterative_prune(pm, lambda: batches, args.max_fraction, args.steps, loss="task",
                                        eval_fn=eval_fn, log=log, normalize=norm == "layer")
    at30 = {n: h[step30] for n, h in hists.items()}
    chosen = max(at30, key=lambda n: (at30[n]["selection_accuracy"], n == "layer"))
    hist = hists[chosen]
    res = Path(args.results)
    res.mkdir(parents=True, exist_ok=True)
    with open(res / "prune_sst2_curve.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["importance_norm", "step", "heads_pruned", "heads_fraction", "accuracy",
                    "selection_accuracy", "parameters", "heads_per_layer"])
        for norm, h in hists.items():
            for r in h:
                w.writerow([norm, r["step"], r["heads_pruned"], r["heads_fraction"], round(r["accuracy"], 6),
                            round(r["selection_accuracy"], 6), r["parameters"],
                            " ".join(map(str, r["heads_per_layer"]))])
    plot_curve(res / "prune_sst2_curve.png", [r["heads_pruned"] for r in hist],
               [100 * r["accuracy"] for r in hist], "SST-2 dev accuracy (%)",
               title=f"MiniLM-L6 SST-2: heads pruned (of {total}), importance norm {chosen}, no retraining")
    lines = [f"head pruning (Michel et al. 2019 importance, task loss on {len(imp_data)} train sentences, "
             f"re-scored every step, no retraining); normalisation chosen on {len(sel)} further train "
             f"sentences (selection accuracy at 30%: " + ", ".join(
                 f"{n} {100 * r['selection_accuracy']:.2f}" for n, r in at30.items()) + f") -> {chosen}:"]
    for r in hist:
        lines.append(f"  {r['heads_pruned']:3d}/{total} heads ({100 * r['heads_fraction']:5.1f}%)  accuracy "
                     f"{100 * r['accuracy']:.2f}  delta {100 * (r['accuracy'] - fp32):+.2f}  params "
                     f"{r['parameters']}  heads/layer {r['heads_per_layer']}")
    other = next(n for n in hists if n != chosen)
    lines.append(f"  (not chosen, {other}: 30% -> dev {100 * at30[other]['accuracy']:.2f}, "
                 f"delta {100 * (at30[other]['accuracy'] - fp32):+.2f})")
    a30 = at30[chosen]
    rec_line = None
    if args.recover_epochs > 0:
        # recovery: distil the unpruned model into the 30%-pruned one saved during the sweep (Hinton KD,
        # `bertforge distill --student <pruned dir>`) on the train rows the fine-tune itself used, so no data
        # beyond the fine-tune's is seen
        from bertforge.cli import main as cli
        pruned30 = work / f"pruned30-{chosen}"
        t_rec = time.time()
        rc = cli(["distill", "--teacher", str(model_dir), "--student", str(pruned30), "--method", "kd",
                  "--stage", "task", "--task", "sst2", "--train", str(DATA / "train.tsv"),
                  "--max-train-samples", str(args.skip_train), "--epochs", str(args.recover_epochs),
                  "--out", str(work / "recovered"), "--no-progress"])
        assert rc == 0, rc
        rm = load_for_task(str(work / "recovered"), "sst2")[3].model
        assert P.head_counts(rm) == a30["heads_per_layer"]
        a_rec = acc(rm)
        t_rec = time.time() - t_rec
        # control: the same KD epoch on the unpruned model, to separate recovery from extra training
        rc = cli(["distill", "--teacher", str(model_dir), "--student", str(model_dir), "--method", "kd",
                  "--stage", "task", "--task", "sst2", "--train", str(DATA / "train.tsv"),
                  "--max-train-samples", str(args.skip_train), "--epochs", str(args.recover_epochs),
                  "--out", str(work / "control"), "--no-progress"])
        assert rc == 0, rc
        a_ctl = acc(load_for_task(str(work / "control"), "sst2")[3])
        rec_line = (f"  recovery: 30% pruned + KD from the unpruned model ({args.recover_epochs:g} epoch on the "
                    f"fine-tune's {args.skip_train} train rows, {t_rec:.0f}s) -> dev {100 * a_rec:.2f}, delta "
                    f"{100 * (a_rec - fp32):+.2f} vs the fine-tuned model; control, the same KD epoch on the "
                    f"unpruned model -> {100 * a_ctl:.2f}, so pruning costs {100 * (a_ctl - a_rec):.2f} points "
                    f"against an equally trained model")
        lines.append(rec_line)
    lines.append(f"MUST: INT8 changes accuracy by {100 * (a_ort - fp32):+.2f} points (ORT) / "
                 f"{100 * (a_torch - fp32):+.2f} (torch) "
                 f"(target: lose <= 0.5); pruning {a30['heads_pruned']}/{total} heads "
                 f"({100 * a30['heads_fraction']:.1f}%) loses {100 * (fp32 - a30['accuracy']):.2f} points "
                 f"without retraining" + (f"; after KD recovery {100 * (a_rec - fp32):+.2f} vs the fine-tuned "
                                          f"model, {100 * (a_rec - a_ctl):+.2f} vs the equally trained control"
                                          if rec_line else "")
                 + f" (target <= 1); curve: benchmarks/results/prune_sst2_curve.csv/.png; {time.time() - t0:.0f}s")
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
