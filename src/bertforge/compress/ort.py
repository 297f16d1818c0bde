"""The one place ONNX Runtime sessions are made (CPU provider, graph optimisations, threads, load errors).

Used by export checks (:mod:`bertforge.compress.onnx`), the INT8 gate (:mod:`bertforge.compress.int8`) and
the runner for exported graphs (:class:`bertforge.runtime.onnx.OnnxRunner`).
"""
from __future__ import annotations

from typing import Optional

from ..errors import CheckpointError

#: ONNX Runtime's own (session-level) fusions that :func:`session` leaves off. ``SkipLayerNormFusion``: its
#: SkipLayerNormalization kernel took 4x the time of the Add + LayerNormalization it replaces (onnxruntime
#: 1.32, 2 threads, 128 tokens, AVX2-only AMD host: 125 vs 34 us at hidden 312, 305 vs 72 us at 768, each
#: the median of 200 runs of a chain of 20); on a TinyBERT-4 INT8 graph it fused one residual of the 8.
SESSION_DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)


def session(path, threads: Optional[int] = None):
    """An ``onnxruntime.InferenceSession`` on CPU with all graph optimisations on except
    :data:`SESSION_DISABLED_OPTIMIZERS`, ``threads`` intra-op threads (None: ONNX Runtime's default). The
    one place session options are chosen: :func:`parity` checks an export with it, and
    :class:`bertforge.runtime.onnx.OnnxRunner` (the runner for exported graphs) serves with it.

    Raises:
        CheckpointError: ONNX Runtime cannot load ``path`` (corrupt or foreign graph)."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        so.intra_op_num_threads = threads
    so.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=list(SESSION_DISABLED_OPTIMIZERS))
    except Exception as e:  # onnxruntime raises its own Fail / InvalidProtobuf / InvalidGraph classes
        first = (str(e).strip().splitlines() or [type(e).__name__])[-1][:160]
        raise CheckpointError(f"ONNX Runtime cannot load {path} ({first}); re-create it with "
                              f"`bertforge export` or `bertforge quantize`") from None


__all__ = ["SESSION_DISABLED_OPTIMIZERS", "session"]
