"""Bundle a model and prove it runs without torch: what ``bertforge demo`` shows for its INT8 student.

:func:`check_without_torch` bundles a model dir, then starts a child Python that can import only
``bertforge_lite`` (``lite/``) and what it needs — importing torch, transformers or bertforge there raises
ImportError — verifies the bundle, embeds (or classifies) texts and reports: the bundle's size, the cold start
(process spawn → first answer, timed by this process), the per-text latency at batch 1 (median), and the
modules the child imported. With Chromium and ``web/node_modules`` present it also runs the page on 100 fuzz
texts (:mod:`bertforge.pipelines.bundle_browser`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

LITE = Path(__file__).resolve().parents[3] / "lite"

#: the child: no torch / transformers / bertforge can be imported; prints "first" at the first answer, then
#: one JSON line
CHILD = r"""
import sys, time
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "bertforge"):
            raise ImportError(f"{name} is blocked in this child")
        return None
sys.meta_path.insert(0, _Block())
from bertforge_lite import Bundle, verify
b = Bundle(sys.argv[1], threads=int(sys.argv[2]))
texts = sys.argv[3:]
answer = b.embed if b.kind == "embedding" else b.classify
answer(texts[:1])
print("first", flush=True)
lat = []
for t in texts * 3:
    t0 = time.perf_counter(); answer([t]); lat.append(time.perf_counter() - t0)
lat.sort()
ok = verify(sys.argv[1])
import json
print(json.dumps({"ms_per_text": 1000 * lat[len(lat) // 2], "verify": ok, "kind": b.kind,
                  "forbidden": sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "bertforge"))}))
"""

TEXTS = ("The movie was a delight from start to finish.", "A man is playing a guitar on a crowded street.",
         "Interest rates rose again this quarter.", "She forgot her umbrella and got soaked in the rain.",
         "The recipe needs two eggs, flour and a pinch of salt.")


def run_child(bundle, threads: int = 1, texts=TEXTS, lite_dir: Optional[Path] = None) -> dict:
    """Start the torch-less child on ``bundle``: {"cold_start_s", "ms_per_text", "verify", "forbidden", …}.
    Raises RuntimeError with the child's last error line when it fails."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(lite_dir or LITE), OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(bundle), str(threads), *texts], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    cold = time.perf_counter() - t0
    rest, err = proc.communicate(timeout=300)
    if proc.returncode != 0 or first.strip() != "first":
        raise RuntimeError((err.strip().splitlines() or ["no output"])[-1])
    return {"cold_start_s": cold, **json.loads(rest.strip().splitlines()[-1])}


def check_without_torch(model_dir, out, threads: int = 1, browser: bool = True) -> dict:
    """Bundle ``model_dir`` into ``out`` (replaced), run :func:`run_child` on it and, when ``browser`` and
    Chromium are there, the page on 100 fuzz texts. Returns {"bundle", "size_mb", "cold_start_s",
    "ms_per_text", "verify", "forbidden", "browser"} (``browser``: per model {"texts", "max_abs_diff",
    "ms_per_text"} or the reason it was not run)."""
    from .bundle import bundle
    res = bundle({"student": model_dir}, out, overwrite=True)
    size = sum(p.stat().st_size for p in Path(res.out).rglob("*") if p.is_file()) / 1e6
    rec = {"bundle": str(res.out), "size_mb": round(size, 2), **run_child(res.out, threads)}
    rec["browser"] = _browser(res.out) if browser else "not asked"
    return rec


def _browser(path) -> object:
    from .bundle_browser import chromium, compare, fuzz_texts, run_in_chromium, web_ready
    if chromium() is None:
        return "chromium not installed"
    why = web_ready()
    if why:
        return why
    sys.path.insert(0, str(LITE))
    try:
        import bertforge_lite
        texts = fuzz_texts(100, long_tokens=300)
        return compare(run_in_chromium(path, texts, timeout=600), path, texts, bertforge_lite.Bundle)
    except Exception as e:  # the demo reports it and goes on
        return f"failed: {str(e).splitlines()[0][:200]}"
    finally:
        sys.path.remove(str(LITE))


__all__ = ["LITE", "CHILD", "TEXTS", "run_child", "check_without_torch"]


def demo_stage(pl, D: Path, threads: int = 1) -> Optional[dict]:  # noqa: N803  (D: the demo folder)
    """The demo's ``bundle`` stage: :func:`check_without_torch` of ``D/onnx/student-a-int8`` into ``D/bundle``,
    its record in ``D/bundle/check.json`` and in ``pl`` (a :class:`~bertforge.pipelines.demo.Pipeline`)."""
    src = D / "onnx" / "student-a-int8"
    t0 = time.perf_counter()
    if not pl.ok("student-a-int8"):
        pl.record("bundle", "skipped", 0.0, "needs stage student-a-int8", "bertforge bundle (demo hook)")
        return None
    try:
        rec = check_without_torch(src, D / "bundle" / "student-a-int8", threads=threads)
    except Exception as e:  # recorded; the demo goes on
        pl.record("bundle", "failed", time.perf_counter() - t0, str(e).splitlines()[0][:300],
                  f"bertforge bundle --model {src} --out {D / 'bundle' / 'student-a-int8'}")
        return None
    (D / "bundle" / "check.json").write_text(json.dumps(rec, indent=2))
    pl.record("bundle", "ok", time.perf_counter() - t0,
              command=f"bertforge bundle --model {src} --out {D / 'bundle' / 'student-a-int8'}")
    return rec


def demo_claim(D: Path) -> Optional[dict]:  # noqa: N803
    """The report's row for the bundle stage (None when it did not run)."""
    f = D / "bundle" / "check.json"
    if not f.is_file():
        return None
    r = json.loads(f.read_text())
    b = r.get("browser")
    page = (f"; Chromium page {b['student']['ms_per_text']:.1f} ms/text on {b['student']['texts']} texts, "
            f"max |Δ| {b['student']['max_abs_diff']:.1e}") if isinstance(b, dict) else f"; browser: {b}"
    return {"claim": "student-a-int8 bundled runs without torch (bertforge_lite, child process) and verifies",
            "value": f"{r['size_mb']:.1f} MB, cold start {r['cold_start_s']:.2f} s, {r['ms_per_text']:.1f} ms/text"
                     + page, "ok": not r["forbidden"]}
