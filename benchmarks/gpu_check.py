"""GPU check: bertforge's MLM and ELECTRA pretraining steps against `transformers` on a CUDA device.

For each of {MLM (BERT shape), ELECTRA (generator ¼ + discriminator, λ = 50)} × {FP32, bf16 autocast} ×
{eager, torch.compile}: tokens/s (median of rounds) and peak CUDA memory of bertforge's step and of the
`transformers` reference step (BertForMaskedLM; ElectraForMaskedLM + ElectraForPreTraining with shared
embeddings), same batch, same optimizer (torch AdamW, fused). bertforge runs with ``impl.kernels=auto``,
which on a GPU is the plain PyTorch path (the CPU kernels are for CPUs only), so this is also the check that
the plain path compiles and runs on CUDA.

Without a CUDA device it prints that and exits 0 (nothing to measure). Results are appended to
benchmarks/results/gpu_check.txt.

    python benchmarks/gpu_check.py [--rounds 3] [--iters 5] [--batch 32] [--seq 128]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
V, H, L, NH, FF, E = 30522, 256, 4, 4, 1024, 128


def batch_items(b: int, t: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [{"input_ids": np.concatenate([[101], rng.integers(1000, V, t - 2), [102]]),
             "token_type_ids": np.zeros(t, np.int64), "word_starts": np.ones(t, np.uint8)} for _ in range(b)]


def ours(kind: str, t: int):
    from bertforge.config import ModelConfig
    from bertforge.objectives.electra import ElectraPretrainModel
    from bertforge.task_model import TaskModel
    cfg = ModelConfig(model_type="bert" if kind == "MLM" else "electra", vocab_size=V, hidden_size=H,
                      embedding_size=H if kind == "MLM" else E, num_hidden_layers=L, num_attention_heads=NH,
                      intermediate_size=FF, max_position_embeddings=t, add_pooling_layer=False)
    return TaskModel(cfg, head="mlm") if kind == "MLM" else ElectraPretrainModel(cfg)


class HFElectra(torch.nn.Module):
    """Reference ELECTRA step: generator → sample at the masked positions → discriminator; MLM + 50·RTD."""

    def __init__(self, t: int):
        super().__init__()
        import transformers
        kw = dict(vocab_size=V, embedding_size=E, num_hidden_layers=L, max_position_embeddings=t)
        self.gen = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
            hidden_size=H // 4, num_attention_heads=1, intermediate_size=FF // 4, **kw))
        self.disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(
            hidden_size=H, num_attention_heads=NH, intermediate_size=FF, **kw))
        self.gen.electra.embeddings = self.disc.electra.embeddings
        self.gen.generator_lm_head.weight = self.disc.electra.embeddings.word_embeddings.weight

    def forward(self, input_ids, attention_mask, labels, **_):
        g = self.gen(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        with torch.no_grad():
            sel = labels != -100
            sampled = torch.multinomial(torch.softmax(g.logits[sel].float(), -1), 1).squeeze(-1)
            original = torch.where(sel, labels, input_ids)
            corrupted = original.clone()
            corrupted[sel] = sampled
        d = self.disc(input_ids=corrupted, attention_mask=attention_mask, labels=(corrupted != original).long())
        return g.loss + 50.0 * d.loss


def reference(kind: str, t: int):
    import transformers
    if kind == "MLM":
        return transformers.BertForMaskedLM(transformers.BertConfig(
            vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=NH, intermediate_size=FF,
            max_position_embeddings=t, attn_implementation="sdpa"))
    return HFElectra(t)


def measure(model, batch: dict, dtype: str, compiled: bool, rounds: int, iters: int) -> tuple:
    """Median seconds per step and peak memory (bytes) of forward + backward + AdamW on ``batch``."""
    dev = torch.device("cuda")
    model = model.to(dev).train()
    if type(model).__module__.startswith("bertforge"):  # as the Trainer does: impl.kernels=auto (plain on a GPU)
        from bertforge.engine.kernels import apply_kernels
        model = apply_kernels(model, "auto")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    fwd = torch.compile(model) if compiled else model
    batch = {k: v.to(dev) for k, v in batch.items()}
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dtype == "bf16" else contextlib.nullcontext()

    def step():
        with amp:
            out = fwd(**batch)
            loss = out if torch.is_tensor(out) else out.loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):  # warm-up (and compilation)
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times), torch.cuda.max_memory_allocated(), (min(times), max(times))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--result", default=str(ROOT / "benchmarks" / "results" / "gpu_check.txt"))
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device on this machine — nothing to measure (run it where one is lent)")
        return 0
    import transformers
    from bertforge.objectives.collate import PretrainCollator
    transformers.logging.set_verbosity_error()
    coll = PretrainCollator(0, 103, [0, 100, 101, 102, 103], V, pad_to_multiple_of=None)
    tok = a.batch * a.seq
    lines = [f"# {time.strftime('%Y-%m-%d %H:%M')} {torch.cuda.get_device_name()}; torch {torch.__version__}, "
             f"transformers {transformers.__version__}; batch {a.batch} x seq {a.seq}; {a.rounds} rounds x {a.iters} steps"]
    print(lines[0], flush=True)
    for kind in ("MLM", "ELECTRA"):
        for dtype in ("fp32", "bf16"):
            for compiled in (False, True):
                torch.manual_seed(0)
                b = coll(batch_items(a.batch, a.seq))
                row = []
                for name, build in (("bertforge", ours), ("transformers", reference)):
                    try:
                        s, mem, (lo, hi) = measure(build(kind, a.seq), dict(b), dtype, compiled, a.rounds, a.iters)
                        row.append((name, s, mem))
                        cell = f"{name} {tok / s:10.0f} tok/s ({tok / hi:.0f}-{tok / lo:.0f}) peak {mem / 2**20:7.0f} MiB"
                    except Exception as e:  # a failure of one cell is a result too
                        cell = f"{name} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
                    line = f"{kind:<8}{dtype:<5}{'compiled' if compiled else 'eager':<9} {cell}"
                    print(line, flush=True)
                    lines.append(line)
                    torch.cuda.empty_cache()
                if len(row) == 2:
                    lines.append(f"{kind:<8}{dtype:<5}{'compiled' if compiled else 'eager':<9} ratio bertforge/transformers "
                                 f"{row[1][1] / row[0][1]:.2f}x tokens/s, {row[0][2] / row[1][2]:.2f}x memory")
                    print(lines[-1], flush=True)
    with open(a.result, "a") as f:
        f.write("\n".join(lines) + "\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
