"""Low-bit quantization (Q-BERT, compress/lowbit.py, compress/hessian.py, compress/lowbit_onnx.py) against
independent truths: a grid computed by hand, the explicit Hessian of a tiny model (torch.autograd.functional.
hessian + torch.linalg.eigvalsh), Hutchinson's variance, the budget arithmetic, and ONNX Runtime's own
MatMulNBits / GatherBlockQuantized kernels against the fake-quantized matrix product."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bertforge.compress import hessian as H
from bertforge.compress import lowbit as L
from bertforge.compress import lowbit_onnx as LO
from bertforge.errors import ConfigError


def test_groupwise_grid_matches_a_hand_computation():
    # one row, two groups of 4 columns, 2 bits (codes 0..3)
    w = torch.tensor([[-1.0, 0.0, 0.5, 2.0, 0.3, 0.6, 0.9, 0.1]])
    q, s, z = L.quantize_groups(w, bits=2, group_size=4)
    # group 1: lo = -1, hi = 2 → s = 3/3 = 1, z = round(1) = 1; q = clamp(round(w) + 1) = [0, 1, 1, 3]
    # (torch.round rounds half to even: round(0.5) = 0)
    # group 2: lo = min(0.1, 0) = 0, hi = 0.9 → s = 0.3, z = 0; q = round([1, 2, 3, 0.333]) = [1, 2, 3, 0]
    assert s[0].tolist() == pytest.approx([1.0, 0.3])
    assert z.tolist() == [[1, 0]]
    assert q.tolist() == [[0, 1, 1, 3, 1, 2, 3, 0]]
    dq = L.dequantize_groups(q, s, z, 4)
    assert dq[0].tolist() == pytest.approx([-1.0, 0.0, 0.0, 2.0, 0.3, 0.6, 0.9, 0.0])
    # padding: K = 6 with groups of 4 → the second group is [w4, w5, 0, 0]
    q6, s6, z6 = L.quantize_groups(w[:, :6], 2, 4)
    assert q6.shape == (1, 6) and s6.shape == (1, 2)
    assert s6[0, 1].item() == pytest.approx(0.6 / 3)


def test_fake_quant_forward_is_the_grid_and_backward_is_the_identity():
    w = torch.randn(6, 32, requires_grad=True)
    fq = L.FakeQuant(3, 16)
    y = fq(w)
    assert torch.equal(y.detach(), L.fake_quantize(w.detach(), 3, 16))
    assert len(torch.unique(L.quantize_groups(w, 3, 16)[0])) <= 8
    (y * torch.arange(32.0)).sum().backward()
    assert torch.equal(w.grad, torch.arange(32.0).expand(6, 32))


def test_bake_keeps_the_codes_the_export_writes():
    lin = torch.nn.Linear(32, 8)
    L.attach_fake_quant(torch.nn.Sequential(lin), {"0": 4}, 16)
    before = lin.weight.detach().clone()
    seq = torch.nn.Sequential(lin)
    states = L.bake_fake_quant(seq)
    q, s, z, bits, dq = states["0"]
    assert bits == 4 and torch.equal(lin.weight.detach(), dq) and torch.equal(before, dq)
    assert torch.equal(L.dequantize_groups(q, s, z, 16), dq)


# ------------------------------------------------------------------------------------------------- Hessian
def _tiny_problem():
    torch.manual_seed(0)
    x = torch.randn(32, 4)
    y = torch.randint(0, 3, (32,))
    w1 = torch.randn(5, 4) * 0.7
    w2 = torch.randn(3, 5) * 0.7

    def loss(a, b):
        return torch.nn.functional.cross_entropy(torch.tanh(x @ a.T) @ b.T, y)
    return loss, w1, w2


def _explicit(loss, w1, w2):
    """The full Hessian of the loss in (w1, w2), and the HVP operator of the same loss."""
    flat = torch.cat([w1.reshape(-1), w2.reshape(-1)])
    n1 = w1.numel()

    def f(v):
        return loss(v[:n1].reshape(w1.shape), v[n1:].reshape(w2.shape))
    hess = torch.autograd.functional.hessian(f, flat).double()
    p1, p2 = w1.clone().requires_grad_(True), w2.clone().requires_grad_(True)
    grads = torch.autograd.grad(loss(p1, p2), [p1, p2], create_graph=True)
    return hess, (lambda v: H.hvp(grads, [p1, p2], v)), [w1.shape, w2.shape]


def test_power_iteration_matches_the_explicit_hessians_top_eigenvalue():
    loss, w1, w2 = _tiny_problem()
    hess, op, shapes = _explicit(loss, w1, w2)
    ev, vecs = torch.linalg.eigh(hess)
    top = int(ev.abs().argmax())
    lam1 = float(ev[top])
    rest = ev.abs().clone()
    rest[top] = 0
    ratio = float(rest.max() / abs(lam1))
    g = torch.Generator().manual_seed(1)
    v0 = [torch.randn(s, generator=g) for s in shapes]
    c = float(torch.cat([v.reshape(-1) for v in v0]).double() @ vecs[:, top]) / \
        float(torch.cat([v.reshape(-1) for v in v0]).norm())
    k = 60
    est, ran = H.top_eigenvalue(op, shapes, iters=k, tol=0.0, v0=v0)
    assert ran == k
    # Rayleigh-quotient error after k steps ≤ spread · tan²θ₀ · ratio^(2k) (Golub & Van Loan §8.2.1),
    # plus float32 rounding of the HVP (relative ~1e-6 of the spectrum)
    bound = float(ev.max() - ev.min()) * (1 - c * c) / (c * c) * ratio ** (2 * (k - 1)) + 1e-5 * abs(lam1)
    assert abs(est - lam1) <= bound, (est, lam1, bound)


def test_hutchinson_trace_is_unbiased_within_its_standard_error():
    loss, w1, w2 = _tiny_problem()
    hess, op, shapes = _explicit(loss, w1, w2)
    tr = float(torch.trace(hess))
    m = 400
    est = H.hutchinson_trace(op, shapes, samples=m, generator=torch.Generator().manual_seed(2))
    var = 2.0 * float((hess ** 2).sum() - (torch.diagonal(hess) ** 2).sum())  # Rademacher probes
    se = math.sqrt(var / m)
    assert abs(est - tr) <= 5 * se + 1e-5 * abs(tr), (est, tr, se)


def test_block_sensitivities_read_each_blocks_own_hessian():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))

    def loss_fn(m, batch):
        return torch.nn.functional.cross_entropy(m(batch[0]), batch[1])
    out = H.block_sensitivities(model, loss_fn, [(x, y)], {"second": [model[2].weight]}, iters=100,
                                trace_samples=200)
    w = model[2].weight.detach()

    def f(v):
        return torch.nn.functional.cross_entropy(torch.tanh(model[0](x)).detach() @ v.reshape(3, 5).T
                                                 + model[2].bias.detach(), y)
    hess = torch.autograd.functional.hessian(f, w.reshape(-1)).double()
    assert out["second"]["eig"][0] == pytest.approx(float(torch.linalg.eigvalsh(hess).abs().max()), rel=1e-3)
    assert all(p.requires_grad for p in model.parameters())  # restored


# ---------------------------------------------------------------------------------------------- allocation
def _layers():
    torch.manual_seed(0)
    out = []
    for i, omega in enumerate((10.0, 0.1, 1.0)):
        w = torch.randn(64, 128)
        out.append(L.LayerCost(f"l{i}", [tuple(w.shape)], omega,
                               {b: L.quant_error(w, b, 32) for b in L.BITS}))
    return out


def test_allocation_respects_the_budget_and_favours_the_sensitive_layer():
    layers = _layers()
    floor = sum(l.bytes(2, 32) for l in layers)
    for extra in (0, 3000, 9000, 20000, 10 ** 6):
        budget = floor + 1000 + extra
        plan = L.allocate_bits(layers, budget, 32, fixed_bytes=1000)
        used = 1000 + sum(l.bytes(plan[l.name], 32) for l in layers)
        assert used <= budget
        assert plan["l0"] >= plan["l2"] >= plan["l1"]
        # greedy stops only when no single step up fits
        for l in layers:
            if plan[l.name] < 8:
                nb = L.BITS[L.BITS.index(plan[l.name]) + 1]
                assert used + l.bytes(nb, 32) - l.bytes(plan[l.name], 32) > budget
    assert set(L.allocate_bits(layers, 10 ** 9, 32).values()) == {8}


def test_a_budget_below_two_bits_is_refused_in_one_line():
    layers = _layers()
    floor = sum(l.bytes(2, 32) for l in layers)
    with pytest.raises(ConfigError, match="below what 2 bits allow"):
        L.allocate_bits(layers, floor - 1, 32)


def test_matrix_bytes_counts_codes_scales_and_zero_points():
    # 8 × 100 at 3 bits, groups of 32 → G = 4: codes ceil(800·3/8) = 300, scales 8·4·4 = 128, zero points
    # 8 · ceil(4·3/8) = 16; stored as 4 bits with K padded to 128: 512 + 128 + 8·2
    assert L.matrix_bytes((8, 100), 3, 32) == 300 + 128 + 16
    assert L.matrix_bytes((8, 100), 3, 32, stored=True) == 512 + 128 + 16


# --------------------------------------------------------------------------------------- ONNX Runtime's ops
def _session(node, inits, inputs, outputs):
    import onnxruntime as ort
    from onnx import helper
    g = helper.make_graph([node], "g", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(LO.MS_DOMAIN, 1)])
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_matmul_nbits_computes_the_fake_quantized_product(bits):
    from onnx import TensorProto, helper, numpy_helper
    torch.manual_seed(bits)
    n, k, gs = 24, 96, 32
    w = torch.randn(n, k)
    q, s, z = L.quantize_groups(w, bits, gs)
    dq = L.dequantize_groups(q, s, z, gs)
    stored = L.STORED_BITS[bits]
    b, sc, zp = LO.matmul_nbits_tensors(q.numpy(), s.numpy(), z.numpy(), stored, gs)
    assert np.array_equal(LO.unpack_codes(b, stored, gs).reshape(n, k), q.numpy())  # packing round trip
    node = helper.make_node("MatMulNBits", ["a", "b", "s", "z"], ["y"], domain=LO.MS_DOMAIN, K=k, N=n,
                            bits=stored, block_size=gs)
    sess = _session(node, [numpy_helper.from_array(b, "b"), numpy_helper.from_array(sc, "s"),
                           numpy_helper.from_array(zp, "z")],
                    [helper.make_tensor_value_info("a", TensorProto.FLOAT, [None, k])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    a = torch.randn(5, k)
    got = sess.run(None, {"a": a.numpy()})[0]
    ref = (a.double() @ dq.double().T).numpy()
    # fp32 accumulation of K products: |error| ≤ K · u · Σ|a_i w_i| (u = 2^-24), both sides → 2·
    bound = 2 * k * 2.0 ** -24 * (a.abs().double() @ dq.abs().double().T).numpy() + 1e-7
    assert np.all(np.abs(got - ref) <= bound)


def test_gather_block_quantized_looks_up_the_dequantized_table():
    from onnx import TensorProto, helper, numpy_helper
    torch.manual_seed(0)
    table = torch.randn(50, 64)
    q, s, z = L.quantize_groups(table, 4, 16)
    dq = L.dequantize_groups(q, s, z, 16)
    node = helper.make_node("GatherBlockQuantized", ["d", "i", "s", "z"], ["o"], domain=LO.MS_DOMAIN,
                            gather_axis=0, quantize_axis=1, block_size=16, bits=4)
    sess = _session(node, [numpy_helper.from_array(LO.pack_codes(q.numpy(), 4), "d"),
                           numpy_helper.from_array(s.numpy(), "s"),
                           numpy_helper.from_array(LO.pack_codes(z.numpy(), 4), "z")],
                    [helper.make_tensor_value_info("i", TensorProto.INT64, [None])],
                    [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    ids = np.array([0, 7, 49, 7])
    got = sess.run(None, {"i": ids})[0]
    # one product s · (q − z) per element, rounded once each side
    assert np.allclose(got, dq[ids].numpy(), rtol=2 ** -22, atol=0)


def test_packing_matches_onnx_runtimes_own_4bit_quantizer():
    """Our layout read back from the bytes ONNX Runtime's quantizer writes: its codes, scales and zero points,
    dequantized by our formula, reproduce the matrix its kernel computes with."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits
    rng = np.random.default_rng(0)
    k, n, gs = 64, 8, 32
    w = rng.standard_normal((k, n)).astype(np.float32)  # ONNX's MatMul B: (K, N)
    g = k // gs
    packed = np.zeros((n, g, gs // 2), np.uint8)
    scales = np.zeros(n * g, np.float32)
    zps = np.zeros(n * math.ceil(g / 2), np.uint8)
    quantize_matmul_4bits(packed, w, scales, zps, gs, n, k, False)
    q = LO.unpack_codes(packed, 4, gs).reshape(n, k)
    z = LO.unpack_codes(zps.reshape(n, -1), 4, g)
    dq = L.dequantize_groups(torch.from_numpy(q), torch.from_numpy(scales.reshape(n, g)), torch.from_numpy(z), gs)
    # RTN at 4 bits: every weight within half a step of its group's grid
    step = np.repeat(scales.reshape(n, g), gs, 1)
    assert np.all(np.abs(dq.numpy() - w.T) <= 0.5 * step + 1e-6)
