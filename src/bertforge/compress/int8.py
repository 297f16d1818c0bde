"""INT8 for the CPU a graph will run on: schemes per host kind, a model of the AVX2 kernel, and an accuracy gate.

ONNX Runtime's dynamic INT8 (``quantize_dynamic``) quantizes activations to uint8 per call and weights offline.
How the integer product is computed depends on the CPU, and so does whether it is exact:

* **VNNI / AMX / ARM64** (``vpdpbusd``, ``tdpbusd``, ``udot``/``sdot``): u8×s8 products are summed in int32 —
  exact for 8-bit weights.
* **AVX2 without VNNI**: ONNX Runtime's u8×s8 kernel multiplies with ``vpmaddubsw``, which adds the products of
  two neighbouring K positions in *int16 with saturation* before widening to int32. With 8-bit weights a pair
  can reach 2·255·127 = 64 770 > 32 767: large activations (uint8 near 255, i.e. near the top of the dynamic
  range) meeting two large weights of one sign are clipped, and the output is wrong by up to a whole
  pair's value (:func:`matmul_u8s8_avx2` is a numpy model of that kernel). With 7-bit weights (|w| ≤ 64,
  ``reduce_range``) a pair is at most 2·255·64 = 32 640, so it never saturates (:func:`max_pair_sum`);
  u8×u8 kernels widen to int16 first (``vpmaddwd``) and are exact too.

:data:`SCHEMES` names those choices; :func:`default_scheme` picks one per target (:func:`host_target` reads the
CPU flags). :func:`gate` measures an INT8 graph against its FP32 graph on calibration batches (agreement of
labels, cosine of embeddings, agreement of spans) and, beyond ``max_drop``, keeps the most sensitive MatMuls in
FP32 (:func:`node_sensitivity`: each node's relative output error under the scheme, from the FP32 graph's
own activations), greedily, until the INT8 graph is within it. :func:`reference_run` runs a quantized
standard-op graph with ONNX's reference evaluator in exact integer arithmetic — or with the AVX2 model as
its MatMulInteger — which is how the tests check every host's INT8 against the scheme itself.

Static INT8 (``SCHEMES["s8s8-static"]``: int8 activations with scales fixed by calibration, QDQ format; min-max,
percentile or entropy calibration) is ``onnxruntime.quantization.quantize_static``.

References: ONNX Runtime quantization docs ("When and why do I need to try U8U8?", reduce_range);
Intel's ``vpmaddubsw`` / ``vpdpbusd`` definitions; Jacob et al. 2018 (affine integer quantization, eq. 1–7);
Wu et al. 2020, "Integer Quantization for Deep Learning Inference" §3–4 (per-channel scales, calibration) and
§5.1 (partial quantization: keep the most sensitive layers in floating point).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..errors import BertforgeError, ConfigError
from ..hardware import cpu_flags

INT16_MIN, INT16_MAX = -32768, 32767


# ------------------------------------------------------------------------------------------ schemes and hosts
@dataclass(frozen=True)
class Scheme:
    """One INT8 scheme. ``weight_bits``: 8, or 7 (``reduce_range``: weights in [−64, 64]); ``weight_signed``:
    int8 weights (symmetric) or uint8 (asymmetric); ``static``: activations quantized with calibrated scales
    (QDQ) instead of per call."""

    name: str
    weight_signed: bool = True
    reduce_range: bool = False
    static: bool = False
    about: str = ""

    @property
    def weight_bits(self) -> int:
        return 7 if self.reduce_range else 8

    @property
    def describe(self) -> str:
        w = f"{'int8' if self.weight_signed else 'uint8'} weights" + (", 7-bit reduce_range" if self.reduce_range
                                                                       else "")
        a = "int8 activations, calibrated (static QDQ)" if self.static else "uint8 activations per call (dynamic)"
        return f"{self.name}: {a}, {w}"


SCHEMES = {
    "u8s8": Scheme("u8s8", about="8-bit weights; exact on VNNI / AMX / ARM64 dot-product kernels"),
    "u8s8-7bit": Scheme("u8s8-7bit", reduce_range=True,
                        about="7-bit weights: no vpmaddubsw pair can exceed int16 (2·255·64 = 32 640)"),
    "u8u8": Scheme("u8u8", weight_signed=False, about="uint8 weights: AVX2 widens to int16 first (exact)"),
    "s8s8-static": Scheme("s8s8-static", static=True,
                          about="static QDQ: activation scales from calibration batches"),
}

#: the CPU kinds a graph can be quantized for (``quantize --target``)
TARGETS = ("avx2", "vnni", "amx", "arm64")
VNNI_FLAGS = ("avx512_vnni", "avx_vnni")
AMX_FLAGS = ("amx_int8",)
#: scheme per target: 8-bit wherever int32 dot products are exact; 7-bit on AVX2, where they saturate
DEFAULT_SCHEME = {"avx2": "u8s8-7bit", "vnni": "u8s8", "amx": "u8s8", "arm64": "u8s8"}
#: the schemes the gate tries, in order, before it keeps nodes in FP32 with the last one
FALLBACK_SCHEMES = {"avx2": ("u8s8-7bit", "u8u8"), "vnni": ("u8s8",), "amx": ("u8s8",), "arm64": ("u8s8",)}
CALIBRATION_METHODS = ("minmax", "percentile", "entropy")


def host_target(flags: Optional[Sequence[str]] = None) -> str:
    """The :data:`TARGETS` kind of a CPU from its flags (default: this machine's, :func:`cpu_flags`):
    ``amx`` (amx_int8), ``vnni`` (avx512_vnni / avx_vnni), ``arm64`` (ARM ``asimd`` features), else ``avx2``
    (any other x86, and a CPU whose flags cannot be read: the kind whose scheme is safe everywhere)."""
    flags = list(cpu_flags() if flags is None else flags)
    if any(f in flags for f in AMX_FLAGS):
        return "amx"
    if any(f in flags for f in VNNI_FLAGS):
        return "vnni"
    if "asimd" in flags and not any(f.startswith(("sse", "avx")) for f in flags):
        return "arm64"
    return "avx2"


def default_scheme(target: str) -> Scheme:
    """The scheme :data:`DEFAULT_SCHEME` gives ``target``. Raises ConfigError for an unknown target."""
    if target not in DEFAULT_SCHEME:
        raise ConfigError(f"--target {target!r}; choose one of {', '.join(TARGETS)}")
    return SCHEMES[DEFAULT_SCHEME[target]]


def get_scheme(name: str) -> Scheme:
    if name not in SCHEMES:
        raise ConfigError(f"--scheme {name!r}; choose one of {', '.join(SCHEMES)}")
    return SCHEMES[name]


def exact_on(scheme: Scheme, target: str) -> bool:
    """Whether ``target``'s kernels compute ``scheme``'s integer products exactly (no int16 saturation)."""
    return not (target == "avx2" and scheme.weight_signed and not scheme.reduce_range and not scheme.static)


# ------------------------------------------------------------------------- integer arithmetic, as ORT does it
def quantize_activation(x: np.ndarray) -> tuple:
    """ONNX ``DynamicQuantizeLinear``: uint8 with the range [min(x, 0), max(x, 0)] → (x_q uint8, scale,
    zero_point), round half to even. ``x``: any shape, float."""
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = (hi - lo) / 255.0 or 1.0
    zp = int(np.clip(np.rint(-lo / scale), 0, 255))
    return np.clip(np.rint(x / scale) + zp, 0, 255).astype(np.uint8), np.float32(scale), zp


def quantize_weight(w: np.ndarray, scheme: Scheme, per_channel: bool = True) -> tuple:
    """Weights (K, N) as ONNX Runtime quantizes a MatMul's B: int8 symmetric (±127, or ±64 with
    ``reduce_range``) or uint8 asymmetric, one scale per output column N (``per_channel``) or per matrix →
    (w_q, scale (N,) or (1,), zero_point like scale)."""
    axis = 0 if per_channel else None
    if scheme.weight_signed:
        qmax = 64 if scheme.reduce_range else 127
        amax = np.abs(w).max(axis=axis, keepdims=False)
        scale = np.where(amax > 0, amax / qmax, 1.0).astype(np.float32)
        wq = np.clip(np.rint(w / scale), -qmax, qmax).astype(np.int8)
        return wq, np.atleast_1d(scale), np.zeros_like(np.atleast_1d(scale), dtype=np.int32)
    qmax = 127 if scheme.reduce_range else 255
    lo = np.minimum(w.min(axis=axis), 0.0)
    hi = np.maximum(w.max(axis=axis), 0.0)
    scale = np.where(hi > lo, (hi - lo) / qmax, 1.0).astype(np.float32)
    zp = np.clip(np.rint(-lo / scale), 0, qmax).astype(np.int32)
    wq = np.clip(np.rint(w / scale) + zp, 0, qmax).astype(np.uint8)
    return wq, np.atleast_1d(scale), np.atleast_1d(zp)


def matmul_u8s8_avx2(a: np.ndarray, b: np.ndarray, a_zero_point: int = 0, b_zero_point=0) -> np.ndarray:
    """A numpy model of ONNX Runtime's AVX2 u8×s8 GEMM: ``vpmaddubsw`` adds the products of K positions
    (2j, 2j+1) in int16 with saturation, ``vpmaddwd`` then sums those pairs in int32; the zero points are
    subtracted afterwards (Σ_k a_k·b_k − a_zp·Σ_k b_k − …).

    a: (..., K) uint8; b: (K, N) int8 → (..., N) int32. Exact integer GEMM wherever no pair saturates.
    Source: Intel SDM, PMADDUBSW ("saturate to signed word"); MLAS QgemmU8S8KernelAvx2."""
    a32, b32 = a.astype(np.int32), b.astype(np.int32)
    k = a32.shape[-1]
    if k % 2:  # the kernel pads K with zeros to a multiple of its group
        a32 = np.concatenate([a32, np.zeros(a32.shape[:-1] + (1,), np.int32)], -1)
        b32 = np.concatenate([b32, np.zeros((1,) + b32.shape[1:], np.int32)], 0)
    pairs = a32[..., 0::2, None] * b32[0::2] + a32[..., 1::2, None] * b32[1::2]  # (..., K/2, N)
    acc = np.clip(pairs, INT16_MIN, INT16_MAX).sum(-2)
    bzp = np.asarray(b_zero_point, dtype=np.int32)
    acc = acc - int(a_zero_point) * b32[:k].sum(0)
    if np.any(bzp):
        acc = acc - a.astype(np.int32).sum(-1, keepdims=True) * bzp + k * int(a_zero_point) * bzp
    return acc.astype(np.int32)


def max_pair_sum(w_q: np.ndarray) -> int:
    """The largest |int16 pair sum| ``vpmaddubsw`` can form with these int8 weights (K, N) over all uint8
    activations: max over pairs of 255·max(Σ positive weights of the pair, |Σ negative weights|). A weight
    matrix is saturation-free on AVX2 when this is ≤ 32 767 (always so for 7-bit weights)."""
    w = w_q.astype(np.int64)
    if w.shape[0] % 2:
        w = np.concatenate([w, np.zeros((1, w.shape[1]), np.int64)])
    pos = np.clip(w[0::2], 0, None) + np.clip(w[1::2], 0, None)
    neg = np.clip(w[0::2], None, 0) + np.clip(w[1::2], None, 0)
    return int(255 * max(pos.max(initial=0), -neg.min(initial=0)))


# ------------------------------------------------------------------------------------ quantizing a graph
def quantize_graph(src, dst, scheme: Scheme, per_channel: bool = True, exclude: Sequence[str] = (),
                   batches: Optional[list] = None, calibration: str = "minmax") -> None:
    """``src`` (FP32 ONNX) → ``dst`` with ``scheme`` (:data:`SCHEMES`); the node names in ``exclude`` stay
    FP32. Static schemes need ``batches`` ({input name: (B, T) int64}) for ``calibration`` (min-max,
    percentile or entropy; ONNX Runtime's calibrators)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    logging.getLogger().setLevel(logging.ERROR)  # the quantizer warns about pre-processing via the root logger
    tmp = Path(dst).with_name(f".{Path(dst).name}.tmp")
    wtype = QuantType.QInt8 if scheme.weight_signed else QuantType.QUInt8
    if scheme.static:
        _quantize_static(src, tmp, per_channel, exclude, batches, calibration)
    else:
        # contrib ops (Attention, SkipLayerNormalization…) defeat ONNX shape inference: tensors are float
        quantize_dynamic(str(src), str(tmp), weight_type=wtype, per_channel=per_channel,
                         reduce_range=scheme.reduce_range, nodes_to_exclude=list(exclude),
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    tmp.replace(dst)


def _quantize_static(src, tmp, per_channel, exclude, batches, calibration) -> None:
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    if not batches:
        raise ConfigError("static INT8 needs calibration texts; pass --calib FILE or --eval FILE")
    if calibration not in CALIBRATION_METHODS:
        raise ConfigError(f"--calibration {calibration!r}; choose one of {', '.join(CALIBRATION_METHODS)}")
    method = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
              "entropy": CalibrationMethod.Entropy}[calibration]

    # the percentile / entropy calibrators stack every call's tensors: one row per call, one common length
    t = max(b["input_ids"].shape[1] for b in batches)
    rows = [{k: np.pad(v[i:i + 1], ((0, 0), (0, t - v.shape[1]))) for k, v in b.items()}
            for b in batches for i in range(len(b["input_ids"]))]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(rows)

        def get_next(self):
            return next(self.it, None)

    import contextlib
    import sys
    with contextlib.redirect_stdout(sys.stderr):  # ORT's calibrators print progress; stdout is the verb's JSON
        quantize_static(str(src), str(tmp), Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                        nodes_to_exclude=list(exclude), calibrate_method=method,
                        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})


def quantizable_nodes(graph) -> list:
    """(node name, activation input, weight initializer) of every node ONNX Runtime's INT8 quantizes with a
    constant weight: MatMul with a constant B, and the fused Attention (its packed QKV weight)."""
    inits = {t.name for t in graph.initializer}
    out = []
    for n in graph.node:
        if n.op_type in ("MatMul", "Attention") and len(n.input) > 1 and n.input[1] in inits:
            out.append((n.name, n.input[0], n.input[1]))
    return out


def _with_outputs(model, names: list):
    import onnx
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for nm in names:
        if nm not in have:
            m.graph.output.append(onnx.helper.make_empty_tensor_value_info(nm))
            have.add(nm)
    return m


def node_sensitivity(fp32_path, batches: list, scheme: Scheme, target: str, per_channel: bool = True,
                     max_rows: int = 4096) -> list:
    """Per quantizable node of the FP32 graph: the relative output error ‖x̂Ŵ − xW‖ / ‖xW‖ when its input x
    (this graph's own activations on ``batches``) and weight W are quantized with ``scheme`` as ``target``
    computes them (:func:`matmul_u8s8_avx2` where the target's kernel saturates) — most sensitive first.

    Returns [{"node", "rel_error", "saturated_pairs"}]. ``max_rows``: activation rows sampled per node."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper
    model = onnx.load(str(fp32_path))
    nodes = quantizable_nodes(model.graph)
    if not nodes:
        return []
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    probe = _with_outputs(model, sorted({x for _, x, _ in nodes}))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep the probed tensors
    sess = ort.InferenceSession(probe.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    acts = {x: [] for _, x, _ in nodes}
    for feed in batches:
        outs = dict(zip(names, sess.run(None, feed)))
        for x in acts:
            acts[x].append(outs[x].reshape(-1, outs[x].shape[-1]))
    saturating = not exact_on(scheme, target)
    rng = np.random.default_rng(0)
    report = []
    for name, x_name, w_name in nodes:
        w = weights[w_name].astype(np.float32)
        errs, sat, ref_sq = 0.0, 0, 0.0
        for x in acts[x_name]:  # one quantization per call, as at run time
            if x.shape[0] > max_rows:
                x = x[rng.choice(x.shape[0], max_rows, replace=False)]
            y = x.astype(np.float64) @ w.astype(np.float64)
            xq, xs, xz = quantize_activation(x)
            wq, ws, wz = quantize_weight(w, scheme, per_channel)
            if saturating:
                acc = matmul_u8s8_avx2(xq, wq, xz)
                exact = (xq.astype(np.int64) - xz) @ wq.astype(np.int64)
                sat += int((acc != exact).sum())
            else:
                acc = (xq.astype(np.int64) - xz) @ (wq.astype(np.int64) - wz)
            yq = acc.astype(np.float64) * float(xs) * ws.astype(np.float64)
            errs += float(((yq - y) ** 2).sum())
            ref_sq += float((y ** 2).sum())
        report.append({"node": name, "rel_error": float(np.sqrt(errs / max(ref_sq, 1e-30))),
                       "saturated_outputs": sat})
    return sorted(report, key=lambda r: -r["rel_error"])


# ------------------------------------------------------------------------------------- agreement (the gate)
#: what the gate compares per kind of output, and its unit
AGREEMENT = {"classification": "label agreement (%)", "multi_label_classification": "label decisions agreeing (%)",
             "regression": "Spearman ρ × 100 of the outputs", "token_classification": "entity-span F1 × 100 "
             "(tags where labels are not BIO)", "question_answering": "answer spans agreeing (%)",
             "base": "cosine × 100 of the pooled embeddings (mean over texts)"}


def agreement(kind: str, ref: np.ndarray, got: np.ndarray, mask: np.ndarray, *, labels: Optional[list] = None,
              thresholds=None, pooling: str = "mean") -> float:
    """How far an INT8 output agrees with the FP32 one, on a 0–100 scale (100 = the same answers); see
    :data:`AGREEMENT`. ``ref``/``got``: the graphs' main outputs — (B, C) logits, (B, T, C) token logits,
    (B, T, 2) QA logits or (B, T, H) hidden states; ``mask``: (B, T) attention mask."""
    m = mask.astype(bool)
    if kind == "classification":
        return float(100.0 * (ref.argmax(-1) == got.argmax(-1)).mean())
    if kind == "multi_label_classification":
        t = 0.5 if thresholds is None else np.asarray(thresholds, dtype=np.float64)
        sig = lambda z: 1.0 / (1.0 + np.exp(-z.astype(np.float64)))  # noqa: E731
        return float(100.0 * ((sig(ref) >= t) == (sig(got) >= t)).mean())
    if kind == "regression":
        from scipy.stats import spearmanr
        a, b = ref.reshape(len(ref), -1)[:, 0], got.reshape(len(got), -1)[:, 0]
        if np.ptp(a) == 0:
            return 100.0 if np.allclose(a, b) else 0.0
        return float(100.0 * spearmanr(a, b).statistic)
    if kind == "token_classification":
        tr, tg = ref.argmax(-1), got.argmax(-1)
        if labels and any(str(lab).startswith(("B-", "I-")) for lab in labels):
            from seqeval.metrics import f1_score
            seq = lambda t: [[str(labels[i]) for i in row[mm]] for row, mm in zip(t, m)]  # noqa: E731
            gold = seq(tr)
            if not any(lab != "O" for s in gold for lab in s):
                return float(100.0 * (tr[m] == tg[m]).mean())
            return float(100.0 * f1_score(gold, seq(tg)))
        return float(100.0 * (tr[m] == tg[m]).mean())
    if kind == "question_answering":
        def span(z):
            neg = np.where(m, 0.0, -1e9)
            return np.stack([(z[..., 0] + neg).argmax(-1), (z[..., 1] + neg).argmax(-1)], -1)
        return float(100.0 * (span(ref) == span(got)).all(-1).mean())
    # embeddings (a head-less encoder): pool as the dir declares, then cosine
    if ref.ndim == 3:
        if pooling == "cls":
            ref, got = ref[:, 0], got[:, 0]
        else:
            w = m[..., None].astype(np.float64)
            ref = (ref * w).sum(1) / w.sum(1).clip(1)
            got = (got * w).sum(1) / w.sum(1).clip(1)
    ref = ref.reshape(len(ref), -1).astype(np.float64)
    got = got.reshape(len(got), -1).astype(np.float64)
    cos = (ref * got).sum(-1) / (np.linalg.norm(ref, axis=-1) * np.linalg.norm(got, axis=-1)).clip(1e-12)
    return float(100.0 * cos.mean())


@dataclass
class GateSpec:
    """What the accuracy gate needs: calibration ``batches`` ({input name: (B, T) int64}), the output ``kind``
    (:data:`AGREEMENT`'s keys), ``max_drop`` (points of agreement, 0–100), the calibration method of static
    schemes, and what :func:`agreement` reads: label names (NER spans), thresholds (multi-label), pooling
    (embeddings)."""

    batches: list
    kind: str
    max_drop: float = 1.0
    calibration: str = "minmax"
    labels: Optional[list] = None
    thresholds: Optional[list] = None
    pooling: str = "mean"

    def agreement_kw(self) -> dict:
        return {"labels": self.labels, "thresholds": self.thresholds, "pooling": self.pooling}


@dataclass
class GateResult:
    """What :func:`gate` settled on: the scheme, the FP32-kept nodes, the agreement measured (0–100) and the
    tries that led there (one dict per quantized graph measured)."""

    scheme: str
    kept_fp32: list
    agreement: float
    drop: float
    metric: str
    n_texts: int
    tries: list = field(default_factory=list)
    sensitivity: list = field(default_factory=list)

    def record(self) -> dict:
        return {"scheme": self.scheme, "metric": self.metric, "agreement": round(self.agreement, 4),
                "drop": round(self.drop, 4), "kept_fp32": self.kept_fp32, "calibration_texts": self.n_texts,
                "tries": self.tries, "most_sensitive": self.sensitivity[:5]}


def _outputs(path, batches: list, threads: Optional[int] = None) -> list:
    from .ort import session
    sess = session(path, threads)
    names = {i.name for i in sess.get_inputs()}
    return [sess.run(None, {k: v for k, v in feed.items() if k in names})[0] for feed in batches]


def measure(fp32_out: list, int8_path, batches: list, kind: str, **kw) -> float:
    """:func:`agreement` of ``int8_path``'s outputs with ``fp32_out`` over all ``batches`` (weighted by rows)."""
    got = _outputs(int8_path, batches)
    total, rows = 0.0, 0
    for ref, g, feed in zip(fp32_out, got, batches):
        n = len(ref)
        total += agreement(kind, ref, g, feed["attention_mask"], **kw) * n
        rows += n
    return total / max(rows, 1)


def gate(fp32_path, dst, schemes: Sequence[Scheme], target: str, batches: list, kind: str, max_drop: float,
         per_channel: bool = True, max_fp32_fraction: float = 0.5, calibration: str = "minmax",
         **agree_kw) -> GateResult:
    """Quantize ``fp32_path`` → ``dst`` with the first of ``schemes`` whose INT8 graph agrees with the FP32
    graph within ``max_drop`` points (:func:`agreement`, 100 − agreement ≤ ``max_drop``) on ``batches``;
    where none does, keep the most sensitive nodes (:func:`node_sensitivity` under the scheme that agreed best)
    in FP32,
    one more at a time (1, 2, 4, … nodes), until it does.

    Raises:
        BertforgeError: no scheme meets ``max_drop`` with at most ``max_fp32_fraction`` of the quantizable
            nodes in FP32 (``dst`` is not written)."""
    import onnx
    fp32_out = _outputs(fp32_path, batches)
    n_texts = sum(len(o) for o in fp32_out)
    n_nodes = len(quantizable_nodes(onnx.load(str(fp32_path), load_external_data=False).graph))
    tries = []

    def attempt(scheme, exclude):
        quantize_graph(fp32_path, dst, scheme, per_channel, exclude, batches, calibration)
        a = measure(fp32_out, dst, batches, kind, **agree_kw)
        tries.append({"scheme": scheme.name, "kept_fp32": len(exclude), "agreement": round(a, 4)})
        return a

    metric = AGREEMENT.get(kind, AGREEMENT["base"])
    scores = []
    for s in schemes:
        a = attempt(s, [])
        if 100.0 - a <= max_drop:
            return GateResult(s.name, [], a, 100.0 - a, metric, n_texts, tries)
        scores.append(a)
    last = schemes[int(np.argmax(scores))]  # FP32 nodes are added to the scheme that agreed best
    sens = node_sensitivity(fp32_path, batches, last, target, per_channel)
    order = [r["node"] for r in sens]
    k, limit = 1, int(max_fp32_fraction * n_nodes)
    best = (a, 0)
    while k <= limit:
        a = attempt(last, order[:k])
        best = max(best, (a, k))
        if 100.0 - a <= max_drop:
            return GateResult(last.name, order[:k], a, 100.0 - a, metric, n_texts, tries, sens)
        if k == limit:
            break
        k = min(2 * k, limit)
    Path(dst).unlink(missing_ok=True)
    raise BertforgeError(f"no INT8 scheme meets --max-drop {max_drop:g} on {n_texts} calibration texts: the best "
                         f"{metric} is {best[0]:.2f} (drop {100 - best[0]:.2f}) with {best[1]} of {n_nodes} "
                         f"MatMuls kept in FP32 ({', '.join(s.name for s in schemes)} tried); raise --max-drop "
                         f"or keep the model in FP32 (`bertforge export`)")


# ------------------------------------------------------------------------------ a reference run of a graph
def reference_run(int8_path, feed: dict, kernel: str = "exact") -> np.ndarray:
    """The first output of a quantized standard-op graph (an export with ``fused=False``, e.g. ModernBERT)
    computed by ONNX's reference evaluator: MatMulInteger in exact int64 (``kernel="exact"``, the scheme's
    own arithmetic) or as the AVX2 u8×s8 kernel computes it (``kernel="avx2"``, :func:`matmul_u8s8_avx2`).
    ``feed``: {input name: (B, T) int64 array}. Slow (numpy); for checks on small models.

    Raises:
        BertforgeError: the graph holds contrib ops the evaluator has no implementation of (QAttention…)."""
    import onnx
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import OpRun

    class Gelu(OpRun):  # com.microsoft::Gelu, written by ORT's optimizer: the exact (erf) GELU
        op_domain = "com.microsoft"

        def _run(self, x, approximate=None):
            from scipy.special import erf
            return ((0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))).astype(x.dtype),)

    class MatMulInteger(OpRun):
        op_domain = ""

        def _run(self, a, b, a_zero_point=None, b_zero_point=None):
            azp = 0 if a_zero_point is None else int(np.asarray(a_zero_point).reshape(-1)[0])
            bzp = 0 if b_zero_point is None else np.asarray(b_zero_point).astype(np.int64)
            if a.dtype == np.uint8 and b.dtype == np.int8 and not np.any(bzp):
                return (matmul_u8s8_avx2(a, b, azp),)
            return ((a.astype(np.int64) - azp) @ (b.astype(np.int64) - bzp)).astype(np.int32),

    model = onnx.load(str(int8_path))
    for o in model.opset_import:  # the evaluator implements DequantizeLinear from opset 19 (same semantics here)
        if o.domain in ("", "ai.onnx") and o.version < 19:
            o.version = 19
    ops = [Gelu] + ([MatMulInteger] if kernel == "avx2" else [])
    names = {i.name for i in model.graph.input}
    try:
        ev = ReferenceEvaluator(model, new_ops=ops)
    except (RuntimeError, NotImplementedError) as e:
        raise BertforgeError(f"the reference evaluator cannot run {int8_path} ({str(e).splitlines()[0][:120]}); "
                             f"export with fused=False") from None
    return ev.run(None, {k: np.asarray(v, dtype=np.int64) for k, v in feed.items() if k in names})[0]


__all__ = ["SCHEMES", "TARGETS", "Scheme", "host_target", "default_scheme", "get_scheme", "exact_on",
           "quantize_activation", "quantize_weight", "matmul_u8s8_avx2", "max_pair_sum", "quantize_graph",
           "quantizable_nodes", "node_sensitivity", "agreement", "gate", "GateSpec", "GateResult", "reference_run"]
