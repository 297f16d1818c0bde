"""The demo's figures as a benchmark: runs `bertforge demo` (full budgets) and prints its table and claims.

Teacher (MiniLM-L6-H384, PyTorch FP32) vs student (a) (3 copied layers, general-distilled), its pruned
and INT8 (ONNX Runtime) versions and student (b) (4L-312 TinyBERT shape), all timed in the same run with
interleaved rounds (seq 128, batch 1). Quality: Lee 50-document similarity Spearman ρ, Pang–Lee
5-fold probe accuracy. Save the output with:

  python benchmarks/bench_demo.py | tee benchmarks/results/demo.txt
"""
import json
import sys
import tempfile
import time
from pathlib import Path

from bertforge.cli import main

if __name__ == "__main__":
    tmp = None if len(sys.argv) > 1 else tempfile.TemporaryDirectory(prefix="bench-demo-")  # removed on exit
    out = Path(sys.argv[1] if tmp is None else tmp.name)
    t0 = time.perf_counter()
    rc = main(["demo", "--out", str(out / "demo"), "--no-progress"])
    wall = time.perf_counter() - t0
    report = (out / "demo" / "report.md").read_text()
    claims = report.split("## Claims", 1)[1].split("##", 1)[0] if "## Claims" in report else "(no claims)\n"
    stages = json.loads((out / "demo" / "demo.json").read_text())["stages"]
    print(f"\nbertforge demo: exit {rc}, {wall:.0f} s wall")
    print("stage seconds: " + ", ".join(f"{s['name']}={s['seconds']}" for s in stages))
    print("claims:" + claims)
    sys.exit(rc)
