"""Low-bit weights in an ONNX graph, in ONNX Runtime's own formats (contrib domain ``com.microsoft``).

* a Linear layer (``MatMul`` with weight ``Wᵀ``, or ``Gemm`` with ``transB=1``) → ``MatMulNBits``: ``B`` (N,
  G, K_g·bits/8) uint8 — row n (an output unit), group g, the group's codes packed low bits first —,
  ``scales`` (N·G,) float, ``zero_points`` (N·ceil(G·bits/8),) uint8 packed the same way; attributes ``K``,
  ``N``, ``bits`` (2, 4 or 8), ``block_size``. 3-bit layers are written as 4-bit (their codes ≤ 7 and zero
  points are exact on the 4-bit layout) — :data:`bertforge.compress.lowbit.STORED_BITS`;
* an embedding table (``Gather`` of an initializer) → ``GatherBlockQuantized`` (``gather_axis=0``,
  ``quantize_axis=1``, 4 or 8 bits; 4-bit codes packed two per byte, low nibble first).

:func:`rewrite_graph` finds each weight by value: the graph is exported from the model whose weights were
already replaced by their dequantized grid values (:func:`bertforge.compress.lowbit.bake_fake_quant`), so an
initializer equal to ``dequantize(q, s, z)ᵀ`` (or to a block of rows of it: the exporter slices the fused
Q/K/V weight) is that layer's, and is replaced by the codes ``q`` it came from. The graph then computes what
the fake-quantized PyTorch model computes, up to FP32 summation order.
"""
from __future__ import annotations

import hashlib
import math

import numpy as np

from .lowbit import STORED_BITS

MS_DOMAIN = "com.microsoft"


def pack_codes(q: np.ndarray, bits: int) -> np.ndarray:
    """Pack codes (..., K) in [0, 2^bits) along the last axis, ``8 // bits`` per byte, the first code in the
    lowest bits → (..., ceil(K · bits / 8)) uint8. K is zero-padded to whole bytes."""
    q = np.asarray(q, dtype=np.uint8)
    per = 8 // bits
    k = q.shape[-1]
    pad = (-k) % per
    if pad:
        q = np.concatenate([q, np.zeros(q.shape[:-1] + (pad,), np.uint8)], -1)
    q = q.reshape(q.shape[:-1] + (-1, per))
    out = np.zeros(q.shape[:-1], np.uint8)
    for j in range(per):
        out |= (q[..., j] << (bits * j)).astype(np.uint8)
    return out


def unpack_codes(packed: np.ndarray, bits: int, k: int) -> np.ndarray:
    """Inverse of :func:`pack_codes`: (..., bytes) → (..., k) codes."""
    per = 8 // bits
    mask = (1 << bits) - 1
    parts = [(packed >> (bits * j)) & mask for j in range(per)]
    return np.stack(parts, -1).reshape(packed.shape[:-1] + (-1,))[..., :k].astype(np.uint8)


def matmul_nbits_tensors(q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, bits: int,
                         group_size: int) -> tuple:
    """``(B, scales, zero_points)`` of ``MatMulNBits`` for codes ``q`` (N, K), ``scale`` / ``zero_point`` (N, G)
    of :func:`bertforge.compress.lowbit.quantize_groups`; ``bits``: the stored width (2, 4, 8)."""
    n, k = q.shape
    g = math.ceil(k / group_size)
    qp = np.zeros((n, g * group_size), np.uint8)
    qp[:, :k] = q
    b = pack_codes(qp.reshape(n, g, group_size), bits)  # (N, G, group_size·bits/8)
    zp = pack_codes(np.asarray(zero_point, np.uint8), bits).reshape(-1)
    return b, np.asarray(scale, np.float32).reshape(-1), zp


def _key(a: np.ndarray) -> str:
    a = np.ascontiguousarray(a, dtype=np.float32)
    return hashlib.sha1(a.tobytes() + str(a.shape).encode()).hexdigest()


def rewrite_graph(model, layers: dict, tables: dict, group_size: int, accuracy_level: int = 0) -> dict:
    """Replace, in the ONNX ``model`` (a ModelProto, changed in place), the weights named in ``layers`` (module
    name → ``(q, scale, zero_point, bits, dequantized)`` as torch or numpy arrays, W of shape (N, K)) by
    ``MatMulNBits`` and the tables in ``tables`` (same tuple, table (V, H)) by ``GatherBlockQuantized``.
    ``accuracy_level``: MatMulNBits' compute type (0: FP32 products, what the fake-quantized model computes;
    4: activations quantized to int8 per block, integer dot products — faster, not exact).
    Returns ``{"matmul_nbits": n, "gather_block_quantized": n, "replaced": [module names]}``; a layer the graph
    does not hold as an initializer stays FP32 (and is not listed)."""
    from onnx import helper, numpy_helper
    g = model.graph
    look = {}  # value key → (name, row0, row1, transposed)
    for name, (q, s, z, bits, dq) in layers.items():
        w = np.asarray(dq, np.float32)
        n = w.shape[0]
        cuts = {(0, n)}
        for parts in (3,):  # the fused Q/K/V weight: the plain export slices it into three
            if n % parts == 0:
                step = n // parts
                cuts |= {(i * step, (i + 1) * step) for i in range(parts)}
        for r0, r1 in cuts:
            look[_key(w[r0:r1].T)] = (name, r0, r1, True)
            look[_key(w[r0:r1])] = (name, r0, r1, False)
    tab = {_key(np.asarray(t[4], np.float32)): name for name, t in tables.items()}
    inits = {i.name: i for i in g.initializer}
    new_nodes, new_inits, replaced = [], [], set()
    counts = {"matmul_nbits": 0, "gather_block_quantized": 0}
    for node in g.node:
        if node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and node.input[1] in inits:
            arr = numpy_helper.to_array(inits[node.input[1]])
            hit = look.get(_key(arr)) if arr.ndim == 2 and arr.dtype == np.float32 else None
            ok = hit is not None and hit[3] == (node.op_type == "MatMul")
            if ok and node.op_type == "Gemm":
                at = {a.name: helper.get_attribute_value(a) for a in node.attribute}
                ok = at.get("transB", 0) == 1 and at.get("transA", 0) == 0 and \
                    at.get("alpha", 1.0) == 1.0 and at.get("beta", 1.0) == 1.0
            if ok:
                name, r0, r1, _ = hit
                q, s, z, bits, _ = (np.asarray(x) if not isinstance(x, int) else x for x in layers[name])
                sb = STORED_BITS[bits]
                b, sc, zp = matmul_nbits_tensors(q[r0:r1], s[r0:r1], z[r0:r1], sb, group_size)
                base = f"{name}.{r0}_{r1}.q{bits}"
                new_inits += [numpy_helper.from_array(b, base + ".B"), numpy_helper.from_array(sc, base + ".scales"),
                              numpy_helper.from_array(zp, base + ".zero_points")]
                out = node.output[0] if node.op_type == "MatMul" or len(node.input) < 3 else base + ".mm"
                new_nodes.append(helper.make_node(
                    "MatMulNBits", [node.input[0], base + ".B", base + ".scales", base + ".zero_points"], [out],
                    name=base, domain=MS_DOMAIN, K=int(q.shape[1]), N=int(r1 - r0), bits=sb,
                    block_size=int(group_size), accuracy_level=int(accuracy_level)))
                if out != node.output[0]:  # Gemm's bias
                    new_nodes.append(helper.make_node("Add", [out, node.input[2]], [node.output[0]], name=base + ".bias"))
                counts["matmul_nbits"] += 1
                replaced.add(name)
                continue
        if node.op_type == "Gather" and node.input[0] in inits:
            arr = numpy_helper.to_array(inits[node.input[0]])
            name = tab.get(_key(arr)) if arr.ndim == 2 and arr.dtype == np.float32 else None
            at = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            if name is not None and at.get("axis", 0) == 0:
                q, s, z, bits, _ = (np.asarray(x) if not isinstance(x, int) else x for x in tables[name])
                data = pack_codes(q, bits) if bits == 4 else q.astype(np.uint8)
                zp = pack_codes(z, bits) if bits == 4 else z.astype(np.uint8)
                base = f"{name}.q{bits}"
                new_inits += [numpy_helper.from_array(data, base + ".data"),
                              numpy_helper.from_array(np.asarray(s, np.float32), base + ".scales"),
                              numpy_helper.from_array(zp, base + ".zero_points")]
                new_nodes.append(helper.make_node(
                    "GatherBlockQuantized", [base + ".data", node.input[1], base + ".scales", base + ".zero_points"],
                    list(node.output), name=base, domain=MS_DOMAIN, gather_axis=0, quantize_axis=1,
                    block_size=int(group_size), bits=int(bits)))
                counts["gather_block_quantized"] += 1
                replaced.add(name)
                continue
        new_nodes.append(node)
    del g.node[:]
    g.node.extend(new_nodes)
    g.initializer.extend(new_inits)
    used = {i for n in g.node for i in n.input}
    keep = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    counts["replaced"] = sorted(replaced)
    return counts


def graph_ops(model) -> set:
    """The operator types of an ONNX ModelProto."""
    return {n.op_type for n in model.graph.node}


__all__ = ["pack_codes", "unpack_codes", "matmul_nbits_tensors", "rewrite_graph", "graph_ops", "MS_DOMAIN"]
