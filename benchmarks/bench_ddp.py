"""2-process DDP scaling efficiency of the bertforge Trainer on CPU (gloo), measured in one run.

Weak scaling, as DDP is used: every process trains on the same per-process micro-batch, so 2 processes
process a 2× larger global batch per step. Efficiency = throughput(2 processes) / (2 × throughput(1
process)), throughput in training examples per second, each process pinned to one thread
(``OMP_NUM_THREADS=1``, what torchrun sets). Both configurations run the real training path: the same
``Trainer`` (DDP wrapper, no_sync accumulation, metrics reduction, checkpointing off) on a BERT encoder
with a sequence-classification head. The first ``--skip`` steps (allocator warm-up, DDP bucket rebuild)
are excluded; the rate is read from the ``elapsed_s`` and step counts in ``metrics.jsonl``. A second
efficiency uses the process CPU time (``cpu_s``) instead of wall time: on a machine shared with other jobs
it isolates what DDP itself costs (all-reduce, redundant collation) from time lost to the scheduler.
Configurations alternate (1, 2, 1, 2 …) and the best of ``--repeats`` is kept, which limits the damage
of other jobs on a shared machine.

Usage:
  python benchmarks/bench_ddp.py                      # prints the table, writes benchmarks/results/ddp.txt
  python benchmarks/bench_ddp.py --hidden 256 --layers 4 --batch 16 --seq 128 --steps 14 --repeats 2
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def worker(a) -> None:
    import torch
    from bertforge.config import ModelConfig, load_recipe
    from bertforge.data.collate import PadCollator
    from bertforge.task_model import TaskModel
    from bertforge.engine.train.rng import set_seed
    from bertforge.engine.train.trainer import Trainer
    world = int(os.environ.get("WORLD_SIZE", "1"))
    set_seed(0)
    cfg = ModelConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                      num_attention_heads=a.hidden // 64, intermediate_size=4 * a.hidden,
                      max_position_embeddings=max(512, a.seq), num_labels=2)
    model = TaskModel(cfg, head="sequence_classification")
    g = torch.Generator().manual_seed(0)
    n = a.batch * world * (a.steps + 1)
    data = [{"input_ids": torch.randint(5, a.vocab, (a.seq,), generator=g).tolist(),
             "token_type_ids": [0] * a.seq, "labels": i % 2} for i in range(n)]
    recipe = load_recipe(None, [f"train.batch_size={a.batch * world}", f"train.max_steps={a.steps}",
                                "train.log_every=1", "train.save_every=1000000", "impl.progress=false",
                                "train.lr=1e-4", "impl.threads=1"])
    Trainer(model, data, PadCollator(0), recipe, a.out).fit()
    if int(os.environ.get("RANK", "0")) == 0:
        import shutil
        shutil.rmtree(Path(a.out) / "checkpoints", ignore_errors=True)


def rate(run_dir: Path, skip: int, per_step: int) -> tuple:
    """(examples per wall second, examples per CPU second of one process) after ``skip`` steps."""
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    a = next(r for r in recs if r["step"] == skip)
    b = recs[-1]
    ex = (b["step"] - a["step"]) * per_step
    return ex / (b["elapsed_s"] - a["elapsed_s"]), ex / (b["cpu_s"] - a["cpu_s"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=2000)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=16, help="per-process micro-batch")
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--skip", type=int, default=3, help="warm-up steps excluded from the rate")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--save", default=str(HERE / "results" / "ddp.txt"))
    a = p.parse_args()
    if a.worker:
        return worker(a)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", BERTFORGE_NO_PROGRESS="1",
               TOKENIZERS_PARALLELISM="false")
    common = ["--hidden", a.hidden, "--layers", a.layers, "--vocab", a.vocab, "--seq", a.seq, "--batch", a.batch,
              "--steps", a.steps]
    common = [str(x) for x in common]
    best = {1: 0.0, 2: 0.0}
    best_cpu = {1: 0.0, 2: 0.0}
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.repeats):
            for n in (1, 2):
                out = Path(tmp) / f"n{n}-{rep}"
                cmd = [sys.executable, __file__, "--worker", "--out", str(out), *common]
                if n > 1:
                    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={n}", *cmd[1:]]
                t0 = time.time()
                subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                r, rc = rate(out, a.skip, a.batch * n)
                rc = rc / n  # rank 0's CPU seconds cover its own 1/n of the examples
                runs.append((n, rep, r, rc, time.time() - t0))
                best[n] = max(best[n], r)
                best_cpu[n] = max(best_cpu[n], rc)
    load = os.getloadavg()
    eff = best[2] / (2 * best[1])
    eff_cpu = best_cpu[2] / best_cpu[1]
    lines = [
        "bench_ddp: bertforge Trainer, CPU gloo DDP, weak scaling (same per-process micro-batch)",
        f"model: BERT H={a.hidden} L={a.layers} heads={a.hidden // 64} FFN={4 * a.hidden} vocab={a.vocab}; "
        f"seq={a.seq}; per-process batch={a.batch}; steps={a.steps} (first {a.skip} excluded); 1 thread/process",
        f"machine: {os.cpu_count()} CPUs, load average during run {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}",
        *[f"  run {rep} nproc={n}: {r:7.2f} examples/s wall, {rc:6.2f} examples per CPU-second per process "
          f"(wall {w:.0f}s incl. start-up)" for n, rep, r, rc, w in runs],
        f"1 process : {best[1]:7.2f} examples/s (best of {a.repeats})",
        f"2 processes: {best[2]:7.2f} examples/s (best of {a.repeats})",
        f"scaling efficiency, wall clock (2 proc / 2x 1 proc): {eff:.3f}   (goal >= 0.8)",
        f"scaling efficiency, per-process CPU time (DDP overhead only, immune to other jobs): {eff_cpu:.3f}",
    ]
    text = "\n".join(lines)
    print(text)
    if a.save:
        Path(a.save).parent.mkdir(parents=True, exist_ok=True)
        Path(a.save).write_text(text + "\n")


if __name__ == "__main__":
    main()
