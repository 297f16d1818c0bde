"""Pretraining step throughput: bertforge vs the ``transformers`` reference, same machine, same run.

1. MLM step (BERT shape: 4 layers, hidden 256, 4 heads, FFN 1024, seq 128, batch 32, vocab 30522):
   ours = PretrainCollator (dynamic 15% / 80-10-10) + TaskModel(head="mlm", sparse tied decoder, last
   block at the masked rows only) + AdamW; reference = DataCollatorForLanguageModeling + BertForMaskedLM (sdpa) + AdamW.
2. ELECTRA step (hidden 256, embedding 128, 4 heads, generator ¼ → hidden 64, 4 layers, seq 128, batch
   32): ours = ElectraPretrainModel; reference = ElectraForMaskedLM + ElectraForPreTraining with shared
   word embeddings, sampling at the masked positions, loss = MLM + 50·RTD.
Ours runs in three forms, each timed against the same reference steps: with the CPU kernels
(``impl.kernels=cpu``, what the Trainer picks on a CPU; the goal lines are for this form), the plain PyTorch
modules (``impl.kernels=none``) and the plain modules under ``torch.compile`` (``impl.compile=true``; the
first, compiling step is a warm-up and not timed). ``--variants`` picks which.
Optimizer: ours = the bertforge Trainer's AdamW (fused kernel); reference = torch AdamW(fused=True), which is
what transformers' Trainer uses by default (optim="adamw_torch_fused").
Allocator: the process runs with the glibc ``malloc`` settings the bertforge Trainer applies on CPU
(``impl.keep_freed_memory``, bertforge/engine/kernels/allocator.py: freed blocks up to 32 MiB stay in the process);
they are process-wide, so the reference steps run under them too.
Both in FP32 and bf16 autocast. Interleaved rounds (ours, reference, ours, …); the median step time
of each is reported, with tokens/s = batch·seq / step time and the ratio ours/reference.

Model FLOPs utilisation: analytic training FLOPs of each step (3 × forward matmul FLOPs: QKV/out/FFN
projections, QKᵀ and AV, the MLM transform and decoder for the positions each implementation computes)
÷ step time ÷ the machine's measured peak (best of square matmuls, same dtype and threads).

Usage: python benchmarks/bench_pretrain.py [--iters 3] [--rounds 3] [--threads N] [--variants cpu,none,compiled]
Writes benchmarks/results/bench_pretrain.txt.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
B, T, V, H, L, NH, FF = 32, 128, 30522, 256, 4, 4, 1024
#: our forms: label printed, impl.kernels, torch.compile
VARIANTS = {"cpu": ("ours", "cpu", False), "none": ("plain", "none", False),
            "compiled": ("compiled", "none", True)}


def cpu_flags() -> str:
    """The CPU's model name and the instruction-set flags that matter for these GEMMs."""
    name, flags = platform.processor() or platform.machine(), set()
    if os.path.exists("/proc/cpuinfo"):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and name in ("", platform.machine()):
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
    return f"CPU {name}; flags: {' '.join(f for f in wanted if f in flags) or '(none of ' + ', '.join(wanted) + ')'}"


def autocast(dtype):
    return torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else contextlib.nullcontext()


def matmul_peak(dtype: str, n: int = 2048, reps: int = 5) -> float:
    """Best-of-``reps`` FLOP/s of an n×n×n matmul in ``dtype`` (the machine's practical peak)."""
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    a, b = torch.randn(n, n, dtype=dt), torch.randn(n, n, dtype=dt)
    a @ b
    best = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(3):
            a @ b
        best = max(best, 3 * 2 * n ** 3 / (time.perf_counter() - t0))
    return best


def encoder_fwd_flops(h, layers, ff, tokens, t):
    per_tok = 2 * (4 * h * h + 2 * h * ff) + 2 * 2 * t * h
    return layers * per_tok * tokens


def rows_saving(h, ff, tokens, t, n_pred):
    """Forward FLOPs the last block does not spend when it runs only at the n_pred masked rows (queries,
    output projection, FFN and QKᵀ/AV for n_pred instead of all tokens; keys/values for all)."""
    per_row = 2 * (2 * h * h + 2 * h * ff) + 2 * 2 * t * h
    return per_row * (tokens - n_pred)


def mlm_flops(h, e, v, n_pred):
    return 2 * (h * e + e * v) * n_pred


def items(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(B):
        ids = np.concatenate([[101], rng.integers(1000, V, T - 2), [102]])
        out.append({"input_ids": ids, "token_type_ids": np.zeros(T, np.int64), "word_starts": np.ones(T, np.uint8)})
    return out


def hf_collator():
    import transformers
    from bertforge.checkpoint.modeldir import resolve_model_dir
    tok = transformers.AutoTokenizer.from_pretrained(str(resolve_model_dir("minilm")))
    assert len(tok) == V
    return transformers.DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.15)


def ours_mlm():
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    from bertforge.objectives.collate import PretrainCollator
    cfg = ModelConfig(model_type="bert", vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=NH,
                      intermediate_size=FF, max_position_embeddings=T, add_pooling_layer=False)
    model = TaskModel(cfg, head="mlm").train()
    coll = PretrainCollator(0, 103, [0, 100, 101, 102, 103], V, pad_to_multiple_of=None)
    its = items()
    return model, lambda: coll(its)


def hf_mlm():
    import transformers
    cfg = transformers.BertConfig(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=NH,
                                  intermediate_size=FF, max_position_embeddings=T)
    model = transformers.BertForMaskedLM(cfg).train()
    coll = hf_collator()
    its = [{"input_ids": x["input_ids"].tolist()} for x in items()]
    return model, lambda: coll(its)


def ours_electra():
    from bertforge.config import ModelConfig
    from bertforge.objectives.collate import PretrainCollator
    from bertforge.objectives.electra import ElectraPretrainModel
    cfg = ModelConfig(model_type="electra", vocab_size=V, hidden_size=H, embedding_size=128, num_hidden_layers=L,
                      num_attention_heads=NH, intermediate_size=FF, max_position_embeddings=T,
                      add_pooling_layer=False)
    model = ElectraPretrainModel(cfg).train()
    coll = PretrainCollator(0, 103, [0, 100, 101, 102, 103], V, pad_to_multiple_of=None)
    its = items()
    return model, lambda: coll(its)


class HFElectra(torch.nn.Module):
    """The reference loop as a module: generator (full-vocab logits) → sample → discriminator."""

    def __init__(self):
        super().__init__()
        import transformers
        d = transformers.ElectraConfig(vocab_size=V, embedding_size=128, hidden_size=H, num_hidden_layers=L,
                                       num_attention_heads=NH, intermediate_size=FF, max_position_embeddings=T)
        g = transformers.ElectraConfig(vocab_size=V, embedding_size=128, hidden_size=H // 4, num_hidden_layers=L,
                                       num_attention_heads=1, intermediate_size=FF // 4, max_position_embeddings=T)
        self.gen = transformers.ElectraForMaskedLM(g)
        self.disc = transformers.ElectraForPreTraining(d)
        self.gen.electra.embeddings = self.disc.electra.embeddings  # shared embeddings (ELECTRA §3.1)
        self.gen.generator_lm_head.weight = self.disc.electra.embeddings.word_embeddings.weight

    def forward(self, input_ids, attention_mask, labels, **_):
        g = self.gen(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        with torch.no_grad():
            sel = labels != -100
            probs = torch.softmax(g.logits[sel].float(), -1)
            sampled = torch.multinomial(probs, 1).squeeze(-1)
            original = torch.where(sel, labels, input_ids)
            corrupted = original.clone()
            corrupted[sel] = sampled
            rtd = (corrupted != original).long()
        d = self.disc(input_ids=corrupted, attention_mask=attention_mask, labels=rtd)
        return g.loss + 50.0 * d.loss


def prepared(model, kernels: str, compile_: bool):
    """``model`` as the Trainer prepares it for ``impl.kernels`` / ``impl.compile``: (module to call, module
    whose parameters the optimizer steps)."""
    from bertforge.engine.kernels import apply_kernels
    apply_kernels(model, kernels)
    return (torch.compile(model) if compile_ else model), model


def step_fn(model, make_batch, dtype, electra_ref=False, params_of=None):
    if electra_ref or not type(params_of or model).__module__.startswith("bertforge"):
        # the reference: torch AdamW as transformers' Trainer builds it by default (optim="adamw_torch_fused")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    else:  # ours: the optimizer the bertforge Trainer builds
        from bertforge.engine.train.optim import make_optimizer
        opt = make_optimizer(params_of or model, lr=1e-4, weight_decay=0.01)

    def step():
        batch = make_batch()
        batch = dict(batch)
        with autocast(dtype):
            if electra_ref:
                loss = model(**batch)
            else:
                out = model(**batch)
                loss = out.loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())
    return step


def time_steps(step, iters):
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    return (time.perf_counter() - t0) / iters


def compare(name, ours, ref, dtype, iters, rounds, flops_ours, flops_ref, peak, lines, variants):
    """Time each of our ``variants`` and the reference, interleaved round by round; print one line per
    variant (the first, ``cpu``, in the format of the goal lines). ``ours``: a function building a fresh
    (model, make_batch); ``flops_ours``: {variant: training FLOPs per step}. Returns {variant: ratio}."""
    torch.manual_seed(0)
    steps = {}
    for v in variants:
        model, make_batch = ours()
        call, params = prepared(model, *VARIANTS[v][1:])
        steps[v] = step_fn(call, make_batch, dtype, params_of=params)
    sr = step_fn(*ref, dtype, electra_ref=name.startswith("ELECTRA"))
    for st in (*steps.values(), sr):
        st()  # warm-up (and, compiled, the compilation)
    times = {v: [] for v in variants}
    tr = []
    for _ in range(rounds):
        for v in variants:
            times[v].append(time_steps(steps[v], iters))
        tr.append(time_steps(sr, iters))
    mr = statistics.median(tr)
    tok = B * T
    ratios = {}
    for v in variants:
        mo = statistics.median(times[v])
        label = VARIANTS[v][0]
        line = (f"{name:<8} {dtype:<5} {label:<8} {tok / mo:9.0f} tok/s ({mo * 1e3:7.1f} ms/step, MFU "
                f"{100 * flops_ours[v] / mo / peak:5.1f}%) | transformers {tok / mr:9.0f} tok/s ({mr * 1e3:7.1f} ms/step, "
                f"MFU {100 * flops_ref / mr / peak:5.1f}%) | ratio {mr / mo:5.2f}x")
        per_round = [r / o for r, o in zip(tr, times[v])]  # ratio within each interleaved round
        line += f" (per round {min(per_round):.2f}-{max(per_round):.2f}x)"
        if v != "cpu":
            line += f"  [{'impl.kernels=none + torch.compile' if VARIANTS[v][2] else 'impl.kernels=none'}]"
        print(line, flush=True)
        lines.append(line)
        ratios[v] = mr / mo
    return ratios


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--emulated-bf16", action="store_true",
                    help="time bf16 even on a CPU without native bf16: both sides then run PyTorch's emulated bf16 "
                         "GEMMs (~1-2 GFLOP/s on an AVX2 CPU; MLM + ELECTRA take ~10 min with --iters 1 --rounds 1)")
    ap.add_argument("--variants", default="cpu,none,compiled",
                    help="our forms to time: cpu (impl.kernels=cpu; the goal lines), none (plain PyTorch), "
                         "compiled (plain PyTorch under torch.compile)")
    ap.add_argument("--result", default=str(ROOT / "benchmarks" / "results" / "bench_pretrain.txt"))
    a = ap.parse_args()
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    if not variants or any(v not in VARIANTS for v in variants):
        ap.error(f"--variants: choose from {', '.join(VARIANTS)}")
    if a.threads:
        torch.set_num_threads(a.threads)
    from bertforge.engine.kernels.allocator import keep_freed_memory
    kept = keep_freed_memory()  # as the bertforge Trainer does on CPU; process-wide, so for both sides
    import transformers
    transformers.logging.set_verbosity_error()
    lines = [f"torch {torch.__version__}, transformers {transformers.__version__}, threads "
             f"{torch.get_num_threads()}, CPU; batch {B} × seq {T}, vocab {V}; {a.rounds} rounds × {a.iters} steps, median; "
             f"glibc malloc keeps freed memory (both sides): {'yes' if kept else 'no (not glibc)'}", cpu_flags()]
    print("\n".join(lines), flush=True)
    tokens = B * T
    n_pred = int(0.15 * tokens)
    enc = encoder_fwd_flops(H, L, FF, tokens, T)
    f_ours_mlm = 3 * (enc - rows_saving(H, FF, tokens, T, n_pred) + mlm_flops(H, H, V, n_pred))
    f_plain_mlm = 3 * (enc + mlm_flops(H, H, V, n_pred))  # plain modules: the last block at every position
    f_ref_mlm = 3 * (enc + mlm_flops(H, H, V, tokens))
    hg = H // 4
    enc_g = encoder_fwd_flops(hg, L, FF // 4, tokens, T)
    emb_proj = 2 * 128 * (H + hg) * tokens
    disc_head = 2 * (H * H + H) * tokens
    f_ours_el = 3 * (enc + enc_g - rows_saving(hg, FF // 4, tokens, T, n_pred) + emb_proj + disc_head) \
        + 3 * mlm_flops(hg, 128, V, n_pred)
    f_plain_el = 3 * (enc + enc_g + emb_proj + disc_head) + 3 * mlm_flops(hg, 128, V, n_pred)
    f_ref_el = 3 * (enc + enc_g + emb_proj + disc_head) + 3 * mlm_flops(hg, 128, V, tokens)
    fl_mlm = {v: f_ours_mlm if v == "cpu" else f_plain_mlm for v in VARIANTS}
    fl_el = {v: f_ours_el if v == "cpu" else f_plain_el for v in VARIANTS}
    ratios = {}
    from bertforge.engine.train.precision import native_bf16
    for dtype in a.dtypes.split(","):
        emulated = dtype == "bf16" and not native_bf16("cpu")
        if emulated and not a.emulated_bf16:  # emulated bf16 GEMMs: ~100x slower, both sides
            lines.append("bf16: skipped — this CPU has no native bf16 (avx512_bf16/amx_bf16); its emulated bf16 "
                         "matmuls are ~100x slower than FP32 on both sides (bertforge/engine/train/precision.py); "
                         "--emulated-bf16 times them anyway")
            print(lines[-1], flush=True)
            continue
        n = 1024 if emulated else 2048  # an emulated 2048³ bf16 matmul takes ~15 s (512³ reads too low a peak)
        peak = matmul_peak(dtype, n=n)
        lines.append(f"measured matmul peak ({dtype}, {n}³): {peak / 1e9:.1f} GFLOP/s"
                     + (" — emulated bf16 (no native bf16 on this CPU), both sides" if emulated else ""))
        print(lines[-1], flush=True)
        ratios[("MLM", dtype)] = compare("MLM", ours_mlm, hf_mlm(), dtype, a.iters, a.rounds,
                                         fl_mlm, f_ref_mlm, peak, lines, variants)
        ratios[("ELECTRA", dtype)] = compare("ELECTRA", ours_electra, (HFElectra().train(), ours_electra()[1]),
                                             dtype, a.iters, a.rounds, fl_el, f_ref_el, peak, lines, variants)
    lines.append("")
    lines.append(f"model FLOPs per step: MLM ours {f_ours_mlm / 1e9:.1f} G (sparse head, {n_pred} predictions) vs "
                 f"reference {f_ref_mlm / 1e9:.1f} G (all {tokens} positions; ours also runs its last block "
                 f"at the masked rows only); ELECTRA ours {f_ours_el / 1e9:.1f} G vs "
                 f"reference {f_ref_el / 1e9:.1f} G")
    for (k, d), rs in ratios.items():
        goal = 4.0 if k == "MLM" else 2.0
        if "cpu" in rs:
            lines.append(f"{k} {d}: {rs['cpu']:.2f}x (goal ≥ {goal}x: {'met' if rs['cpu'] >= goal else 'not met'})")
        others = [f"{VARIANTS[v][0]} {r:.2f}x" for v, r in rs.items() if v != "cpu"]
        if others:
            lines.append(f"{k} {d}, no goal: " + ", ".join(others))
    text = "\n".join(lines) + "\n"
    Path(a.result).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
