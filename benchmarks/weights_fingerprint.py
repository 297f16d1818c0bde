"""SHA-256 of the weights two fixed-seed runs write: a `finetune` (MiniLM on 256 SST-2 rows) and a
`pretrain --objective electra` (tiny, 30 steps on WikiText-2 valid). The renovation of the core (issue #23)
must leave both bit-identical with ``impl.kernels=cpu``; `benchmarks/results/weights_fingerprint.txt`
holds the figures recorded before it, on the same host.

    python benchmarks/weights_fingerprint.py [--extra impl.kernels=cpu] [--out /tmp/fp] [--only finetune]

Since issue 39 ``finetune`` reads MiniLM's declared mean pooling; ``--extra model.pooling=pooler`` is the run
the hashes below were recorded with.

Prints one line per run: ``<run> <sha256 of model.safetensors tensors>`` (hashed tensor by tensor in name
order, so the file's metadata does not matter). Exit 0 always; compare the lines by eye or with diff.
"""
import argparse
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from safetensors.numpy import load_file

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
RUNS = {
    "finetune": ["finetune", "--model", "minilm", "--task", "sst2", "--train", str(DATA / "glue/SST-2/train.tsv"),
                 "--max-train-samples", "256", "--epochs", "1", "--batch-size", "16", "--max-seq-len", "48",
                 "--seed", "7", "--no-progress"],
    "pretrain-electra": ["pretrain", "--objective", "electra", "--corpus", str(DATA / "wikitext-2-raw/wiki.valid.raw"),
                         "--size", "tiny", "--max-steps", "30", "--seed", "7", "--no-progress"],
}


def digest(path: Path) -> str:
    tensors = load_file(str(path / "model.safetensors"))
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].tobytes())
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--extra", nargs="*", default=[], help="KEY=VALUE overrides added to both runs")
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", nargs="*", default=list(RUNS), choices=list(RUNS), help="the runs to make (all)")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bf-fp-"))
    flags = [l for l in open("/proc/cpuinfo") if l.startswith("flags")][:1] if os.path.exists("/proc/cpuinfo") else []
    print(f"# {platform.processor() or platform.machine()}; avx512={'avx512f' in ''.join(flags)} "
          f"vnni={'vnni' in ''.join(flags)} extra={' '.join(args.extra) or '-'}")
    for name, argv in RUNS.items():
        if name not in args.only:
            continue
        d = out / name
        cmd = [sys.executable, "-m", "bertforge", *argv, "--out", str(d), "--overwrite", *args.extra]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        print(name, digest(d))


if __name__ == "__main__":
    main()
