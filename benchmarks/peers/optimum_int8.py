"""Peer of benchmarks/bench_int8.py: Hugging Face optimum's dynamic INT8 recipe for ONNX Runtime.

Exports a local Hugging Face checkpoint directory to ONNX with optimum's exporter (``main_export``), then
quantizes it with ``ORTQuantizer`` and ``AutoQuantizationConfig.<config>(is_static=False, per_channel=True)``,
optimum's documented dynamic INT8 recipe (weights INT8 per channel, activations quantized at run time).
OUT_DIR gets what optimum writes: ``model.onnx`` (FP32), ``model_quantized.onnx`` (INT8), ``ort_config.json``,
``config.json`` and the tokenizer files. The last line on stdout is one JSON object:
``{"onnx": ".../model_quantized.onnx", "config": "avx512_vnni", "optimum": "1.24.0", "onnxruntime": "..."}``
(plus task, exporter, torch and seconds); logs and warnings go to stderr.

Runs in the benchmark's own environment (.venv-bench: optimum[onnxruntime] 1.24, transformers<4.50, torch,
onnxscript), not in bertforge's, and fully offline (HF_HUB_OFFLINE=1 unless set otherwise):

  .venv-bench/bin/python benchmarks/peers/optimum_int8.py --model HF_DIR --out OUT_DIR \
      [--config avx2|avx512_vnni|arm64] [--task feature-extraction|text-classification]

--config defaults to avx512_vnni where /proc/cpuinfo lists the avx512_vnni flag, arm64 on an ARM machine,
else avx2. --task defaults to text-classification when config.json's architectures name a
*ForSequenceClassification model, else feature-extraction. A sentence-transformers directory is exported
as its plain transformer (library "transformers": last_hidden_state, no pooling), so the caller pools.

The ONNX graph is traced with torch's TorchScript exporter (``dynamo=False``), the one optimum 1.24 was made
for: torch >= 2.9 defaults to the dynamo exporter, which cannot lower its graph to optimum's opset 14 and writes
the weights to model.onnx_data, and optimum 1.24 then fails to tidy up after it (FileNotFoundError on
model.onnx.data), so it is not offered.

This script is a peer measured by benchmarks/bench_int8.py, never a runtime dependency of bertforge:
nothing under src/ imports optimum.
"""
import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

CONFIGS = ("avx2", "avx512_vnni", "arm64")
TASKS = ("feature-extraction", "text-classification")


def default_config() -> str:
    try:
        flags = set()
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags.update(line.split(":", 1)[1].split())
    except OSError:
        flags = set()
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "arm64"
    return "avx2"


def default_task(model_dir: Path) -> str:
    archs = json.loads((model_dir / "config.json").read_text()).get("architectures") or []
    return "text-classification" if any(a.endswith("ForSequenceClassification") for a in archs) \
        else "feature-extraction"


def _torchscript_exporter():
    """Make optimum's ``torch.onnx.export`` call take the TorchScript exporter (torch >= 2.9 defaults to dynamo).

    optimum 1.24 imports ``export`` from ``torch.onnx`` inside its export function, so patching the module
    attribute before ``main_export`` is enough."""
    import functools
    import inspect
    import warnings

    import torch.onnx
    if "dynamo" not in inspect.signature(torch.onnx.export).parameters:
        return  # an older torch: TorchScript is already the only exporter
    orig = torch.onnx.export

    @functools.wraps(orig)
    def export(*args, **kwargs):
        kwargs.setdefault("dynamo", False)
        with warnings.catch_warnings():  # "legacy TorchScript-based ONNX export": chosen on purpose, see above
            warnings.simplefilter("ignore", DeprecationWarning)
            return orig(*args, **kwargs)

    torch.onnx.export = export


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, type=Path, help="local Hugging Face checkpoint directory")
    ap.add_argument("--out", required=True, type=Path, help="output directory (created)")
    ap.add_argument("--config", choices=CONFIGS, default=None,
                    help="AutoQuantizationConfig preset (default: from /proc/cpuinfo)")
    ap.add_argument("--task", choices=TASKS, default=None, help="default: from config.json's architectures")
    ap.add_argument("--opset", type=int, default=None, help="ONNX opset (default: optimum's for the model)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads for export/validation")
    a = ap.parse_args(argv)

    if not (a.model / "config.json").is_file():
        ap.error(f"--model {a.model}: no config.json (a local Hugging Face checkpoint directory is needed)")
    config = a.config or default_config()
    task = a.task or default_task(a.model)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    t0 = time.perf_counter()
    import onnxruntime
    import optimum.version
    import torch
    from optimum.exporters.onnx import main_export
    from optimum.onnxruntime import ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    if a.threads:
        torch.set_num_threads(a.threads)
    _torchscript_exporter()

    a.out.mkdir(parents=True, exist_ok=True)
    main_export(str(a.model), output=a.out, task=task, library_name="transformers", opset=a.opset,
                device="cpu", local_files_only=True)
    t_export = time.perf_counter() - t0

    qconfig = getattr(AutoQuantizationConfig, config)(is_static=False, per_channel=True)
    quantizer = ORTQuantizer.from_pretrained(a.out, file_name="model.onnx")
    quantizer.quantize(quantization_config=qconfig, save_dir=a.out)
    onnx_path = (a.out / "model_quantized.onnx").resolve()
    if not onnx_path.is_file():
        print(f"optimum_int8: {onnx_path} was not written", file=sys.stderr)
        return 1

    print(json.dumps({"onnx": str(onnx_path), "config": config, "optimum": optimum.version.__version__,
                      "onnxruntime": onnxruntime.__version__, "task": task, "exporter": "torchscript",
                      "torch": torch.__version__, "export_s": round(t_export, 1),
                      "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
