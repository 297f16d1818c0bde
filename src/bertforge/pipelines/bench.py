"""Inference timing from Python: :func:`bench` (what ``bertforge bench`` calls) — one forward of a model dir
timed at a batch × sequence size on any backend, the record :func:`bertforge.runtime.bench.bench` gives.

    >>> import bertforge
    >>> rec = bertforge.bench("runs/sst2-int8", seq_len=128, batch_size=1, threads=2)
    >>> rec["latency_ms"]["p50"]
"""
from __future__ import annotations

from typing import Optional

from .options import check_option


def bench(model, *, backend: str = "auto", seq_len: int = 128, batch_size: int = 1, threads: Optional[int] = None,
          warmup: int = 5, iters: int = 30, min_seconds: float = 0.0, int8: bool = False) -> dict:
    """Time ``model`` (a checkpoint dir, an export / INT8 dir, an ``.onnx`` file, a plain transformers dir with
    ``backend="transformers"``, or ``"minilm"``): ``warmup`` untimed calls, then at least ``iters`` timed ones
    (and at least ``min_seconds``). Returns the JSON-able record (latency percentiles in ms, sequences/s,
    parameters, file size, GFLOPs, CPU flags …) plus ``warning`` when an INT8 graph made for another CPU kind
    is timed here.

    Raises:
        ConfigError: sizes out of range, ``threads`` outside 1 … 4 × cores, a batch too large for the memory,
            ``int8`` on an FP32 ONNX dir — before anything is loaded."""
    from ..checkpoint.modeldir import resolve
    from ..runtime.bench import bench as time_model, check_bench_args, target_mismatch
    fn = "bench"
    seq_len, batch_size = check_option(fn, "seq_len", seq_len, int), check_option(fn, "batch_size", batch_size, int)
    warmup, iters = check_option(fn, "warmup", warmup, int), check_option(fn, "iters", iters, int)
    threads = check_option(fn, "threads", threads, Optional[int])
    min_seconds, int8 = check_option(fn, "min_seconds", min_seconds, float), check_option(fn, "int8", int8, bool)
    check_bench_args(seq_len, batch_size, threads, warmup, iters, min_seconds)
    rec = time_model(resolve(model), backend, seq_len, batch_size, threads, warmup, iters, min_seconds, int8)
    warning = target_mismatch(rec)
    if warning:
        rec["warning"] = warning
    return rec


__all__ = ["bench"]
