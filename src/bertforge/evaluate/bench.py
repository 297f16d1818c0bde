"""Inference latency benchmark: one timing loop for bertforge (PyTorch FP32/INT8), ONNX Runtime graphs and
plain ``transformers`` models, so their numbers are comparable.

:func:`bench` times ``forward`` on a random batch of ``batch_size`` × ``seq_len`` token ids (no padding)
after ``warmup`` calls, and reports latency p50/p90 (ms per call), throughput (sequences/s = batch / mean
latency), parameters, weight-file size (MB), GFLOPs per sequence (analytic, see :func:`encoder_flops`),
achieved GFLOP/s, thread count and the CPU's SIMD flags. :func:`time_calls` is the shared timing loop.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from ..errors import CheckpointError, ConfigError, require_at_least

BACKENDS = ("auto", "torch", "onnxruntime", "transformers")
WEIGHT_FILES = ("model.onnx", "model.int8.safetensors", "model.safetensors", "pytorch_model.bin")
_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16",
          "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16", "asimd", "sve")


def cpu_flags() -> list:
    """The SIMD flags (of :data:`_FLAGS`) that /proc/cpuinfo lists for this CPU."""
    from ..train.precision import cpu_flags as all_flags
    have = set(all_flags())
    return [x for x in _FLAGS if x in have]


def available_memory_bytes() -> Optional[int]:
    """Memory this process can still take: ``MemAvailable`` of /proc/meminfo, capped by a cgroup v2
    ``memory.max`` limit when one is set; ``None`` when neither can be read (the check is then skipped)."""
    avail = None
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        avail = None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = Path("/sys/fs/cgroup/memory.current").read_text().strip()
        if limit.isdigit() and used.isdigit():
            room = max(0, int(limit) - int(used))
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    return avail


def activation_bytes(cfg: dict, batch_size: int, seq_len: int, factor: float = 4.0) -> float:
    """Rough peak activation memory of one forward at ``batch_size`` × ``seq_len`` (fp32): the widest
    per-token tensor of a layer — FFN (I), fused QKV (3H) or the attention scores (heads·T) — times
    ``factor`` for the tensors alive at the same time (input, output, softmax copy …)."""
    if cfg.get("model_type") == "distilbert":
        h, heads, inter = cfg.get("dim", 768), cfg.get("n_heads", 12), cfg.get("hidden_dim", 3072)
    else:
        h, heads, inter = cfg.get("hidden_size", 768), cfg.get("num_attention_heads", 12), \
            cfg.get("intermediate_size", 3072)
    inter = max([inter, *(cfg.get("layer_intermediate_sizes") or [])])
    head = str(cfg.get("bertforge_head") or "")
    lm = head.startswith("mlm") or any(a.endswith(("MaskedLM", "ForPreTraining"))
                                       for a in cfg.get("architectures") or [])
    width = max(inter, 3 * h, heads * seq_len, cfg.get("vocab_size", 0) if lm else 0)  # (B, T, V) logits
    return float(batch_size) * seq_len * width * 4 * factor


def check_bench_args(seq_len: int, batch_size: int, threads: Optional[int], warmup: int, iters: int,
                     min_seconds: float) -> None:
    """Reject timing options that would crash or hang the benchmark (before any model is loaded).

    Raises:
        ConfigError: naming the flag and its valid range.
    """
    for flag, value, minimum, note in (("--seq-len", seq_len, 1, ""), ("--batch-size", batch_size, 1, ""),
                                       ("--iters", iters, 1, "the number of timed calls"),
                                       ("--warmup", warmup, 0, "")):
        require_at_least(flag, value, minimum, note)
    if not (min_seconds >= 0) or min_seconds == float("inf"):
        raise ConfigError(f"--min-seconds {min_seconds} must be a finite number ≥ 0")
    check_threads(threads)


def check_threads(threads: Optional[int]) -> None:
    """``threads`` must be ``None`` (library default) or 1 … 4 × the machine's cores.

    Raises:
        ConfigError: e.g. ``--threads 100000: choose 1–8 (this machine has 2 cores)``.
    """
    if threads is None:
        return
    cores = os.cpu_count() or 1
    if not 1 <= threads <= 4 * cores:
        raise ConfigError(f"--threads {threads}: choose 1–{4 * cores} (this machine has {cores} "
                          f"core{'s' if cores != 1 else ''}), or leave it out for the default")


def check_memory(cfg: dict, batch_size: int, seq_len: int, available: Optional[int] = None) -> None:
    """Refuse a batch whose forward would not fit in the available memory (it would be OOM-killed).

    ``available`` defaults to :func:`available_memory_bytes`; the check is skipped when that is unknown.
    Raises:
        ConfigError: with the estimate, the available memory and what to lower.
    """
    avail = available_memory_bytes() if available is None else available
    if not avail:
        return
    need = activation_bytes(cfg, batch_size, seq_len)
    if need > avail:
        gb = 2 ** 30
        raise ConfigError(f"--batch-size {batch_size} × --seq-len {seq_len} needs about {need / gb:.1f} GiB "
                          f"for one forward but only {avail / gb:.1f} GiB of memory is available; lower "
                          f"--batch-size or --seq-len")


def encoder_flops(cfg: dict, seq_len: int) -> float:
    """FLOPs of one sequence through the encoder (+ pooler/classifier), a multiply-add = 2 FLOPs.

    Per layer with T tokens, hidden H, attention width A = heads·d_k and FFN width I:
    2·T·H·3A (Q,K,V) + 2·2·T²·A (QKᵀ and attention·V) + 2·T·A·H (output) + 2·2·T·H·I (FFN).
    ``cfg`` is a HF ``config.json`` dict; ``layer_num_heads`` / ``layer_intermediate_sizes`` (pruned
    models) are honoured. Embedding lookups, LayerNorm, softmax and activations are not counted.
    """
    if cfg.get("model_type") == "distilbert":
        h, n, heads, inter = cfg.get("dim", 768), cfg.get("n_layers", 6), cfg.get("n_heads", 12), \
            cfg.get("hidden_dim", 3072)
    else:
        h, n, heads, inter = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], \
            cfg["intermediate_size"]
    d = h // heads
    lh = cfg.get("layer_num_heads") or [heads] * n
    li = cfg.get("layer_intermediate_sizes") or [inter] * n
    t = seq_len
    total = 0.0
    for a_heads, i_w in zip(lh, li):
        a = a_heads * d
        total += 2 * t * h * 3 * a + 4 * t * t * a + 2 * t * a * h + 4 * t * h * i_w
    e = cfg.get("embedding_size") or h
    if e != h:
        total += 2 * t * e * h
    if cfg.get("add_pooling_layer", cfg.get("model_type") in ("bert", "albert")):
        total += 2 * h * h
    return total


def time_calls(fn: Callable[[], object], warmup: int = 5, iters: int = 30,
               min_seconds: float = 0.0, warmup_seconds: float = 0.0) -> list:
    """Call ``fn`` at least ``warmup`` times and for at least ``warmup_seconds`` (untimed), then at least
    ``iters`` times (and for at least ``min_seconds``); returns the per-call latencies in ms.

    A time-based warm-up treats fast and slow models alike when several are timed in turn: a few-ms model's
    first calls after a switch otherwise pay for the previous runner's still-spinning thread pool and the
    caches it evicted (measured: 7–9 ms for the first calls of a 3 ms INT8 model after BERT-base)."""
    t_start = time.perf_counter()
    done = 0
    while done < warmup or time.perf_counter() - t_start < warmup_seconds:
        fn()
        done += 1
    out = []
    t_start = time.perf_counter()
    while len(out) < iters or time.perf_counter() - t_start < min_seconds:
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def summarize(lat_ms: list, batch_size: int, flops_per_seq: float) -> dict:
    p50 = float(np.percentile(lat_ms, 50))
    mean = statistics.fmean(lat_ms)
    return {"latency_ms_p50": round(p50, 3), "latency_ms_p90": round(float(np.percentile(lat_ms, 90)), 3),
            "latency_ms_mean": round(mean, 3), "calls": len(lat_ms),
            "throughput_seq_per_s": round(batch_size / (mean / 1e3), 2),
            "gflops_per_seq": round(flops_per_seq / 1e9, 4),
            "achieved_gflop_per_s": round(flops_per_seq * batch_size / (p50 / 1e3) / 1e9, 2)}


def random_inputs(vocab_size: int, batch_size: int, seq_len: int, seed: int = 0,
                  token_types: bool = True) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000 if vocab_size > 2000 else 5, vocab_size, (batch_size, seq_len), generator=g)
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if token_types:
        out["token_type_ids"] = torch.zeros_like(ids)
    return out


def weight_file(model_dir: Path) -> Optional[Path]:
    for name in WEIGHT_FILES:
        if (model_dir / name).is_file():
            return model_dir / name
    return None


def is_bertforge_dir(cfg: dict) -> bool:
    return "bertforge_head" in cfg or "layer_num_heads" in cfg


def load_runner(model_dir, backend: str = "auto", int8: bool = False, threads: Optional[int] = None,
                inputs: Optional[dict] = None):
    """Build ``(call, info)`` for ``model_dir``: ``call(inputs)`` runs one forward; ``info`` has backend,
    parameters, file size and the precision.

    Backends: ``torch`` (bertforge in PyTorch, FP32 Linear weights pre-packed for MKL (:mod:`..compress.packed`);
    ``int8`` = dynamic INT8 Linear layers; a dir written by
    ``bertforge quantize --backend torch`` is INT8 already), ``onnxruntime`` (the dir's ``model.onnx``; a
    checkpoint without one is exported on the fly with fused attention + ORT optimisation, INT8 when
    ``int8``), ``transformers`` (the dir's ``architectures[0]`` class, else ``AutoModel``; FP32). ``auto``: onnxruntime when the dir has
    ``model.onnx``, else torch.

    ``info["parameters"]`` counts each distinct weight once (tied input/output embeddings once, buffers and
    quantization scales not at all), so every backend reports the same number for the same dir: torch the
    loaded model, onnxruntime the model it exported on the fly or, for a dir's own ``model.onnx``, the
    model of its ``config.json`` (not the graph's initializers, which repeat a tied embedding), transformers
    the class named by ``architectures[0]`` (``model_class``; ``AutoModel`` if transformers has no such
    class). Where the transformers model is not the checkpoint's (a head it has no class for), the fields
    ``weights_initialised_fresh`` / ``checkpoint_weights_unused`` list the weights that differ.
    Raises:
        ConfigError: unknown backend; CheckpointError: unusable dir.
    """
    from ..hf import read_config
    model_dir = Path(model_dir)
    cfg = read_config(model_dir)
    if backend not in BACKENDS:
        raise ConfigError(f"--backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    has_onnx = (model_dir / "model.onnx").is_file()
    if backend == "auto":
        backend = "onnxruntime" if has_onnx else "torch"
    check_threads(threads)
    if int8 and backend == "transformers":
        raise ConfigError("--int8 is for bertforge models; use --backend torch or onnxruntime")
    if int8 and backend == "onnxruntime" and has_onnx and not _onnx_is_int8(model_dir / "model.onnx"):
        raise ConfigError(f"--int8: {model_dir} holds an FP32 ONNX graph (model.onnx), which bench does not "
                          f"quantize; run `bertforge quantize --model <its FP32 checkpoint> --out DIR` (or "
                          f"`bertforge export --int8`) and bench that dir, or drop --int8")
    if backend == "transformers":
        _check_transformers_dir(model_dir)
    if threads:
        torch.set_num_threads(threads)
    wf = weight_file(model_dir)
    info = {"backend": backend, "file_mb": round(wf.stat().st_size / 2**20, 3) if wf else None,
            "weights_file": wf.name if wf else None}
    if wf is None:  # a sharded checkpoint: the shards its index lists
        from ..hf import shard_index, weight_files
        shards = weight_files(model_dir)
        if shards:
            info.update(file_mb=round(sum(f.stat().st_size for f in shards) / 2**20, 3),
                        weights_file=shard_index(model_dir)[0].name)
    if backend == "onnxruntime":
        import tempfile
        from ..compress import onnx as bo
        path = model_dir / "model.onnx"
        tmpdir = None
        if not has_onnx:
            from ..hf import load_pretrained
            if (model_dir / "model.int8.safetensors").is_file():
                raise CheckpointError(f"{model_dir} holds a PyTorch INT8 model; run `bertforge quantize "
                                      f"--backend onnxruntime` on its FP32 source for ONNX Runtime")
            model = load_pretrained(model_dir)
            tmpdir = tempfile.mkdtemp(prefix="bertforge-bench-")
            bo.deploy(model, tmpdir + "/m", optimize=True, quantize=int8, check=False)
            path = Path(tmpdir) / "m" / "model.onnx"
            info["exported_on_the_fly"] = True
            info["weights_file"] = "model.onnx (exported on the fly, not kept)"
            info["file_mb"] = round(path.stat().st_size / 2**20, 3)
        sess = bo.session(path, threads or torch.get_num_threads())
        names = [i.name for i in sess.get_inputs()]
        import onnx
        g = onnx.load(str(path), load_external_data=False).graph
        if tmpdir is not None:  # exported from `model` just now: its distinct weights, as --backend torch
            info["parameters"] = count_parameters(model)
        else:
            info.update(_onnx_dir_parameters(cfg, g))
        info["precision"] = "int8" if any(n.op_type in _INT8_OPS for n in g.node) else "fp32"
        rec_path = path.parent / "onnx.json"  # how bertforge export/quantize made the graph (8- or 7-bit weights…)
        if tmpdir is None and rec_path.is_file():
            try:
                info["quantization"] = json.loads(rec_path.read_text(encoding="utf-8")).get("quantization")
            except (ValueError, UnicodeDecodeError, AttributeError):
                pass
        info["threads"] = threads or torch.get_num_threads()
        if tmpdir is not None:  # the session holds the graph in memory: the on-the-fly export is not kept
            import shutil
            shutil.rmtree(tmpdir, ignore_errors=True)

        def call(x):
            return sess.run(None, {n: x[n].numpy() for n in names})
        return call, info, cfg
    if backend == "transformers":
        import transformers
        if cfg.get("layer_num_heads") or cfg.get("layer_intermediate_sizes"):
            what = " and ".join(w for k, w in (("layer_num_heads", "head counts"),
                                               ("layer_intermediate_sizes", "FFN widths")) if cfg.get(k))
            raise CheckpointError(f"{model_dir} has per-layer pruned shapes ({what}), which transformers "
                                  f"cannot build (one width for every layer; no pruned_heads since v5); use "
                                  f"--backend torch or onnxruntime")
        from transformers.utils import logging as hf_logging
        cls = _transformers_class(cfg)
        bar = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # its "Loading weights" bar is not bench output
        try:
            model, loading = cls.from_pretrained(str(model_dir), output_loading_info=True)
        except Exception as e:
            raise CheckpointError(f"transformers cannot load {model_dir} ({str(e).splitlines()[0][:160]}); "
                                  f"use --backend torch") from None
        finally:
            if bar:
                hf_logging.enable_progress_bar()
        model.eval()
        info.update(parameters=count_parameters(model), precision="fp32", model_class=type(model).__name__,
                    threads=torch.get_num_threads(), library=f"transformers {transformers.__version__}")
        fresh = sorted(loading.get("missing_keys") or [])
        unused = sorted(loading.get("unexpected_keys") or [])
        if fresh:  # the timed model is not the checkpoint's: these weights were initialised at random
            info["weights_initialised_fresh"] = fresh
        if unused:  # … or it leaves out part of the checkpoint (a head transformers has no class for)
            info["checkpoint_weights_unused"] = unused

        def call(x):
            with torch.inference_mode():
                return model(**x)
        return call, info, cfg
    # torch
    from ..compress import quantize as bq
    if bq.is_quantized_dir(model_dir):
        model = bq.load_quantized(model_dir)
        info["precision"] = "int8"
    else:
        from ..hf import load_pretrained
        model = load_pretrained(model_dir).eval()
        info["parameters"] = count_parameters(model)
        if int8:
            model = bq.quantize_dynamic(model)
        else:  # FP32: GEMM weights pre-packed once for MKL (same results, see compress/packed.py)
            from ..compress.packed import pack_linears
            info["mkl_packed_linears"] = pack_linears(model)
        info["precision"] = "int8" if int8 else "fp32"
    if "parameters" not in info:
        info["parameters"] = _count_params_int8(model)
    info["threads"] = torch.get_num_threads()
    model.eval()
    from ..kernels import apply_kernels
    apply_kernels(model, "auto")  # speed only (bertforge.kernels)

    def call(x):
        with torch.inference_mode():
            return model(**x)
    return call, info, cfg


_INT8_OPS = ("MatMulInteger", "DynamicQuantizeMatMul", "QAttention")


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct weights (elements) of ``model``: a tensor shared by several modules (tied input
    and output embeddings, ALBERT's shared layers) is counted once, buffers are not counted."""
    return int(sum(p.numel() for p in model.parameters()))  # parameters() yields a shared tensor once


def _transformers_class(cfg: dict):
    """The ``transformers`` class of the dir's ``architectures[0]`` (e.g. ``RobertaForMaskedLM``), so that
    ``--backend transformers`` times the same head as ``torch``/``onnxruntime``; ``AutoModel`` (the bare
    encoder) when the config names no architecture or one this transformers lacks."""
    import transformers
    archs = cfg.get("architectures") or []
    cls = getattr(transformers, archs[0], None) if archs and isinstance(archs[0], str) else None
    return cls if isinstance(cls, type) and hasattr(cls, "from_pretrained") else transformers.AutoModel


def _onnx_dir_parameters(cfg: dict, graph) -> dict:
    """``{"parameters": n}`` for a dir's own ``model.onnx``: the distinct weights of the model its
    ``config.json`` describes (built without weights on the meta device), so an exported or INT8 dir
    counts as the checkpoint it came from. The graph's initializers are not a weight count: a tied output
    projection is stored again, transposed, and the exporter merges initializers that happen to hold
    equal values. For a config bertforge cannot build, the initializer elements are counted and
    ``parameters_counted`` says so."""
    try:
        from ..hf import config_from_hf, saved_head_name
        from ..models.heads import TaskModel
        with torch.device("meta"):
            model = TaskModel(config_from_hf(cfg), head=saved_head_name(cfg) or "base")
        return {"parameters": count_parameters(model)}
    except Exception:  # noqa: BLE001 - a foreign ONNX dir: fall back to the graph
        n = int(sum(int(np.prod(t.dims)) for t in graph.initializer if len(t.dims) > 0))
        return {"parameters": n, "parameters_counted": "onnx initializer elements (tied weights may be "
                                                        "counted twice)"}


def _onnx_is_int8(path: Path) -> bool:
    import onnx
    g = onnx.load(str(path), load_external_data=False).graph
    return any(n.op_type in _INT8_OPS for n in g.node)


def _check_transformers_dir(model_dir: Path) -> None:
    """``--backend transformers`` needs FP32 weights (model.safetensors / pytorch_model.bin); name what the
    dir holds instead and the backend that runs it."""
    from ..hf import deployed_format, weight_files
    if weight_files(model_dir):
        return
    held = deployed_format(model_dir)
    if held:
        raise CheckpointError(f"{model_dir} holds {held[0]}, no model.safetensors, so transformers cannot load "
                              f"it; use --backend {held[1]} (or auto)")
    raise CheckpointError(f"{model_dir} has no model.safetensors or pytorch_model.bin for transformers; "
                          f"pass a checkpoint dir with FP32 weights")


def _count_params_int8(model) -> int:
    """Weights of a PyTorch INT8 model, as many as its FP32 source has: the INT8 matrices, biases and the
    FP32 rest, not the quantization metadata (``.scale`` / ``.zero_point`` / per-channel ``.axis``)."""
    from ..compress.quantize import int8_state
    return int(sum(v.numel() for k, v in int8_state(model).items()
                   if not k.endswith((".scale", ".zero_point", ".axis"))))


def bench(model_dir, backend: str = "auto", seq_len: int = 128, batch_size: int = 1,
          threads: Optional[int] = None, warmup: int = 5, iters: int = 30, min_seconds: float = 0.0,
          int8: bool = False, seed: int = 0) -> dict:
    """Time ``model_dir`` (see :func:`load_runner`) at ``batch_size`` × ``seq_len``; one JSON-able dict.

    Raises:
        ConfigError: ``seq_len`` beyond the model's positions, non-positive sizes, ``iters`` < 1,
        ``warmup``/``min_seconds`` < 0, ``threads`` outside 1 … 4 × cores, a batch too large for the
        available memory (:func:`check_memory`), ``int8`` on an FP32 ONNX dir.
    """
    from ..hf import check_seq_len, read_config
    check_bench_args(seq_len, batch_size, threads, warmup, iters, min_seconds)
    cfg0 = read_config(Path(model_dir))
    check_seq_len(seq_len, cfg0, flag="--seq-len")
    check_memory(cfg0, batch_size, seq_len)
    call, info, cfg = load_runner(model_dir, backend, int8, threads)
    tt = cfg.get("type_vocab_size", 2) > 0 and cfg.get("model_type") != "distilbert"
    x = random_inputs(cfg.get("vocab_size", 30522), batch_size, seq_len, seed, token_types=tt)
    lat = time_calls(lambda: call(x), warmup, iters, min_seconds)
    rec = {"model": str(model_dir), **info, "seq_len": seq_len, "batch_size": batch_size,
           **summarize(lat, batch_size, encoder_flops(cfg, seq_len)),
           "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
           "cpu_flags": cpu_flags(), "torch": torch.__version__}
    return rec


__all__ = ["bench", "load_runner", "count_parameters", "check_bench_args", "check_threads", "check_memory",
           "available_memory_bytes", "activation_bytes", "time_calls", "encoder_flops", "cpu_flags", "summarize",
           "random_inputs"]
