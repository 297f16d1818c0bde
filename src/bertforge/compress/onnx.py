"""ONNX export, ONNX Runtime transformer graph optimisation and ONNX Runtime dynamic INT8.

:func:`export_onnx` traces an export view of a :class:`~bertforge.task_model.TaskModel` (same weights, same
math) with the TorchScript exporter of :func:`torch.onnx.export`, inputs ``input_ids`` / ``attention_mask``
(/ ``token_type_ids``), all (batch, sequence) with dynamic axes, output ``logits`` (or
``last_hidden_state`` for a head-less encoder). Differences from a plain export of the eager model:

* the padding mask is always in the graph (the eager model skips it when nothing is padded, which a trace
  would freeze);
* ``fused=True`` (default) emits each self-attention block as one ONNX Runtime contrib op
  ``com.microsoft::Attention`` whose packed weight is exactly our fused ``qkv`` (H → [Q; K; V]); pruned layers
  pass their own width via ``qkv_hidden_sizes``, and a layer without heads is left out (its block is the
  output bias only). ``fused=False`` writes standard ONNX ops only (runs anywhere);
* for heads that read only [CLS] (sequence classification), the last block computes only position 0
  (``com.microsoft::MultiHeadAttention`` with one query): the logits are the same, the last layer's FFN
  and output projection run on 1 token instead of T.

:func:`optimize_onnx` then runs ``onnxruntime.transformers.optimizer.optimize_model(model_type="bert")``
(graph clean-up; SkipLayerNormalization / BiasGelu / EmbedLayerNormalization fusions only with
``fusions="all"``, see :data:`FUSIONS`), and
:func:`bertforge.compress.int8.quantize_graph` (``onnxruntime.quantization.quantize_dynamic``: INT8 weights,
activations quantized per call; MatMul → MatMulInteger/DynamicQuantizeMatMul, Attention → QAttention), with
the scheme of the CPU kind the graph is for.

References: ONNX Runtime transformer optimizer and quantization docs (onnxruntime.ai/docs/performance/
transformers-optimization.html, …/model-optimizations/quantization.html); Zafrir et al. 2019 (Q8BERT) and
Kim et al. 2021 (I-BERT) for INT8 BERT inference.
"""
from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..checkpoint.write import config_to_hf
from ..errors import BertforgeError, CheckpointError, ConfigError
from ..hardware import cpu_flags
from ..io import atomic_dir, atomic_write_text
from ..models.mobilebert import MobileBertEncoder
from ..models.modernbert import ModernBertEncoder
from ..models.output import EncoderOutput
from ..tokenizer import copy_tokenizer_files
from .ort import SESSION_DISABLED_OPTIMIZERS, session  # noqa: F401  (the one session factory; re-exported)

OPSET = 17
MASK_FILTER = -10000.0


# ------------------------------------------------------------------------ contrib ops for the tracer
def _typed_like(out, x):
    """Give a contrib-op output x's dtype and rank (last dim unknown) for the exporter's shape inference."""
    try:
        t = x.type()
        out.setType(t.with_sizes([None] * (t.dim() or 3)))
    except Exception:  # older/newer tracer APIs: ORT infers the shape itself
        pass
    return out


class _Attention(torch.autograd.Function):
    """com.microsoft::Attention: x (B,T,H), w (H, 3·inner), b (3·inner,), mask (B,T) int32 → (B,T,inner)."""

    @staticmethod
    def forward(ctx, x, w, b, mask, num_heads: int):
        bsz, t, _ = x.shape
        inner = w.shape[1] // 3
        d = inner // num_heads
        q, k, v = (x @ w + b).split(inner, dim=-1)
        q, k, v = (z.view(bsz, t, num_heads, d).transpose(1, 2) for z in (q, k, v))
        bias = (1.0 - mask.to(x.dtype))[:, None, None, :] * MASK_FILTER
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return o.transpose(1, 2).reshape(bsz, t, inner)

    @staticmethod
    def symbolic(g, x, w, b, mask, num_heads):
        out = g.op("com.microsoft::Attention", x, w, b, mask, num_heads_i=num_heads,
                   mask_filter_value_f=MASK_FILTER)
        return _typed_like(out, x)


class _MultiHeadAttention(torch.autograd.Function):
    """com.microsoft::MultiHeadAttention: q (B,Tq,inner), k/v (B,T,inner) before bias, bias (3·inner,),
    key padding mask (B,T) int32 → (B,Tq,inner)."""

    @staticmethod
    def forward(ctx, q, k, v, b, mask, num_heads: int):
        bsz, tq, inner = q.shape
        t, d = k.shape[1], inner // num_heads
        bq, bk, bv = b.split(inner)
        q = (q + bq).view(bsz, tq, num_heads, d).transpose(1, 2)
        k = (k + bk).view(bsz, t, num_heads, d).transpose(1, 2)
        v = (v + bv).view(bsz, t, num_heads, d).transpose(1, 2)
        bias = (1.0 - mask.to(q.dtype))[:, None, None, :] * MASK_FILTER
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return o.transpose(1, 2).reshape(bsz, tq, inner)

    @staticmethod
    def symbolic(g, q, k, v, b, mask, num_heads):
        out = g.op("com.microsoft::MultiHeadAttention", q, k, v, b, mask,
                   num_heads_i=num_heads, mask_filter_value_f=MASK_FILTER)
        return _typed_like(out, q)


def _plain_attention(x_q, x_kv, att, mask_f):
    """Standard-op attention (MatMul/Softmax) with the additive mask always applied."""
    n, d = att.num_heads, att.head_dim
    inner = n * d
    w, b = att.qkv.weight, att.qkv.bias
    q = F.linear(x_q, w[:inner], b[:inner])
    k = F.linear(x_kv, w[inner:2 * inner], b[inner:2 * inner])
    v = F.linear(x_kv, w[2 * inner:], b[2 * inner:])
    bsz, tq, tk = x_q.shape[0], x_q.shape[1], x_kv.shape[1]
    q = q.view(bsz, tq, n, d).transpose(1, 2)
    k = k.view(bsz, tk, n, d).transpose(1, 2)
    v = v.view(bsz, tk, n, d).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d) + ((1.0 - mask_f) * MASK_FILTER)[:, None, None, :]
    o = torch.softmax(scores, -1) @ v
    return o.transpose(1, 2).reshape(bsz, tq, inner)


class ExportView(nn.Module):
    """The forward pass of a TaskModel written for tracing (same parameters, same math; see module doc).

    ``forward(input_ids (B,T), attention_mask (B,T), token_type_ids (B,T) optional)`` → logits (B, C)
    (or (B,T,·) for token-level heads) / last_hidden_state (B,T,H) for ``head='base'``.
    """

    def __init__(self, model, fused: bool = True, cls_only: Optional[bool] = None):
        super().__init__()
        self.model = model
        self.enc = model.encoder
        self.fused = fused
        head = model.head
        self.cls_only = bool(head is not None and head.cls_only) if cls_only is None else cls_only

    def _attend(self, att, x, mask_i, mask_f, last_cls: bool):
        n, d = att.num_heads, att.head_dim
        inner = n * d
        xq = x[:, :1] if last_cls else x
        if not self.fused:
            return att.out(_plain_attention(xq, x, att, mask_f))
        w, b = att.qkv.weight, att.qkv.bias
        if last_cls:
            q = F.linear(xq, w[:inner])
            k = F.linear(x, w[inner:2 * inner])
            v = F.linear(x, w[2 * inner:])
            ctx = _MultiHeadAttention.apply(q, k, v, b, mask_i, n)
        else:
            ctx = _Attention.apply(x, w.t(), b, mask_i, n)
        return att.out(ctx)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        enc = self.enc
        if isinstance(enc, ModernBertEncoder):
            return self._forward_modernbert(input_ids, attention_mask)
        if isinstance(enc, MobileBertEncoder):
            return self._forward_mobilebert(input_ids, attention_mask, token_type_ids)
        if getattr(enc, "relative_attention_bias", None) is not None:
            return self._forward_mpnet(input_ids, attention_mask)
        x = enc.embeddings(input_ids, token_type_ids)
        mask_i = attention_mask.to(torch.int32)
        mask_f = attention_mask.to(x.dtype)
        n_layers = len(enc.layers)
        for i, lyr in enumerate(enc.layers):
            last_cls = self.cls_only and i == n_layers - 1
            att = lyr.attention
            if att.num_heads == 0:
                a = att.out.bias
                if last_cls:
                    x = x[:, :1]
            else:
                a = self._attend(att, x, mask_i, mask_f, last_cls)
                if last_cls:
                    x = x[:, :1]
            x = lyr.attention_norm(x + a)
            x = lyr.ffn_norm(x + lyr.ffn(x))
        pooled = torch.tanh(enc.pooler(x[:, 0])) if enc.pooler is not None else None
        if self.model.head is None:
            return x
        out = self.model.head(EncoderOutput(last_hidden_state=x, pooler_output=pooled),
                              {"attention_mask": attention_mask, "input_ids": input_ids})
        return out["logits"]


    def _forward_mpnet(self, input_ids, attention_mask):
        """MPNet (:class:`~bertforge.models.encoder.Encoder` with its relative position bias) in standard ops:
        the bucketed bias computed from the sequence length once, added to the padding mask (−10⁴ additive, as
        :func:`_plain_attention`), the attention product written out (MatMul/Softmax) at every position."""
        enc = self.enc
        x = enc.embeddings(input_ids)
        pad = ((1.0 - attention_mask.to(x.dtype)) * MASK_FILTER)[:, None, None, :]  # (B, 1, 1, T)
        pos = enc.position_bias(input_ids.shape[1], input_ids.device)
        for i, lyr in enumerate(enc.layers):
            a = lyr.attention(x, enc.layer_bias(pad, pos, i), explicit=True)[0]
            x = lyr.attention_norm(x + a)
            x = lyr.ffn_norm(x + lyr.ffn(x))
        if self.model.head is None:
            return x
        out = self.model.head(EncoderOutput(last_hidden_state=x), {"attention_mask": attention_mask,
                                                                   "input_ids": input_ids})
        return out["logits"]

    def _forward_modernbert(self, input_ids, attention_mask):
        """ModernBERT (:mod:`bertforge.models.modernbert`) in standard ops: padded, the padding and window
        masks always in the graph (−10⁴ additive, as :func:`_plain_attention`), RoPE tables computed from the
        sequence length, the attention product written out (MatMul/Softmax)."""
        enc = self.enc
        x = enc.embeddings(input_ids)
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        pad = ((1.0 - attention_mask.to(x.dtype)) * MASK_FILTER)[:, None, None, :]  # (B, 1, 1, T)
        outside = ((pos[:, None] - pos[None, :]).abs() > enc.config.local_attention // 2).to(x.dtype)
        inputs = {"full_attention": (pad, enc.rotary(pos[None], "full_attention", x.dtype)),
                  "sliding_attention": (pad + outside * MASK_FILTER,
                                        enc.rotary(pos[None], "sliding_attention", x.dtype))}
        for lyr in enc.layers:
            bias, rope = inputs[lyr.attention_type]
            a = lyr.attention(lyr.attention_norm(x), bias, explicit=True, rope=rope)[0]
            x = x + a
            x = x + lyr.ffn(lyr.ffn_norm(x))
        x = enc.final_norm(x)
        if self.model.head is None:
            return x
        out = self.model.head(EncoderOutput(last_hidden_state=x),
                              {"attention_mask": attention_mask, "input_ids": input_ids})
        return out["logits"]


    def _forward_mobilebert(self, input_ids, attention_mask, token_type_ids=None):
        """MobileBERT (:mod:`bertforge.models.mobilebert`) in standard ops: padded, the padding mask always in
        the graph (−10⁴ additive, as :func:`_plain_attention`), the attention product written out."""
        enc = self.enc
        x = enc.embeddings(input_ids, token_type_ids)
        bias = ((1.0 - attention_mask.to(x.dtype)) * MASK_FILTER)[:, None, None, :]  # (B, 1, 1, T)
        for lyr in enc.layers:
            x = lyr(x, bias, explicit=True)[0]
        pooled = torch.tanh(enc.pooler(x[:, 0])) if enc.pooler is not None else None
        if self.model.head is None:
            return x
        out = self.model.head(EncoderOutput(last_hidden_state=x, pooler_output=pooled),
                              {"attention_mask": attention_mask, "input_ids": input_ids})
        return out["logits"]


def input_names(model) -> list:
    names = ["input_ids", "attention_mask"]
    if model.config.type_vocab_size > 0:
        names.append("token_type_ids")
    return names


def output_name(model) -> str:
    return "last_hidden_state" if model.head is None else "logits"


def dummy_inputs(model, batch: int = 2, seq: int = 16, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, model.config.vocab_size, (batch, seq), generator=g)
    am = torch.ones(batch, seq, dtype=torch.long)
    if batch > 1:
        am[-1, seq // 2:] = 0  # one padded row, so the mask is exercised
    out = {"input_ids": ids, "attention_mask": am}
    if model.config.type_vocab_size > 0:
        out["token_type_ids"] = torch.zeros(batch, seq, dtype=torch.long)
    return out


def export_onnx(model, path, fused: bool = True, cls_only: Optional[bool] = None,
                opset: int = OPSET) -> Path:
    """Write ``model`` (FP32, eval mode) to ``path`` as ONNX with dynamic batch and sequence axes.

    Raises:
        BertforgeError: the exporter failed (message names the first line of its error).
    """
    path = Path(path)
    model = model.eval().float()
    if model.config.model_type in ("modernbert", "mobilebert", "mpnet"):
        fused, cls_only = False, False  # standard ops; every position (RoPE, local windows; bottleneck blocks; MPNet's bias)
    view = ExportView(model, fused=fused, cls_only=cls_only).eval()
    names = input_names(model)
    dummy = dummy_inputs(model)
    args = tuple(dummy[n] for n in names)
    out_name = output_name(model)
    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    per_sequence = model.head is not None and (view.cls_only or model.head_name == "sequence_classification")
    axes[out_name] = {0: "batch"} if per_sequence else {0: "batch", 1: "sequence"}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(view, args, str(tmp), input_names=names, output_names=[out_name],
                              dynamic_axes=axes, opset_version=opset, do_constant_folding=True,
                              dynamo=False)
        tmp.replace(path)
    except Exception as e:
        tmp.unlink(missing_ok=True)
        raise BertforgeError(f"ONNX export failed ({str(e).splitlines()[0][:200]}); "
                             f"try --no-fused") from None
    return path


#: ORT transformer-optimizer fusion sets. ``lean`` (default) keeps our Attention / MultiHeadAttention ops and
#: the optimizer's graph clean-ups but leaves Add+LayerNormalization, bias+Gelu and the embedding sum
#: unfused: on the 2-core AVX-512/AMX CPU of our benchmarks (onnxruntime 1.32) the fused
#: SkipLayerNormalization / BiasGelu kernels were slower than the separate ops (TinyBERT-4 INT8, 1 thread:
#: p50 20.9 ms lean vs 30.2 ms all vs 30.4 ms plain export, 8 interleaved rounds in one development run).
#: ``all`` enables every fusion.
FUSIONS = {"lean": {"enable_skip_layer_norm": False, "enable_bias_skip_layer_norm": False,
                    "enable_bias_gelu": False, "enable_embed_layer_norm": False},
           "all": {}}


def optimize_onnx(src, dst, fused: bool = True, fusions: str = "lean") -> dict:
    """``onnxruntime.transformers.optimizer.optimize_model(model_type="bert")`` on ``src`` → ``dst``.

    ``fusions``: a key of :data:`FUSIONS`. On a graph exported with ``fused=False`` the
    EmbedLayerNormalization fusion is always off (there it mis-matches and the output drifts by ~1e-2).
    Returns the fused-operator statistics. Raises BertforgeError for an unknown ``fusions``."""
    import logging
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model
    if fusions not in FUSIONS:
        raise BertforgeError(f"--fusions {fusions!r}; choose one of {', '.join(FUSIONS)}")
    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    options = FusionOptions("bert")
    for k, v in FUSIONS[fusions].items():
        setattr(options, k, v)
    if not fused:
        options.enable_embed_layer_norm = False
    opt = optimize_model(str(src), model_type="bert", optimization_options=options)
    stats = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
    tmp = Path(dst).with_name(f".{Path(dst).name}.tmp")
    opt.save_model_to_file(str(tmp))
    tmp.replace(dst)
    return stats


def needs_reduce_range(flags: Optional[list] = None) -> bool:
    """Whether this CPU's INT8 GEMM may saturate with 8-bit weights: True on x86 without VNNI/AMX, whose
    u8×s8 kernel sums pairs of products in int16 (``vpmaddubsw``; see :mod:`bertforge.compress.int8`, whose
    :func:`~bertforge.compress.int8.host_target` is the rule). ``flags``: default this CPU's."""
    from .int8 import host_target
    flags = cpu_flags() if flags is None else flags
    return any(f.startswith(("sse", "avx")) for f in flags) and host_target(flags) == "avx2"


#: the CPU flags an INT8 record names (what decides the kernels ONNX Runtime picks)
INT8_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8", "amx_tile", "asimd", "asimddp")


def run_session(sess, inputs: dict) -> np.ndarray:
    """The first output of ``sess`` on ``inputs`` ({name: (B, T) int tensor or array}; the names the graph
    does not declare are left out), for export checks; models are run by :mod:`bertforge.runtime`."""
    names = {i.name for i in sess.get_inputs()}
    feed = {k: (v.numpy() if torch.is_tensor(v) else v).astype(np.int64) for k, v in inputs.items()
            if k in names}
    return sess.run(None, feed)[0]


def parity(model, onnx_path, batch: int = 2, seq: int = 16) -> float:
    """Max |ONNX Runtime − PyTorch| on the output for a padded random batch (valid positions only)."""
    inputs = dummy_inputs(model, batch, seq, seed=1)
    with torch.no_grad():
        out = model.eval()(**inputs)
    ref = (out.logits if model.head is not None else out.last_hidden_state).float().numpy()
    got = run_session(session(onnx_path), inputs)
    m = inputs["attention_mask"].numpy().astype(bool)
    token_level = model.head is None or not model.head.cls_only  # (B, T, …) outputs, e.g. NER, QA, RTD (B, T)
    if token_level and got.shape == ref.shape and ref.shape[:2] == m.shape:  # compare non-padded positions only
        return float(np.abs(got[m] - ref[m]).max())
    if got.shape != ref.shape:
        raise BertforgeError(f"ONNX output shape {got.shape} != PyTorch {ref.shape}")
    return float(np.abs(got - ref).max())


def deploy(model, out_dir, source_dir=None, optimize: bool = True, quantize: bool = False,
           fused: bool = True, per_channel: bool = True, check: bool = True, fusions: str = "lean",
           reduce_range: bool = False, scheme: Optional[str] = None, target: Optional[str] = None,
           gate=None) -> dict:
    """Export → (optimise) → (INT8) into ``out_dir/model.onnx``; copy ``config.json`` and tokenizer files.

    INT8 (``quantize``) follows the CPU it is made for (:mod:`bertforge.compress.int8`): ``target`` (one of
    :data:`~bertforge.compress.int8.TARGETS`; default this machine's kind) picks the ``scheme`` unless one is
    named (``reduce_range``: shorthand for ``u8s8-7bit``). ``gate`` (an :class:`~bertforge.compress.int8.GateSpec`)
    measures the INT8 graph against the FP32 one on calibration batches and keeps the most sensitive
    MatMuls in FP32 until it agrees within ``gate.max_drop``. A static scheme exports standard ops
    (``fused=False``: every projection a MatMul the calibrated QDQ pass quantizes).

    Writes ``out_dir/onnx.json`` describing the graph (inputs, output, fused ops, quantization scheme, target,
    this CPU's INT8 flags, the gate's report, FP32 parity). Returns that record.

    Raises:
        BertforgeError: FP32 parity exceeds 1e-4, or the gate finds no scheme within ``max_drop`` (nothing
            is written to ``out_dir`` then).
        ConfigError: an unknown target or scheme, or ``reduce_range`` with another scheme.
    """
    from . import int8 as Q
    out_dir = Path(out_dir)
    if model.head_name == "embedding":
        # the weightless pooling head of a bi-encoder fine-tuned for retrieval (tasks/retrieval.py): its dir is the
        # plain encoder plus pooling files, which the embedder reads, so the graph gives the hidden states
        from ..task_model import TaskModel
        base = TaskModel(model.config, head="base", encoder=model.encoder).eval()
        base.pooling = model.pooling
        model = base
    chosen = None
    if quantize:
        target = target or Q.host_target()
        if reduce_range and scheme not in (None, "u8s8-7bit"):
            raise ConfigError(f"--reduce-range means scheme u8s8-7bit, not {scheme}; pass one of them")
        chosen = Q.get_scheme(scheme) if scheme else \
            (Q.SCHEMES["u8s8-7bit"] if reduce_range else Q.default_scheme(target))
        if chosen.static:
            fused = False
    if model.config.model_type in ("modernbert", "mobilebert", "mpnet"):
        # no contrib Attention op takes rotary, windowed attention, queries and values from different inputs
        # (MobileBERT's bottleneck) or MPNet's bias: standard ops (ExportView)
        fused = False
    with atomic_dir(out_dir) as tmp:
        raw = tmp / "raw.onnx"
        export_onnx(model, raw, fused=fused)
        rec = {"format": "onnx", "opset": OPSET, "inputs": input_names(model), "output": output_name(model),
               "fused_attention": fused, "optimized": optimize, "quantization": None}
        fp32 = raw
        if optimize:
            fp32 = tmp / "fp32.onnx"
            rec["fusions"] = fusions
            rec["fused_ops"] = optimize_onnx(raw, fp32, fused=fused, fusions=fusions)
        if check:
            rec["fp32_max_abs_diff"] = parity(model, fp32)
            if rec["fp32_max_abs_diff"] > 1e-4:
                raise BertforgeError(f"exported FP32 graph differs from PyTorch by "
                                     f"{rec['fp32_max_abs_diff']:.2e} (> 1e-4); "
                                     + ("try --no-fused" if fused else "please report this model"))
        if quantize:
            rec.update(_quantize(fp32, tmp / "model.onnx", chosen, target, per_channel, gate, scheme is None
                                 and not reduce_range))
        else:
            fp32.replace(tmp / "model.onnx")
        for f in (raw, tmp / "fp32.onnx"):
            f.unlink(missing_ok=True)
        atomic_write_text(tmp / "config.json", json.dumps(config_to_hf(model.config, model.head_name),
                                                          indent=2))
        if source_dir is not None:
            copy_tokenizer_files(Path(source_dir), tmp)
            from ..checkpoint.layout import carry_declarations
            carry_declarations(source_dir, tmp)  # an embedding model keeps its pooling, length, truncate_dim
        rec["file_mb"] = round((tmp / "model.onnx").stat().st_size / 2**20, 3)
        atomic_write_text(tmp / "onnx.json", json.dumps(rec, indent=2))
    return rec


def describe_scheme(scheme, per_channel: bool, calibration: Optional[str] = None) -> str:
    """The ``quantization`` line of ``onnx.json`` (and of ``bench``) for a :class:`~bertforge.compress.int8.Scheme`."""
    pc = ", per channel" if per_channel else ""
    if scheme.static:
        return f"onnxruntime static int8 (QDQ, int8 activations calibrated by {calibration or 'minmax'}, " \
               f"QInt8 weights{pc})"
    w = "QInt8" if scheme.weight_signed else "QUInt8"
    return f"onnxruntime dynamic int8 ({w} weights{pc}" + (", 7-bit reduce_range)" if scheme.reduce_range else ")")


def _quantize(fp32, dst, scheme, target: str, per_channel: bool, gate, may_fall_back: bool) -> dict:
    """INT8 of the FP32 graph ``fp32`` → ``dst`` with ``scheme`` for ``target``; with a ``gate`` the accuracy
    gate decides (trying the target's other schemes first when the scheme was not named). The record's
    quantization fields."""
    from . import int8 as Q
    flags = cpu_flags()
    calibration = gate.calibration if gate is not None else "minmax"
    if gate is None:
        if scheme.static:
            raise ConfigError(f"scheme {scheme.name} calibrates activation scales; pass calibration texts "
                              f"(--calib FILE or --eval FILE)")
        Q.quantize_graph(fp32, dst, scheme, per_channel)
        report = None
    else:
        schemes = [scheme] + ([Q.SCHEMES[n] for n in Q.FALLBACK_SCHEMES[target] if n != scheme.name]
                              if may_fall_back else [])
        result = Q.gate(fp32, dst, schemes, target, gate.batches, gate.kind, gate.max_drop, per_channel,
                        calibration=calibration, **gate.agreement_kw())
        scheme = Q.SCHEMES[result.scheme]
        report = result.record()
    return {"quantization": describe_scheme(scheme, per_channel, calibration if scheme.static else None),
            "scheme": scheme.name, "reduce_range": scheme.reduce_range, "target": target,
            "host_target": Q.host_target(flags), "cpu_flags": [f for f in INT8_FLAGS if f in flags],
            "exact_on_target": Q.exact_on(scheme, target), "gate": report}


class StaticExportView(torch.nn.Module):
    """A static embedding model written for tracing: ``forward(input_ids (B,T), attention_mask (B,T))`` →
    ``last_hidden_state`` (B,T,d) (a Gather of the table) and ``sentence_embedding`` (B,d): the masked mean
    Σ_t m_t·E[x_t] / max(Σ_t m_t, 1), L2-normalised when the model's config says so."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        from ..checkpoint.modeldir import Meta
        self.normalize = bool(Meta.from_config(model.config).get("normalize", True))

    def forward(self, input_ids, attention_mask):
        h = self.model.embeddings(input_ids)
        m = attention_mask.to(h.dtype).unsqueeze(-1)
        e = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
        if self.normalize:
            e = e / e.norm(dim=-1, keepdim=True).clamp(min=1e-12)
        return h, e


#: the inputs and outputs of a static model's graph
STATIC_INPUTS = ("input_ids", "attention_mask")
STATIC_OUTPUTS = ("last_hidden_state", "sentence_embedding")


def deploy_static(model, out_dir, source_dir=None, check: bool = True) -> dict:
    """Export a :class:`~bertforge.models.static.StaticEmbedding` to ``out_dir/model.onnx`` (the graph of
    :class:`StaticExportView`: Gather + masked mean, dynamic batch and sequence axes) with its
    ``config.json``, the tokenizer files of ``source_dir`` and ``onnx.json`` (``check``: the max
    |ONNX Runtime − PyTorch| of the pooled output on a padded random batch, which must stay ≤ 1e-5).
    Raises BertforgeError when the exporter fails or parity does not hold."""
    out_dir = Path(out_dir)
    view = StaticExportView(model.eval()).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.embeddings.num_embeddings, (2, 16), generator=g)
    am = torch.ones(2, 16, dtype=torch.long)
    am[-1, 8:] = 0
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
            "last_hidden_state": {0: "batch", 1: "sequence"}, "sentence_embedding": {0: "batch"}}
    with atomic_dir(out_dir) as tmp:
        path = tmp / "model.onnx"
        try:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                torch.onnx.export(view, (ids, am), str(path), input_names=list(STATIC_INPUTS),
                                  output_names=list(STATIC_OUTPUTS), dynamic_axes=axes, opset_version=OPSET,
                                  do_constant_folding=True, dynamo=False)
        except Exception as e:
            raise BertforgeError(f"ONNX export failed ({str(e).splitlines()[0][:200]})") from None
        rec = {"format": "onnx", "opset": OPSET, "inputs": list(STATIC_INPUTS), "output": STATIC_OUTPUTS[0],
               "outputs": list(STATIC_OUTPUTS), "model_kind": "static", "quantization": None}
        if check:
            sess = session(path)
            got = sess.run(["sentence_embedding"], {"input_ids": ids.numpy(), "attention_mask": am.numpy()})[0]
            with torch.no_grad():
                ref = view(ids, am)[1].numpy()
            rec["fp32_max_abs_diff"] = float(np.abs(got - ref).max())
            if rec["fp32_max_abs_diff"] > 1e-5:
                raise BertforgeError(f"exported static graph differs from PyTorch by "
                                     f"{rec['fp32_max_abs_diff']:.2e} (> 1e-5); please report this model")
        atomic_write_text(tmp / "config.json", json.dumps(model.config, indent=2))
        if source_dir is not None:
            copy_tokenizer_files(Path(source_dir), tmp)
            from ..checkpoint.layout import carry_declarations
            carry_declarations(source_dir, tmp)  # the pooling, normalisation and dims the dir declares
        rec["file_mb"] = round(path.stat().st_size / 2**20, 3)
        atomic_write_text(tmp / "onnx.json", json.dumps(rec, indent=2))
    return rec


__all__ = ["ExportView", "StaticExportView", "deploy_static", "export_onnx", "optimize_onnx", "needs_reduce_range",
           "session", "run_session", "parity", "deploy"]
