"""Inference latency benchmark: one timing loop for bertforge (PyTorch FP32/INT8), ONNX Runtime graphs and
plain ``transformers`` models, so their numbers are comparable; the models are run by
:mod:`bertforge.runtime`.

:func:`bench` times ``forward`` on a random batch of ``batch_size`` × ``seq_len`` token ids (no padding)
after ``warmup`` calls, and reports latency p50/p90 (ms per call), throughput (sequences/s = batch / mean
latency), parameters, weight-file size (MB), GFLOPs per sequence (analytic, see :func:`encoder_flops`),
achieved GFLOP/s, thread count and the CPU's SIMD flags. :func:`time_calls` is the shared timing loop.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from ..checkpoint.layout import model_family
from ..checkpoint.read import check_seq_len
from ..errors import ConfigError, require_at_least
from ..hardware import cpu_flags as all_flags
from . import load_runner

_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16",
          "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16", "asimd", "sve")


def cpu_flags() -> list:
    """The SIMD flags (of :data:`_FLAGS`) that /proc/cpuinfo lists for this CPU."""
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
    if model_family(cfg) == "distilbert":
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
    2·T·H·3A (Q,K,V) + 2·2·T²·A (QKᵀ and attention·V) + 2·T·A·H (output) + 2·2·T·H·I (FFN); ModernBERT:
    3·2·T·H·I (GeGLU) and T·min(T, window + 1) products on its local layers.
    ``cfg`` is a HF ``config.json`` dict; ``layer_num_heads`` / ``layer_intermediate_sizes`` (pruned
    models) are honoured. Embedding lookups, LayerNorm, softmax and activations are not counted.
    """
    if model_family(cfg) == "mobilebert":
        return mobilebert_flops(cfg, seq_len)
    if model_family(cfg) == "distilbert":
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
    modern = model_family(cfg) == "modernbert"  # GeGLU: H → 2I, I → H; local layers see ≤ window + 1 keys
    kinds = cfg.get("layer_types") or ["full_attention"] * n
    window = int(cfg.get("local_attention", 128)) // 2 * 2 + 1
    for a_heads, i_w, kind in zip(lh, li, kinds):
        a = a_heads * d
        keys = min(t, window) if kind == "sliding_attention" else t
        total += 2 * t * h * 3 * a + 4 * t * keys * a + 2 * t * a * h + (6 if modern else 4) * t * h * i_w
    e = cfg.get("embedding_size") or h
    if e != h:
        total += 2 * t * e * h
    if cfg.get("add_pooling_layer", model_family(cfg) in ("bert", "albert")):
        total += 2 * h * h
    return total


def mobilebert_flops(cfg: dict, seq_len: int) -> float:
    """:func:`encoder_flops` of a MobileBERT ``config.json`` (Sun et al. 2020 §3.1): per layer the bottlenecks
    H → B (input, and the shared query/key one) and B → H, Q/K from B and V from H, attention over the heads'
    width A, the output projection A → B and ``num_feedforward_networks`` FFNs B → I → B; the trigram
    embedding projection 3E → H once."""
    t, h, n = seq_len, cfg["hidden_size"], cfg["num_hidden_layers"]
    bottleneck = cfg.get("use_bottleneck", True)
    b = cfg.get("intra_bottleneck_size", 128) if bottleneck else h
    heads = cfg["num_attention_heads"]
    d = b // heads
    f = cfg.get("num_feedforward_networks", 4)
    lh = cfg.get("layer_num_heads") or [heads] * n
    li = cfg.get("layer_intermediate_sizes") or [cfg["intermediate_size"]] * n
    total = 0.0
    for a_heads, i_w in zip(lh, li):
        a = a_heads * d
        total += 4 * t * b * a + 2 * t * (b if cfg.get("use_bottleneck_attention") else h) * a  # Q, K; V
        total += 4 * t * t * a + 2 * t * a * b + 4 * f * t * b * i_w  # attention, output, FFNs
        if bottleneck:
            total += 2 * t * h * b * (2 if cfg.get("key_query_shared_bottleneck", True) else 1) + 2 * t * b * h
    e = cfg.get("embedding_size") or h
    total += 2 * t * e * (3 if cfg.get("trigram_input", True) else 1) * h
    if cfg.get("add_pooling_layer", True):
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


def check_int8_option(md, backend: str, int8: bool) -> None:
    """Reject ``--int8`` where bench cannot apply it, in the words of its flags (before anything is loaded).
    ``md``: the :class:`~bertforge.checkpoint.modeldir.ModelDir` benched.

    Raises:
        ConfigError: ``--int8`` with ``--backend transformers``, or on a dir whose ``model.onnx`` is FP32.
    """
    if not int8:
        return
    if backend == "transformers":
        raise ConfigError("--int8 is for bertforge models; use --backend torch or onnxruntime")
    if backend in ("auto", "onnxruntime") and md.format == "onnx" and md.graph is not None \
            and md.graph.name == "model.onnx":
        raise ConfigError(f"--int8: {md.path} holds an FP32 ONNX graph (model.onnx), which bench does not "
                          f"quantize; run `bertforge quantize --model <its FP32 checkpoint> --out DIR` (or "
                          f"`bertforge export --int8`) and bench that dir, or drop --int8")


def bench(model_dir, backend: str = "auto", seq_len: int = 128, batch_size: int = 1,
          threads: Optional[int] = None, warmup: int = 5, iters: int = 30, min_seconds: float = 0.0,
          int8: bool = False, seed: int = 0) -> dict:
    """Time one forward of ``model_dir`` at ``batch_size`` × ``seq_len``; one JSON-able dict.

    The model is run by :func:`bertforge.runtime.load_runner` (``backend``, ``threads``, ``int8``; FP32
    PyTorch Linear weights pre-packed for MKL); the record holds the runner's
    :meth:`~bertforge.runtime.base.Runner.describe` (parameters counted once per distinct weight on every
    backend, file size, precision, threads …) and the timing summary.

    Raises:
        ConfigError: ``seq_len`` beyond the model's positions, non-positive sizes, ``iters`` < 1,
        ``warmup``/``min_seconds`` < 0, ``threads`` outside 1 … 4 × cores, a batch too large for the
        available memory (:func:`check_memory`), ``int8`` on an FP32 ONNX dir.
    """
    check_bench_args(seq_len, batch_size, threads, warmup, iters, min_seconds)
    from ..checkpoint.modeldir import ModelDir
    md = ModelDir.open(model_dir, require_config=False)
    cfg0 = md.config or ModelDir.open(md.path).config  # the second: the one-line error for a dir without one
    check_seq_len(seq_len, cfg0, flag="--seq-len")
    check_memory(cfg0, batch_size, seq_len)
    check_int8_option(md, backend, int8)
    runner = load_runner(md, backend, threads, int8=int8, mkl_pack=True)
    cfg = runner.config
    tt = cfg.get("type_vocab_size", 2) > 0 and model_family(cfg) not in ("distilbert", "mpnet")
    x = random_inputs(cfg.get("vocab_size", 30522), batch_size, seq_len, seed, token_types=tt)
    lat = time_calls(lambda: runner(**x), warmup, iters, min_seconds)
    rec = {"model": str(model_dir), **runner.describe(), "seq_len": seq_len, "batch_size": batch_size,
           **summarize(lat, batch_size, encoder_flops(cfg, seq_len)),
           "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
           "cpu_flags": cpu_flags(), "torch": torch.__version__}
    return rec


__all__ = ["bench", "target_mismatch", "check_int8_option", "check_bench_args", "check_threads", "check_memory",
           "available_memory_bytes", "activation_bytes", "time_calls", "encoder_flops", "mobilebert_flops",
           "cpu_flags", "summarize",
           "random_inputs"]


def target_mismatch(rec: dict):
    """A warning when an INT8 graph made for one CPU kind (``onnx.json``'s target) is timed on another: its
    scheme may be slower here, or (8-bit weights on an AVX2 CPU) saturate and lose accuracy. None if it fits."""
    from ..compress.int8 import SCHEMES, exact_on, host_target
    target, scheme = rec.get("int8_target"), rec.get("int8_scheme")
    here = host_target()
    if not target or target == here:
        return None
    why = "its u8×s8 products saturate here (re-quantize with --target avx2)" \
        if scheme in SCHEMES and not exact_on(SCHEMES[scheme], here) else "figures here may not hold there"
    return f"this graph was quantized for {target} (scheme {scheme}) but this CPU is {here}: {why}"
