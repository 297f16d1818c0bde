"""Fine-tuning throughput: bertforge vs `transformers` BertForSequenceClassification, same run.

Both models start from the same MiniLM-L6-H384 weights and train on the same SST-2 batches (first
N training sentences, max length 64, batch 32, dynamic padding by the same collator), with the same
optimizer (torch AdamW, lr 5e-5) and precision. Rounds of K steps alternate between the two so that
any background load hits both alike. Prints examples/s of each and the ratio, FP32 and bf16 autocast.

    python benchmarks/bench_finetune.py [--steps 40] [--rounds 4]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bertforge.tasks import adapter_for  # noqa: E402
from bertforge.checkpoint.modeldir import resolve_model_dir  # noqa: E402
from bertforge.tasks import get_task  # noqa: E402
from bertforge.checkpoint import load_pretrained  # noqa: E402
from bertforge.tokenizer import load_tokenizer  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared/data/glue/SST-2/train.tsv"


def make_batches(n_batches: int, batch_size: int, max_len: int):
    model_dir = resolve_model_dir("minilm")
    tok = load_tokenizer(model_dir)
    adapter = adapter_for(get_task("sst2"), tok, max_len)
    data = adapter.load(DATA, n_batches * batch_size)
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(data), generator=g).tolist()
    collate = adapter.collator()
    return [collate([data[i] for i in order[k * batch_size:(k + 1) * batch_size]])
            for k in range(n_batches)], model_dir


class Runner:
    def __init__(self, name, model, autocast):
        self.name, self.model, self.autocast = name, model, autocast
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=5e-5, weight_decay=0.01, foreach=True)
        self.seconds, self.examples = 0.0, 0

    def run(self, batches):
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if self.autocast else contextlib.nullcontext()
        t0 = time.perf_counter()
        for b in batches:
            with ctx:
                loss = self.model(**b).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.examples += b["input_ids"].shape[0]
        self.seconds += time.perf_counter() - t0

    @property
    def rate(self):
        return self.examples / self.seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40, help="steps per model per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=64)
    args = ap.parse_args()
    import transformers as T
    T.logging.set_verbosity_error()
    batches, model_dir = make_batches(args.steps, args.batch_size, args.max_len)
    results = {"threads": torch.get_num_threads(), "batch_size": args.batch_size, "max_len": args.max_len,
               "steps_per_round": args.steps, "rounds": args.rounds,
               "mean_tokens_per_example": float(sum(int(b["attention_mask"].sum()) for b in batches)
                                                / sum(b["input_ids"].shape[0] for b in batches))}
    from bertforge.engine.train.precision import native_bf16
    for precision in ("fp32", "bf16"):
        if precision == "bf16" and not native_bf16("cpu"):
            print("bf16: skipped — no native bf16 on this CPU (avx512_bf16/amx_bf16); emulated bf16 matmuls "
                  "are ~100x slower on both sides")
            continue
        torch.manual_seed(0)
        ours = load_pretrained(model_dir, head="sequence_classification", num_labels=2)
        torch.manual_seed(0)
        ref = T.BertForSequenceClassification.from_pretrained(str(model_dir), num_labels=2)
        runners = [Runner("bertforge", ours, precision == "bf16"),
                   Runner("transformers", ref, precision == "bf16")]
        for r in runners:  # warm-up
            r.run(batches[:3])
            r.seconds, r.examples = 0.0, 0
        for _ in range(args.rounds):
            for r in runners:
                r.run(batches)
        a, b = runners
        results[precision] = {"bertforge_examples_per_s": round(a.rate, 2),
                              "transformers_examples_per_s": round(b.rate, 2),
                              "ratio": round(a.rate / b.rate, 3)}
        print(f"{precision}: bertforge {a.rate:.1f} ex/s, transformers {b.rate:.1f} ex/s, "
              f"ratio {a.rate / b.rate:.2f}x", flush=True)
    print(json.dumps(results))
    out = Path(__file__).resolve().parent / "results" / "finetune.txt"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
