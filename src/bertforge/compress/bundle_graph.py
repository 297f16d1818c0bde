"""A bundle's graph: standard ONNX operators only, with everything after the encoder inside the graph.

:func:`standardize` rewrites the ONNX Runtime contrib operators that ``export`` / ``quantize`` write
(``com.microsoft``: Attention, QAttention, MultiHeadAttention, Gelu, BiasGelu, FastGelu) into operators of the
default ONNX domain, so one file loads in any ONNX Runtime release and in onnxruntime-web:

* Attention / QAttention: ``softmax(Q·Kᵀ/√d + (1 − mask)·f)·V`` per head (Vaswani et al. 2017, eq. 1) with the
  additive mask value ``f`` of the op (``mask_filter_value``, −10⁴); QAttention's projection is
  ``MatMulInteger(x_u8, W_s8, zp_x, zp_W)·(s_x·s_W) + b`` (the dynamic-INT8 product of ONNX Runtime's quantizer,
  written with the standard MatMulInteger, whose int32 result is exact);
* Gelu: ``0.5·x·(1 + erf(x/√2))`` (Hendrycks & Gimpel 2016); FastGelu: its tanh form.

:func:`add_outputs` appends the post-processing a task needs and makes its results the graph's outputs:

========================  ============================================================================
kind                      outputs
========================  ============================================================================
embedding                 ``sentence_embedding`` (B, D): mean / CLS / max pooling over the mask, the first
                          ``truncate_dim`` coordinates (Matryoshka, Kusupati et al. 2022 §3), L2-normalised
                          when the dir says so — :class:`bertforge.runtime.embedder.Embedder`'s order
classification            ``logits`` (B, C), ``scores`` = softmax (B, C), ``label`` = argmax (B,) int64
multi_label               ``logits``, ``scores`` = sigmoid (B, C), ``predicted`` = scores ≥ threshold (B, C)
                          bool, per label (the dir's saved ``bertforge.thresholds``; 0.5 without)
regression                ``logits`` = ``scores`` (B, 1)
token_classification      ``logits`` (B, T, C), ``tag_ids`` = argmax (B, T) int64, ``tag_scores`` = the
                          softmax probability of that tag (B, T)
question_answering        ``start_logits``, ``end_logits`` (B, T) (padding −10⁴)
========================  ============================================================================
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ..errors import BertforgeError

#: the kinds a bundle serves (:func:`add_outputs`)
KINDS = ("embedding", "classification", "multi_label", "regression", "token_classification",
         "question_answering")
#: the outputs of each kind's graph
OUTPUTS = {"embedding": ("sentence_embedding",), "classification": ("logits", "scores", "label"),
           "multi_label": ("logits", "scores", "predicted"), "regression": ("logits", "scores"),
           "token_classification": ("logits", "tag_ids", "tag_scores"),
           "question_answering": ("start_logits", "end_logits")}
#: each output's axes
RANKS = {"sentence_embedding": ["batch", "dim"], "logits": None, "scores": ["batch", "labels"],
         "label": ["batch"], "predicted": ["batch", "labels"], "tag_ids": ["batch", "sequence"],
         "tag_scores": ["batch", "sequence"], "start_logits": ["batch", "sequence"],
         "end_logits": ["batch", "sequence"]}
REWRITTEN = ("Attention", "QAttention", "MultiHeadAttention", "Gelu", "BiasGelu", "FastGelu")


class _Builder:
    """Appends nodes and constants to a graph under fresh names."""

    def __init__(self, graph, prefix: str):
        self.graph, self.prefix, self.n = graph, prefix, 0
        self.nodes: list = []
        self.opset = 17

    def for_model(self, model) -> "_Builder":
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
        return self

    def name(self, what: str) -> str:
        self.n += 1
        return f"{self.prefix}/{what}_{self.n}"

    def const(self, value, dtype=np.float32) -> str:
        from onnx import numpy_helper
        name = self.name("const")
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs: list, n_out: int = 1, **attrs):
        from onnx import helper
        outs = [self.name(op_type) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.name(op_type + "_node"),
                                           **attrs))
        return outs[0] if n_out == 1 else outs


# ------------------------------------------------------------------------------------- standard ops only
def _attention(b: _Builder, q: str, k: str, v: str, mask: str, heads: int, dq: int, dv: int,
               fill: float) -> str:
    """Per-head scaled dot-product attention of (B,Tq,n·dq), (B,T,n·dq), (B,T,n·dv) with a (B,T) 0/1 key
    mask → (B,Tq,n·dv)."""
    def split(x, d, perm):
        return b.op("Transpose", [b.op("Reshape", [x, b.const([0, -1, heads, d], np.int64)])], perm=perm)
    qh, kh, vh = split(q, dq, [0, 2, 1, 3]), split(k, dq, [0, 2, 3, 1]), split(v, dv, [0, 2, 1, 3])
    scores = b.op("Mul", [b.op("MatMul", [qh, kh]), b.const(1.0 / math.sqrt(dq))])
    m = b.op("Cast", [mask], to=1)
    bias = b.op("Mul", [b.op("Sub", [b.const(1.0), m]), b.const(fill)])
    bias = b.op("Unsqueeze", [bias, b.const([1, 2], np.int64)])
    p = b.op("Softmax", [b.op("Add", [scores, bias])], axis=-1)
    ctx = b.op("Transpose", [b.op("MatMul", [p, vh])], perm=[0, 2, 1, 3])
    return b.op("Reshape", [ctx, b.const([0, 0, heads * dv], np.int64)])


def _attr(node, name, default=None):
    from onnx import helper
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _rewrite(b: _Builder, node, shapes: dict) -> str:
    """The default-domain nodes for one contrib ``node``; returns the name of what replaces its output 0."""
    t = node.op_type
    x = list(node.input)
    if t in ("Gelu", "BiasGelu"):
        y = x[0] if t == "Gelu" else b.op("Add", x[:2])
        erf = b.op("Erf", [b.op("Mul", [y, b.const(1.0 / math.sqrt(2.0))])])
        return b.op("Mul", [b.op("Mul", [y, b.const(0.5)]), b.op("Add", [erf, b.const(1.0)])])
    if t == "FastGelu":
        y = b.op("Add", x[:2]) if len(x) > 1 and x[1] else x[0]
        cube = b.op("Mul", [b.op("Mul", [y, y]), y])
        inner = b.op("Mul", [b.op("Add", [y, b.op("Mul", [cube, b.const(0.044715)])]),
                             b.const(math.sqrt(2.0 / math.pi))])
        return b.op("Mul", [b.op("Mul", [y, b.const(0.5)]), b.op("Add", [b.op("Tanh", [inner]), b.const(1.0)])])
    heads = int(_attr(node, "num_heads"))
    fill = float(_attr(node, "mask_filter_value", -10000.0))
    if t == "MultiHeadAttention":  # q, k, v before bias, bias (3·inner), key padding mask
        inner = shapes[x[3]][0] // 3
        bq, bk, bv = b.op("Split", [x[3], b.const([inner] * 3, np.int64)], n_out=3, axis=0)
        q, k, v = (b.op("Add", [z, bz]) for z, bz in zip(x[:3], (bq, bk, bv)))
        return _attention(b, q, k, v, x[4], heads, inner // heads, inner // heads, fill)
    if _attr(node, "unidirectional", 0) or _attr(node, "past_present_share_buffer", 0):
        raise BertforgeError(f"cannot bundle: {t} node {node.name!r} is causal or cached; an encoder's "
                             f"attention has neither")
    w_cols = shapes[x[1]][-1]
    sizes = list(_attr(node, "qkv_hidden_sizes", []) or [w_cols // 3] * 3)
    if t == "Attention":
        proj = b.op("Add", [b.op("MatMul", [x[0], x[1]]), x[2]])
        mask = x[3]
    else:  # QAttention: x_u8, W_s8, bias, s_x, s_W, mask, zp_x, zp_W
        zp_x = x[6] if len(x) > 6 and x[6] else b.const(0, np.uint8)
        zp_w = x[7] if len(x) > 7 and x[7] else b.const(0, np.int8)
        acc = b.op("Cast", [b.op("MatMulInteger", [x[0], x[1], zp_x, zp_w])], to=1)
        proj = b.op("Add", [b.op("Mul", [acc, b.op("Mul", [x[3], x[4]])]), x[2]])
        mask = x[5]
    if not mask:
        raise BertforgeError(f"cannot bundle: {t} node {node.name!r} has no padding mask")
    q, k, v = b.op("Split", [proj, b.const(sizes, np.int64)], n_out=3, axis=-1)
    return _attention(b, q, k, v, mask, heads, sizes[0] // heads, sizes[2] // heads, fill)


def standardize(model):
    """``model`` (an ``onnx.ModelProto``) with every :data:`REWRITTEN` contrib node replaced by default-domain
    operators (see the module doc) and the ``com.microsoft`` opset import dropped. Returns the same object.

    Raises:
        BertforgeError: a node of another domain or a contrib op not in :data:`REWRITTEN` remains (the message
            names it: such a graph cannot be bundled).
    """
    g = model.graph
    shapes = {i.name: list(i.dims) for i in g.initializer}
    b = _Builder(g, "bundle_std")
    out = []
    for node in g.node:
        if node.domain in ("", "ai.onnx"):
            out.append(node)
            continue
        if node.domain != "com.microsoft" or node.op_type not in REWRITTEN:
            raise BertforgeError(f"cannot bundle: the graph holds {node.domain}::{node.op_type}, which has no "
                                 f"standard-ONNX form here; bundle the FP32 checkpoint dir instead")
        b.nodes = []
        new = _rewrite(b, node, shapes)
        b.nodes.append(_identity(new, node.output[0]))
        out.extend(b.nodes)
    del g.node[:]
    g.node.extend(out)
    keep = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    del model.opset_import[:]
    model.opset_import.extend(keep)
    return model


def _identity(src: str, dst: str):
    from onnx import helper
    return helper.make_node("Identity", [src], [dst], name=dst + "/bundle_identity")


def without_activation_rounding(model):
    """A copy of a dynamic-INT8 graph with its activations left in float: each ``DynamicQuantizeLinear(x) →
    MatMulInteger(x_q, W_q) → Cast → Mul(s_x·s_W)`` becomes ``MatMul(x, (W_q − zp_W)·s_W)`` — the same quantized
    weights, no activation rounding. ``|int8 − this|`` on an input is the whole error the activations'
    rounding adds there (Zafrir et al. 2019 §2 for the dynamic scheme), the bound for two INT8 kernels that
    round a few boundary values differently. Returns None when no MatMulInteger follows that pattern."""
    import copy
    from onnx import helper, numpy_helper
    m = copy.deepcopy(model)
    g = m.graph
    init = {i.name: i for i in g.initializer}
    prod = {o: n for n in g.node for o in n.output}
    cons: dict = {}
    for n in g.node:
        for x in n.input:
            cons.setdefault(x, []).append(n)
    drop, add = set(), {}
    for n in g.node:
        if n.op_type != "MatMulInteger" or n.input[1] not in init:
            continue
        dql = prod.get(n.input[0])
        cast = (cons.get(n.output[0]) or [None])[0]
        mul = (cons.get(cast.output[0]) or [None])[0] if cast is not None else None
        smul = prod.get(mul.input[1]) if mul is not None else None
        w_scale = next((x for x in (smul.input if smul is not None else ()) if x in init), None)
        if dql is None or dql.op_type != "DynamicQuantizeLinear" or mul is None or w_scale is None:
            continue
        zp = numpy_helper.to_array(init[n.input[3]]).astype(np.float64) if len(n.input) > 3 and \
            n.input[3] in init else 0.0
        w = (numpy_helper.to_array(init[n.input[1]]).astype(np.float64) - zp) * \
            numpy_helper.to_array(init[w_scale]).astype(np.float64)
        name = n.name + "/float_weight"
        g.initializer.append(numpy_helper.from_array(w.astype(np.float32), name))
        add[id(n)] = helper.make_node("MatMul", [dql.input[0], name], [mul.output[0]], name=n.name + "/float")
        drop.update({id(cast), id(mul)})
    if not add:
        return None
    nodes = [add.get(id(n), n) for n in g.node if id(n) not in drop]
    del g.node[:]
    g.node.extend(nodes)
    return m


def foreign_ops(model) -> list:
    """The ``domain::op`` of every node outside the default ONNX domain (none in a bundle's graph)."""
    return sorted({f"{n.domain}::{n.op_type}" for n in model.graph.node if n.domain not in ("", "ai.onnx")})


# ---------------------------------------------------------------------------------------- post-processing
def _pool(b: _Builder, hidden: str, mask: str, mode: str) -> str:
    if mode == "cls":
        return b.op("Gather", [hidden, b.const(0, np.int64)], axis=1)
    m = b.op("Unsqueeze", [b.op("Cast", [mask], to=1), b.const([2], np.int64)])  # (B, T, 1)
    if mode == "mean":
        total = b.op("ReduceSum", [b.op("Mul", [hidden, m]), b.const([1], np.int64)], keepdims=0)
        count = b.op("Max", [b.op("ReduceSum", [m, b.const([1], np.int64)], keepdims=0), b.const(1.0)])
        return b.op("Div", [total, count])
    if mode == "max":
        lowest = b.const(np.finfo(np.float32).min)
        filled = b.op("Where", [b.op("Greater", [m, b.const(0.0)]), hidden, lowest])
        mx = _reduce(b, "ReduceMax", filled, [1], 0)
        count = b.op("ReduceSum", [m, b.const([1], np.int64)], keepdims=0)
        return b.op("Where", [b.op("Greater", [count, b.const(0.0)]), mx, b.const(0.0)])
    raise BertforgeError(f"cannot bundle: pooling {mode!r}; a bundle pools by mean, cls or max")


def _reduce(b: _Builder, op: str, x: str, axes: list, keepdims: int) -> str:
    """ReduceMax / ReduceL2 over ``axes``: an attribute before opset 18, an input from 18 on (ReduceSum: 13)."""
    if b.opset >= 18:
        return b.op(op, [x, b.const(axes, np.int64)], keepdims=keepdims)
    return b.op(op, [x], axes=axes, keepdims=keepdims)


def _embedding(b: _Builder, hidden: str, mask: str, pooling: dict) -> str:
    out = _pool(b, hidden, mask, pooling.get("mode", "mean"))
    dim = pooling.get("truncate_dim")
    if dim:
        out = b.op("Slice", [out, b.const([0], np.int64), b.const([int(dim)], np.int64),
                             b.const([1], np.int64)])
    if pooling.get("normalize"):
        norm = _reduce(b, "ReduceL2", out, [1], 1)
        out = b.op("Div", [out, b.op("Max", [norm, b.const(1e-12)])])
    return out


def add_outputs(model, kind: str, source_output: str, *, pooling: Optional[dict] = None,
                thresholds: Optional[list] = None, mask_input: str = "attention_mask"):
    """Append ``kind``'s post-processing (module doc) after the graph's ``source_output`` (``last_hidden_state``
    (B, T, H) for an embedding, else ``logits``) and make :data:`OUTPUTS` ``[kind]`` the graph's outputs.
    ``pooling``: {mode, normalize, truncate_dim} (embedding); ``thresholds``: (C,) probabilities (multi-label).
    Returns the same ``onnx.ModelProto``. Raises BertforgeError for an unknown kind."""
    from onnx import TensorProto, helper
    if kind not in KINDS:
        raise BertforgeError(f"cannot bundle a {kind} model; a bundle serves {', '.join(KINDS)}")
    g = model.graph
    b = _Builder(g, "bundle_head").for_model(model)
    z = source_output
    res: dict = {}
    if kind == "embedding":
        res["sentence_embedding"] = _embedding(b, z, mask_input, pooling or {})
    elif kind == "classification":
        res = {"logits": z, "scores": b.op("Softmax", [z], axis=-1), "label": b.op("ArgMax", [z], axis=-1,
                                                                                     keepdims=0)}
    elif kind == "multi_label":
        s = b.op("Sigmoid", [z])
        res = {"logits": z, "scores": s,
               "predicted": b.op("GreaterOrEqual", [s, b.const(np.asarray(thresholds, np.float32))])}
    elif kind == "regression":
        res = {"logits": z, "scores": b.op("Identity", [z])}
    elif kind == "token_classification":
        p = b.op("Softmax", [z], axis=-1)
        res = {"logits": z, "tag_ids": b.op("ArgMax", [z], axis=-1, keepdims=0),
               "tag_scores": _reduce(b, "ReduceMax", p, [-1], 0)}
    else:  # QA: logits (B, 2, T)
        res = {"start_logits": b.op("Gather", [z, b.const(0, np.int64)], axis=1),
               "end_logits": b.op("Gather", [z, b.const(1, np.int64)], axis=1)}
    types = {"label": TensorProto.INT64, "tag_ids": TensorProto.INT64, "predicted": TensorProto.BOOL}
    nodes = list(b.nodes)
    outs = []
    RANKS["logits"] = ["batch", "sequence", "labels"] if kind == "token_classification" else ["batch", "labels"]
    for name in OUTPUTS[kind]:
        if res[name] != name:
            nodes.append(_identity(res[name], name))
        outs.append(helper.make_tensor_value_info(name, types.get(name, TensorProto.FLOAT), RANKS[name]))
    g.node.extend(nodes)
    del g.output[:]
    g.output.extend(outs)
    return model


def _rename_output(model, old: str, new: str) -> None:
    """Rename the tensor ``old`` (a graph output) to ``new`` everywhere."""
    for n in model.graph.node:
        for i, x in enumerate(n.input):
            if x == old:
                n.input[i] = new
        for i, x in enumerate(n.output):
            if x == old:
                n.output[i] = new


def bundle_graph(src, dst, kind: str, source_output: str, *, pooling: Optional[dict] = None,
                 thresholds: Optional[list] = None, standard: bool = True) -> list:
    """Read the ONNX file ``src``, :func:`standardize` it (``standard``; a ``--fused`` copy keeps its contrib
    ops), :func:`add_outputs`, check it and write ``dst``. Returns the graph's output names.

    Raises:
        BertforgeError: the graph cannot be bundled (foreign ops, missing ``source_output``, invalid result).
    """
    import onnx
    model = onnx.load(str(src))
    if source_output not in [o.name for o in model.graph.output]:
        raise BertforgeError(f"cannot bundle: the graph has no {source_output!r} output")
    for o in [o.name for o in model.graph.output]:  # names the bundle's outputs take ('logits' …): re-route
        if o in OUTPUTS.get(kind, ()):
            _rename_output(model, o, "encoder_" + o)
            source_output = "encoder_" + o if o == source_output else source_output
    if standard:
        standardize(model)
    add_outputs(model, kind, source_output, pooling=pooling, thresholds=thresholds)
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        raise BertforgeError(f"cannot bundle: the bundled graph is not valid ONNX "
                             f"({str(e).splitlines()[0][:160]})") from None
    onnx.save(model, str(dst))
    return list(OUTPUTS[kind])


__all__ = ["KINDS", "OUTPUTS", "REWRITTEN", "standardize", "foreign_ops", "without_activation_rounding", "add_outputs", "bundle_graph"]
