"""Distillation throughput: bertforge with teacher outputs cached on disk vs a TextBrewer-style loop
that runs the `transformers` teacher every step.

Same data (SST-2 train sentences, length ≤ 64), same batches, same student weights, same losses and
AdamW. Three loops, timed interleaved (A B C A B C …) so machine load hits them alike; the median
step time of each is reported and converted to examples/s:

  ref      TextBrewer-style: transformers teacher (eval, no_grad) + transformers student every step
  live     bertforge Distiller, teacher run every step (no cache)
  cached   bertforge Distiller reading teacher features from the memory-mapped cache (epochs ≥ 2)

Settings: ``kd`` (3-layer student copied from the teacher, logits KD) and ``tinybert`` (4L-312H-12A-1200I
student; embedding + hidden (W_h) + attention + soft CE). Usage:

  python benchmarks/bench_distill.py --teacher /tmp/p4/teacher --steps 12
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def main(argv=None) -> int:
    from transformers import AutoModelForSequenceClassification

    from bertforge.tasks import adapter_for
    from bertforge.checkpoint.modeldir import resolve_model_dir
    from bertforge.tasks import get_task
    from bertforge.distillation.cache import TeacherCache
    from bertforge.distillation.data import DistillCollator, IndexedDataset
    from bertforge.distillation.distiller import Distiller, build_terms, method_terms
    from bertforge.distillation.student import build_student
    from bertforge.checkpoint import load_pretrained
    from bertforge.tokenizer import load_tokenizer

    ap = argparse.ArgumentParser()
    ap.add_argument("--teacher", default="minilm")
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/glue/SST-2/train.tsv"))
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-seq-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=12, help="timed steps per loop")
    ap.add_argument("--settings", default="kd,tinybert")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    tdir = resolve_model_dir(args.teacher)
    tok = load_tokenizer(tdir)
    task = get_task("sst2")
    adapter = adapter_for(task, tok, args.max_seq_len)
    n = args.batch_size * args.steps
    items = adapter.load(args.data, n)
    collate = DistillCollator(adapter.collator())
    ds = IndexedDataset(items)
    batches = [collate([ds[i] for i in range(s, s + args.batch_size)]) for s in range(0, n, args.batch_size)]
    print(f"teacher {tdir}; {n} SST-2 examples, batch {args.batch_size}, max len {args.max_seq_len}, "
          f"{args.steps} timed steps per loop, torch threads {args.threads}")
    lines = []
    for setting in args.settings.split(","):
        teacher = load_pretrained(tdir, head="sequence_classification", **adapter.head_config()).eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
        spec = "layers:0,2,4" if setting == "kd" else "4L-312H-12A-1200I"
        method = "kd" if setting == "kd" else "tinybert"
        student = build_student(spec, teacher, head="sequence_classification", head_config=adapter.head_config())
        terms = build_terms(method_terms(method, "task"), student.config.num_hidden_layers,
                            teacher.config.num_hidden_layers, alpha=1.0)
        tmpd = tempfile.TemporaryDirectory(prefix="bench_distill_")
        tmp = Path(tmpd.name)
        teacher.save_pretrained(tmp / "t", tokenizer_dir=tdir)
        student.save_pretrained(tmp / "s", tokenizer_dir=tdir)
        attn = "eager" if setting == "tinybert" else "sdpa"
        hf_t = AutoModelForSequenceClassification.from_pretrained(tmp / "t", attn_implementation=attn).eval()
        hf_s = AutoModelForSequenceClassification.from_pretrained(tmp / "s", attn_implementation=attn).train()
        for p in hf_t.parameters():
            p.requires_grad_(False)

        live = Distiller(student, [teacher], terms).train()
        cached_student = build_student(str(tmp / "s"), teacher, head="sequence_classification",
                                       head_config=adapter.head_config())
        cached = Distiller(cached_student, [teacher], terms).train()
        cached.cache = TeacherCache(tmp / "cache", n, cached.cache_shapes(args.max_seq_len), {"bench": 1})
        t0 = time.perf_counter()
        with torch.no_grad():
            for b in batches:  # epoch 1 fills the cache
                cached.cache.write(b["example_index"], cached.teacher_features(
                    b["input_ids"], b["attention_mask"], b["token_type_ids"]), b["attention_mask"].sum(1))
        fill_s = time.perf_counter() - t0

        # the TextBrewer-style reference: HF teacher + HF student, projections as in the Distiller
        proj = torch.nn.ModuleDict({k: torch.nn.Linear(v.in_features, v.out_features) for k, v in live.proj.items()})
        opt_ref = torch.optim.AdamW(list(hf_s.parameters()) + list(proj.parameters()), lr=1e-4)
        opt_live = torch.optim.AdamW([p for p in live.parameters() if p.requires_grad], lr=1e-4)
        opt_cached = torch.optim.AdamW([p for p in cached.parameters() if p.requires_grad], lr=1e-4)
        wants = {"output_hidden_states": setting == "tinybert", "output_attentions": setting == "tinybert"}

        def ref_step(b):
            with torch.no_grad():
                to = hf_t(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                          token_type_ids=b["token_type_ids"], **wants)
            so = hf_s(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                      token_type_ids=b["token_type_ids"], **wants)
            from bertforge.distillation import losses as L
            loss = 0.0
            for term in terms:
                if term.spec.feature == "logits":
                    loss = loss + term.spec.fn(so.logits, to.logits, temperature=term.temperature)
                    continue
                for s, t in term.pairs:
                    if term.spec.feature == "hidden":
                        key = f"{term.name}_{s}_{t}"
                        loss = loss + term.spec.fn(so.hidden_states[s], to.hidden_states[t], b["attention_mask"],
                                                   proj=proj[key] if key in proj else None)
                    else:
                        loss = loss + L.attention_mse_loss(so.attentions[s - 1], to.attentions[t - 1],
                                                           b["attention_mask"])
            loss.backward()
            opt_ref.step()
            opt_ref.zero_grad(set_to_none=True)

        def ours(model, opt):
            def step(b):
                model(**b).loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            return step

        loops = {"ref": ref_step, "live": ours(live, opt_live), "cached": ours(cached, opt_cached)}
        times = {k: [] for k in loops}
        cpu = {k: [] for k in loops}
        for k, f in loops.items():  # warm-up
            f(batches[0])
        for b in batches:
            for k, f in loops.items():
                t0, c0 = time.perf_counter(), time.process_time()
                f(b)
                times[k].append(time.perf_counter() - t0)
                cpu[k].append(time.process_time() - c0)
        eps = {k: args.batch_size / statistics.median(v) for k, v in times.items()}
        eps_cpu = {k: args.batch_size / statistics.median(v) for k, v in cpu.items()}
        lines.append(f"[{setting}] student {spec} ({sum(p.numel() for p in student.parameters()) / 1e6:.1f}M params), "
                     f"teacher {sum(p.numel() for p in teacher.parameters()) / 1e6:.1f}M; "
                     f"cache fill (epoch 1 teacher pass) {n / fill_s:.1f} ex/s")
        for k in loops:
            lines.append(f"  {k:7s} {eps[k]:8.1f} examples/s wall (median step {statistics.median(times[k]) * 1000:.0f} ms)"
                         f"   {eps_cpu[k]:8.1f} examples per CPU-second")
        lines.append(f"  ratio cached / ref (TextBrewer-style) = {eps['cached'] / eps['ref']:.2f}x wall, "
                     f"{eps_cpu['cached'] / eps_cpu['ref']:.2f}x CPU; cached / live = {eps['cached'] / eps['live']:.2f}x wall, "
                     f"{eps_cpu['cached'] / eps_cpu['live']:.2f}x CPU")
        print("\n".join(lines[-5:]))
        sys.stdout.flush()
        del cached, live
        tmpd.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
