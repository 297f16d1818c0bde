"""ModernBERT on CPU: bertforge's unpadded forward vs its padded forward, and bertforge's MLM training step vs
``transformers``' ``ModernBertForMaskedLM`` step — one run, one shape, FP32, the same threads for every model.

Shape (ModernBERT layout, small): hidden 256, 6 layers (global attention at layers 0 and 3, local ±64 =
``local_attention`` 128 elsewhere), 4 heads, GeGLU 384, vocab 30522 (the MiniLM WordPiece tokenizer), no
dropout. Batches: 32 examples drawn at random from SST-2 (train sentences) and SQuAD v1.1 (dev question +
context, truncated to 256 tokens), each batch padded to its longest example: ``sst2`` (SST-2 only), ``squad``
(SQuAD only) and ``mixed`` (each example from either with probability ½).

1. Forward (inference, ``torch.no_grad``): the same model with ``encoder.unpad = True`` (linear layers, norms
   and GeGLU on the N real tokens; Q/K/V scattered to (B, T) for the attention product) vs ``False`` (every
   position). Tokens/s counts real tokens.
2. MLM training step (forward + backward + AdamW) on the ``mixed`` batches, 30% of the real tokens selected
   (80/10/10), the same batches and the same initial weights on both sides: ours = ``TaskModel(head="mlm")``
   as the Trainer prepares it (``impl.kernels=auto``, its fused AdamW); reference =
   ``ModernBertForMaskedLM`` (sdpa attention, default config: logits at every position) + torch AdamW(fused).
   The reference is also timed with ``sparse_prediction=True`` (its head on the masked rows only), reported,
   not the goal line.

Interleaved rounds (ours, reference, ours, …); the median of each is reported with the spread of the ratio
within each round. Usage: python benchmarks/bench_modernbert.py [--threads 2] [--rounds 5] [--iters 3]
Writes benchmarks/results/modernbert.txt (the command at the top).
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

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("BERTFORGE_DATA", ROOT.parent / "shared" / "data"))
B, MAX_LEN, H, L, NH, FF, WINDOW = 32, 256, 256, 6, 4, 384, 128
MASK_RATE = 0.3


def texts():
    sst = [line.split("\t")[0] for line in (DATA / "glue" / "SST-2" / "train.tsv").read_text().splitlines()[1:]]
    squad = json.loads((DATA / "squad" / "dev-v1.1.json").read_text())["data"]
    pairs = [(qa["question"], p["context"]) for art in squad for p in art["paragraphs"] for qa in p["qas"]]
    return sst, pairs


def batches(tok, kind: str, n: int, seed: int):
    from bertforge.tokenizer import encode_texts
    sst, pairs = texts()
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        a, b = [], []
        for _ in range(B):
            use_sst = kind == "sst2" or (kind == "mixed" and rng.random() < 0.5)
            if use_sst:
                a.append((sst[rng.integers(len(sst))], None))
            else:
                q, c = pairs[rng.integers(len(pairs))]
                a.append((q, c))
        encs = [encode_texts(tok, [x], [y] if y is not None else None, max_length=MAX_LEN)[0] for x, y in a]
        t = max(len(e.ids) for e in encs)
        ids = torch.zeros(B, t, dtype=torch.long)
        mask = torch.zeros(B, t, dtype=torch.long)
        for i, e in enumerate(encs):
            ids[i, :len(e.ids)] = torch.tensor(e.ids)
            mask[i, :len(e.ids)] = 1
        out.append((ids, mask))
    return out


def masked(ids, mask, seed, vocab, mask_id, special=(0, 100, 101, 102, 103)):
    """30% of the real, non-special tokens → labels; of those 80% [MASK], 10% random, 10% kept."""
    g = torch.Generator().manual_seed(seed)
    cand = mask.bool() & ~torch.isin(ids, torch.tensor(special))
    sel = cand & (torch.rand(ids.shape, generator=g) < MASK_RATE)
    labels = torch.where(sel, ids, torch.full_like(ids, -100))
    r = torch.rand(ids.shape, generator=g)
    x = ids.clone()
    x[sel & (r < 0.8)] = mask_id
    rand = sel & (r >= 0.8) & (r < 0.9)
    x[rand] = torch.randint(1000, vocab, (int(rand.sum()),), generator=g)
    return x, labels


def config(vocab):
    from bertforge.config import ModelConfig
    return ModelConfig(model_type="modernbert", vocab_size=vocab, hidden_size=H, num_hidden_layers=L,
                       num_attention_heads=NH, intermediate_size=FF, max_position_embeddings=512,
                       local_attention=WINDOW, type_vocab_size=0, add_pooling_layer=False, layer_norm_eps=1e-5,
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def timed(fn, items, iters):
    t0 = time.perf_counter()
    for k in range(iters):
        fn(items[k % len(items)])
    return (time.perf_counter() - t0) / iters


def interleave(fns: dict, items, iters, rounds):
    """{name: fn}: each timed per round in turn → {name: [seconds per call per round]}."""
    for fn in fns.values():
        fn(items[0])  # warm-up
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            times[k].append(timed(fn, items, iters))
    return times


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--result", default=str(ROOT / "benchmarks" / "results" / "modernbert.txt"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import transformers
    transformers.logging.set_verbosity_error()
    from bertforge.hardware import cpu_flags
    from bertforge.checkpoint import resolve_model_dir
    from bertforge.engine.kernels import apply_kernels
    from bertforge.engine.kernels.allocator import keep_freed_memory
    from bertforge.task_model import TaskModel
    from bertforge.tokenizer import load_tokenizer
    from bertforge.engine.train.optim import make_optimizer
    kept = keep_freed_memory()  # as the bertforge Trainer does on CPU; process-wide, so for both sides
    tok = load_tokenizer(resolve_model_dir("minilm"))
    vocab, mask_id = tok.get_vocab_size(), tok.token_to_id("[MASK]")
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
    flags = set(cpu_flags())
    lines = [f"# python benchmarks/bench_modernbert.py {' '.join(sys.argv[1:])}",
             f"torch {torch.__version__}, transformers {transformers.__version__}, FP32, threads "
             f"{torch.get_num_threads()}, CPU flags: {' '.join(f for f in wanted if f in flags)}; load average "
             f"{os.getloadavg()[0]:.1f} at start (shared host: other jobs ran beside this one)",
             f"shape: ModernBERT hidden {H}, {L} layers (global every 3, local window {WINDOW}), {NH} heads, GeGLU "
             f"{FF}, vocab {vocab}; batch {B}, examples truncated to {MAX_LEN} tokens, padded to each batch's "
             f"longest; {a.rounds} rounds × {a.iters} calls, median; glibc keeps freed memory: {kept}", ""]
    print("\n".join(lines), flush=True)
    torch.manual_seed(0)
    ok = True

    # 1. forward: unpadded vs padded, the same model and batches
    model = apply_kernels(TaskModel(config(vocab)).eval(), "auto")
    for kind in ("sst2", "squad", "mixed"):
        items = batches(tok, kind, 6, seed=1)
        real = sum(int(m.sum()) for _, m in items) / len(items)
        padded = sum(m.numel() for _, m in items) / len(items)

        def fwd(unpad):
            def run(item):
                model.encoder.unpad = unpad
                with torch.no_grad():
                    model(*item)
            return run
        t = interleave({"unpadded": fwd(True), "padded": fwd(False)}, items, a.iters, a.rounds)
        mu, mp = statistics.median(t["unpadded"]), statistics.median(t["padded"])
        per = [p / u for u, p in zip(t["unpadded"], t["padded"])]
        ratio = mp / mu
        line = (f"forward {kind:<6} real tokens {real / padded:4.0%} of {padded / B:5.1f}×{B}: unpadded "
                f"{real / mu:8.0f} tok/s ({mu * 1e3:6.1f} ms) | padded {real / mp:8.0f} tok/s ({mp * 1e3:6.1f} ms) | "
                f"ratio {ratio:4.2f}x (per round {min(per):.2f}-{max(per):.2f}x)"
                + ("  goal ≥1.5x: " + ("met" if ratio >= 1.5 else "NOT met") if kind == "mixed" else ""))
        ok &= kind != "mixed" or ratio >= 1.5
        print(line, flush=True)
        lines.append(line)
    model.encoder.unpad = True

    # 2. MLM training step vs transformers' ModernBertForMaskedLM, same weights, same batches
    items = [masked(ids, m, s, vocab, mask_id) + (m,) for s, (ids, m) in enumerate(batches(tok, "mixed", 6, 2))]
    real = sum(int(m.sum()) for *_, m in items) / len(items)
    torch.manual_seed(0)
    ours = TaskModel(config(vocab), head="mlm")
    with tempfile.TemporaryDirectory() as d:
        ours.save_pretrained(d)
        refs = {"transformers": transformers.ModernBertForMaskedLM.from_pretrained(d, attn_implementation="sdpa"),
                "transformers sparse": transformers.ModernBertForMaskedLM.from_pretrained(
                    d, attn_implementation="sdpa", sparse_prediction=True)}
    ours = apply_kernels(ours.train(), "auto")
    opt = make_optimizer(ours, lr=1e-4, weight_decay=0.01)

    def ours_step(item):
        x, labels, m = item
        ours(x, m, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def ref_step(model):
        model.train()
        o = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)

        def step(item):
            x, labels, m = item
            model(input_ids=x, attention_mask=m, labels=labels).loss.backward()
            o.step()
            o.zero_grad(set_to_none=True)
        return step
    # first step: the same loss on both sides (same weights, same batch)
    with torch.no_grad():
        x, labels, m = items[0]
        l_ours = float(ours(x, m, labels=labels).loss)
        l_ref = float(refs["transformers"](input_ids=x, attention_mask=m, labels=labels).loss)
    line = f"MLM loss of the first batch, same weights: bertforge {l_ours:.6f} | transformers {l_ref:.6f}"
    print(line, flush=True)
    lines.append(line)
    t = interleave({"ours": ours_step, **{k: ref_step(v) for k, v in refs.items()}}, items, a.iters, a.rounds)
    mo = statistics.median(t["ours"])
    for k in refs:
        mr = statistics.median(t[k])
        per = [r / o for o, r in zip(t["ours"], t[k])]
        goal = k == "transformers"
        line = (f"MLM step mixed (30% masked): bertforge {real / mo:7.0f} tok/s ({mo * 1e3:6.1f} ms) | "
                f"{k + (' (default)' if goal else ' (sparse_prediction=True)')} {real / mr:7.0f} tok/s "
                f"({mr * 1e3:6.1f} ms) | ratio {mr / mo:4.2f}x (per round {min(per):.2f}-{max(per):.2f}x)"
                + (("  goal ≥1.5x: " + ("met" if mr / mo >= 1.5 else "NOT met")) if goal else ""))
        ok &= not goal or mr / mo >= 1.5
        print(line, flush=True)
        lines.append(line)
    Path(a.result).parent.mkdir(parents=True, exist_ok=True)
    Path(a.result).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
