"""The cheap training kernels behind the pretraining speed: dropout keep-masks, attention with dropout,
the chunked vocabulary cross-entropy and inverse-CDF sampling of the ELECTRA generator.

Truths used: the Bernoulli keep rate and the unchanged expectation over 2²⁰ draws; the same computation
written out by hand with the same mask (re-drawn from the same seed); ``torch.nn.functional.cross_entropy``
and its autograd gradient; softmax probabilities vs sample frequencies over 200,000 draws (z-scores).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from bertforge.engine.kernels import apply_kernels
from bertforge.engine.kernels.cpu import attention_product
from bertforge.engine.kernels.dropout import MASK_LEVELS, Dropout, dropout, keep_mask
from bertforge.engine.kernels.mlm import vocab_cross_entropy
from bertforge.models.attention import padding_mask_bias
from bertforge.models.output import Features
from bertforge.objectives.rtd import sample_from_logits


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_keep_mask_rate_and_scale(p):
    torch.manual_seed(0)
    n = 1 << 20
    keep, scale = keep_mask((n,), p)
    p_eff = round(p * MASK_LEVELS) / MASK_LEVELS
    assert abs(p_eff - p) <= 0.5 / MASK_LEVELS
    assert scale == pytest.approx(1 / (1 - p_eff), rel=1e-12)
    rate = keep.float().mean().item()
    sd = math.sqrt(p_eff * (1 - p_eff) / n)
    assert abs(rate - (1 - p_eff)) < 5 * sd, (rate, 1 - p_eff, sd)


def test_dropout_expectation_gradient_eval_and_seed():
    torch.manual_seed(1)
    x = torch.full((1 << 20,), 2.0, requires_grad=True)
    y = dropout(x, 0.1)
    kept = y.detach() != 0
    scale = 1 / (1 - round(0.1 * MASK_LEVELS) / MASK_LEVELS)
    assert torch.allclose(y.detach()[kept], torch.tensor(2.0 * scale))
    assert abs(y.detach().mean().item() - 2.0) < 5 * 2.0 * scale * math.sqrt(0.1 * 0.9 / x.numel())
    g = torch.randn_like(x)
    y.backward(g)
    assert torch.allclose(x.grad, g * kept * scale)  # ∂y/∂x = keep · scale
    m = Dropout(0.3)
    assert isinstance(m, torch.nn.Dropout) and m.p == 0.3
    z = torch.randn(50)
    assert torch.equal(m.eval()(z), z)
    m.train()
    torch.manual_seed(5)
    a = m(z)
    torch.manual_seed(5)
    assert torch.equal(m(z), a) and not torch.equal(a, z)
    with pytest.raises(ValueError):
        keep_mask((3,), 1.2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_float_mask_and_byte_mask_paths_agree_bit_for_bit(dtype):
    """FP32/FP64 dropout multiplies by a 0-or-scale float mask, bf16 by the 1-byte mask then the scale; the
    float mask is the byte mask times the scale (same seed), and each path's output is exactly
    x·keep·scale with the keep drawn by keep_mask."""
    from bertforge.engine.kernels.dropout import scaled_keep_mask
    torch.manual_seed(3)
    keep, scale = keep_mask((64, 33), 0.2)
    torch.manual_seed(3)
    m = scaled_keep_mask((64, 33), 0.2, torch.float64)
    assert torch.equal(m, keep.double() * scale)
    x = torch.randn(64, 33).to(dtype).requires_grad_()
    torch.manual_seed(3)
    y = dropout(x, 0.2)
    want = (x.detach() * keep.to(dtype)) * scale
    assert y.dtype == dtype and torch.equal(y.detach(), want)
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad, (keep.to(dtype) * scale).to(dtype))


def test_attention_product_with_dropout_equals_hand_computation_with_the_same_mask():
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    am = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    bias = padding_mask_bias(am, q.dtype)
    # no dropout: exactly softmax(QKᵀ/√d + bias)V
    ref0 = torch.softmax(q @ k.transpose(-1, -2) / 2.0 + bias, -1) @ v
    assert torch.allclose(attention_product(q, k, v, bias, 0.0), ref0, atol=1e-6)
    torch.manual_seed(7)
    got = attention_product(q, k, v, bias, 0.25)
    torch.manual_seed(7)
    keep, scale = keep_mask((2, 3, 5, 5), 0.25)
    ref = (torch.softmax(q @ k.transpose(-1, -2) / 2.0 + bias, -1) * keep * scale) @ v
    assert torch.allclose(got, ref, atol=1e-6)
    assert not torch.allclose(got, ref0, atol=1e-3)
    # causal: future keys get no weight even with dropout
    torch.manual_seed(7)
    c = attention_product(q, k, v, None, 0.25, is_causal=True)
    torch.manual_seed(7)
    keep, scale = keep_mask((2, 3, 5, 5), 0.25)
    s = q @ k.transpose(-1, -2) / 2.0
    s = s.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    assert torch.allclose(c, (torch.softmax(s, -1) * keep * scale) @ v, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vocab_cross_entropy_equals_torch_loss_gradient_and_argmax(dtype):
    torch.manual_seed(3)
    n, v = 37, 1001  # 37 rows in chunks of 5: the last chunk is partial
    x = (torch.randn(n, v) * 3).to(dtype).requires_grad_()
    t = torch.randint(0, v, (n,))
    t[:4] = x.detach().float().argmax(-1)[:4]  # some rows predicted correctly
    rows, correct = vocab_cross_entropy(x, t, chunk_bytes=4 * v * 5)
    g = torch.randn(n)
    (rows * g).sum().backward()
    ours = x.grad.clone()
    x.grad = None
    ref = F.cross_entropy(x.float(), t, reduction="none")
    (ref * g).sum().backward()
    assert rows.dtype == torch.float32 and ours.dtype == dtype
    assert torch.allclose(rows, ref.detach(), atol=1e-5)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert torch.allclose(ours.float(), x.grad.float(), atol=tol)
    assert torch.equal(correct, x.detach().float().argmax(-1) == t) and bool(correct[:4].all())
    with torch.no_grad():  # no gradient wanted: the forward-only path, same values
        assert torch.equal(vocab_cross_entropy(x.detach(), t, chunk_bytes=4 * v * 5)[0], rows.detach())


def test_sample_from_logits_matches_softmax_frequencies():
    torch.manual_seed(4)
    logits = torch.tensor([0.0, 1.0, 2.0, -60.0, 0.5, -300.0, 1.5])
    n = 200_000
    s = sample_from_logits(logits.repeat(n, 1), chunk_bytes=4 * 7 * 999)  # partial last chunk
    freq = torch.bincount(s, minlength=7).double() / n
    p = torch.softmax(logits.double(), -1)
    sd = (p * (1 - p) / n).sqrt()
    big = p > 1e-3
    assert bool(((freq[big] - p[big]).abs() < 5 * sd[big]).all()), (freq, p)
    assert freq[5] == 0 and freq[3] == 0  # (near-)zero probability: never drawn here
    assert sample_from_logits(torch.zeros(0, 7)).shape == (0,)
    # per-row distributions: each row's samples follow its own logits
    rows = torch.stack([torch.tensor([5.0, -5.0, -5.0]), torch.tensor([-5.0, -5.0, 5.0])]).repeat(5000, 1)
    got = sample_from_logits(rows).view(5000, 2)
    assert (got[:, 0] == 0).float().mean() > 0.99 and (got[:, 1] == 2).float().mean() > 0.99


def test_mlm_last_block_on_masked_rows_only_equals_full_computation():
    """With labels, the MLM model runs its last block only at the masked positions; logits, loss and every
    parameter gradient equal the full computation (requesting hidden_states forces the full path)."""
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=200, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=40, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, add_pooling_layer=False)
    m = apply_kernels(TaskModel(cfg, head="mlm"), "cpu")
    ids = torch.randint(5, 200, (4, 20))
    am = torch.ones_like(ids)
    am[1, 15:] = 0
    am[3, 8:] = 0
    labels = torch.full_like(ids, -100)
    sel = (torch.rand(ids.shape) < 0.3) & (am == 1)
    labels[sel] = ids[sel]
    labels[2] = -100  # a sequence without targets
    rows = m(ids, am, labels=labels)
    rows.loss.backward()
    g_rows = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    full = m(ids, am, labels=labels, features=Features(hidden_states=True))
    full.loss.backward()
    n = int((labels != -100).sum())
    assert rows.last_hidden_state.shape == (n, 32) and full.last_hidden_state.shape == (4, 20, 32)
    assert torch.allclose(rows.last_hidden_state, full.last_hidden_state[labels != -100], atol=1e-6)
    assert torch.allclose(rows.logits, full.logits, atol=1e-6)
    assert abs(float(rows.loss) - float(full.loss)) < 1e-6
    for (name, p), g in zip(m.named_parameters(), g_rows):
        assert torch.allclose(g, p.grad, atol=1e-6), name


def test_reused_buffer_is_reused_only_when_nothing_shares_it():
    from bertforge.engine.kernels.scratch import ReusedBuffer
    for make_alias in (lambda t: t.detach(), lambda t: t[1:3], lambda t: t.t(), lambda t: t.view(-1)):
        buf = ReusedBuffer()
        a = buf.empty((4, 5), torch.float32, "cpu")
        first = a.data_ptr()
        alias = make_alias(a)  # aliases that are not all autograd views of ``a``
        del a
        b = buf.empty((4, 5), torch.float32, "cpu")
        assert b.data_ptr() != first  # something still shares the memory: a fresh tensor
        second = b.data_ptr()
        del b, alias
        c = buf.empty((2, 3), torch.float32, "cpu")
        assert c.data_ptr() == second and c.shape == (2, 3)  # released: reused, also for a smaller request


def test_reused_buffer_has_headroom_for_a_slightly_larger_request():
    """The MLM logits' row count (masked tokens) varies from step to step: a request up to 1/8 larger than
    the first is served from the same block; a larger one gets a new block."""
    from bertforge.engine.kernels.scratch import ReusedBuffer
    buf = ReusedBuffer()
    a = buf.empty((600, 40), torch.float32, "cpu")
    first = a.data_ptr()
    del a
    b = buf.empty((675, 40), torch.float32, "cpu")  # 600 · 9/8 rows
    assert b.data_ptr() == first and b.shape == (675, 40)
    del b
    c = buf.empty((676, 40), torch.float32, "cpu")
    assert c.data_ptr() != first


def _tied_head(vocab: int, seed: int):
    """An MLM prediction head (hidden 16) tied to a fresh (vocab, 16) embedding, with a non-zero bias."""
    from bertforge.config import ModelConfig
    from bertforge.objectives.mlm import MLMPrediction
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32)
    head = apply_kernels(MLMPrediction(cfg), "cpu")
    emb = torch.nn.Embedding(vocab, 16)
    head.tie(emb)
    with torch.no_grad():
        head.bias.normal_()
    return head, emb


def test_sparse_decoder_equals_linear_in_values_and_gradients_and_survives_two_forwards():
    head, emb = _tied_head(50, seed=4)
    h1, h2 = torch.randn(7, 16, requires_grad=True), torch.randn(7, 16, requires_grad=True)
    l1, l2 = head(h1), head(h2)  # two graphs alive at once: the second must not overwrite the first
    x1 = head.norm(head.act(head.dense(h1.detach())))
    assert torch.allclose(l1, F.linear(x1, emb.weight, head.bias), atol=1e-6)
    g = torch.randn(7, 50)
    (l1 * g).sum().backward()
    ours = (h1.grad.clone(), emb.weight.grad.clone(), head.bias.grad.clone())
    for t in (h1, emb.weight, head.bias):
        t.grad = None
    hr = h1.detach().requires_grad_()
    (F.linear(head.norm(head.act(head.dense(hr))), emb.weight, head.bias) * g).sum().backward()
    for a, b in zip(ours, (hr.grad, emb.weight.grad, head.bias.grad)):
        assert torch.allclose(a, b, atol=1e-5)
    assert l2.data_ptr() != l1.data_ptr()


@pytest.mark.parametrize("logits_used", [False, True])
def test_decoder_bias_inside_the_loss_equals_linear_then_cross_entropy(logits_used):
    """MLMPrediction.logits_and_cross_entropy (FP32 training: decoder GEMM without bias, bias added in the CE's
    row chunks, its gradient summed there) = F.linear + F.cross_entropy in logits, loss, arg-max and every
    gradient — also when the logits feed another loss (e.g. distillation) — and under no_grad."""
    head, emb = _tied_head(700, seed=8)
    h = torch.randn(23, 16, requires_grad=True)
    t = torch.randint(0, 700, (23,))
    g_rows, g_logits = torch.randn(23), torch.randn(23, 700)

    def total(logits, rows):
        return (rows * g_rows).sum() + ((logits * g_logits).sum() if logits_used else 0.0)

    logits, rows, correct = head.logits_and_cross_entropy(h, t, chunk_bytes=4 * 700 * 5)
    total(logits, rows).backward()
    ours = [x.grad.clone() for x in (h, emb.weight, head.bias)]
    for x in (h, emb.weight, head.bias):
        x.grad = None
    ref_logits = F.linear(head.norm(head.act(head.dense(h))), emb.weight, head.bias)
    ref_rows = F.cross_entropy(ref_logits, t, reduction="none")
    total(ref_logits, ref_rows).backward()
    assert torch.allclose(logits, ref_logits, atol=1e-5) and torch.allclose(rows, ref_rows, atol=1e-5)
    assert torch.equal(correct, ref_logits.argmax(-1) == t)
    for a, b in zip(ours, (h.grad, emb.weight.grad, head.bias.grad)):
        assert torch.allclose(a, b, atol=1e-5), float((a - b).abs().max())
    with torch.no_grad():
        l2, r2, _ = head.logits_and_cross_entropy(h, t)
    assert torch.allclose(l2, ref_logits, atol=1e-5) and torch.allclose(r2, ref_rows, atol=1e-5)


def test_cross_entropy_backward_twice_with_retain_graph_doubles_the_gradient():
    """The FP32 path hands its kept exp values to the first backward as the gradient's memory; a second
    backward (retain_graph=True) rebuilds them: twice the gradient, as plain PyTorch gives."""
    head, emb = _tied_head(300, seed=12)
    h = torch.randn(9, 16, requires_grad=True)
    t = torch.randint(0, 300, (9,))
    x = torch.randn(9, 300, requires_grad=True)
    for loss_of in (lambda: vocab_cross_entropy(x, t)[0].sum(), lambda: head.logits_and_cross_entropy(h, t)[1].sum()):
        for v in (x, h, emb.weight, head.bias):
            v.grad = None
        loss = loss_of()
        loss.backward(retain_graph=True)
        once = [v.grad.clone() for v in (x, h, emb.weight, head.bias) if v.grad is not None]
        loss.backward()
        twice = [v.grad for v in (x, h, emb.weight, head.bias) if v.grad is not None]
        assert len(once) == len(twice) > 0
        for a, b in zip(once, twice):
            assert torch.allclose(2 * a, b, atol=1e-6)


def test_vocab_cross_entropy_and_sampler_with_logits_spread_beyond_exp_underflow():
    """Rows whose logits span > 87 (exp underflows in FP32): the clamped kernels still equal torch's loss and
    gradient, and the sampler never draws a token whose weight underflows."""
    torch.manual_seed(6)
    n, v = 9, 500
    x = torch.randn(n, v) * 3
    x[:, : v // 2] -= 300.0  # half the vocabulary far below the max
    x.requires_grad_()
    t = torch.randint(0, v, (n,))
    rows, correct = vocab_cross_entropy(x, t, chunk_bytes=4 * v * 4)
    rows.sum().backward()
    ours = x.grad.clone()
    x.grad = None
    ref = F.cross_entropy(x, t, reduction="none")
    ref.sum().backward()
    assert torch.allclose(rows, ref.detach(), atol=1e-5)
    assert torch.allclose(ours, x.grad, atol=1e-7)
    assert torch.equal(correct, x.detach().argmax(-1) == t)
    draws = torch.stack([sample_from_logits(x.detach()) for _ in range(200)])
    assert bool((draws >= v // 2).all())


def _plain_torch(mp):
    """Route every CPU training kernel back to plain PyTorch ops (the independent reference)."""
    from bertforge.engine.kernels import cpu, mlm
    mp.setattr(cpu, "fused_self_attention", lambda *a, **k: None)
    mp.setattr(cpu, "_GELU_APPROXIMATE", {})
    mp.setattr(cpu, "token_embedding", lambda emb, ids: emb(ids))
    mp.setattr(mlm._DecoderLinear, "apply", staticmethod(lambda x, w, b, buf, tied=None: F.linear(x, w, b)))
    mp.setattr(mlm._BiasedCrossEntropy, "apply", staticmethod(
        lambda logits, b, t, cb: (lambda z: (*vocab_cross_entropy(z, t, cb), z))(logits + b)))


@pytest.mark.parametrize("objective,padded,set_to_none", [("mlm", False, True), ("mlm", True, False),
                                                          ("electra", False, True)])
def test_training_kernels_equal_plain_torch_over_steps(monkeypatch, objective, padded, set_to_none):
    """Fused self-attention from the QKV projection, GELU and token-embedding gradients in reused memory and
    the tied decoder's weight gradient in reused memory: over three steps (memory reused between them, or
    gradients accumulated without zeroing) loss and every parameter gradient equal plain PyTorch's with the
    same dropout masks (same seeds), with and without padding, for MLM (tied decoder) and ELECTRA (generator
    and discriminator share the token embeddings)."""
    import copy
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    from bertforge.objectives.electra import ElectraPretrainModel
    torch.manual_seed(0)
    kind = "electra" if objective == "electra" else "bert"
    cfg = ModelConfig(model_type=kind, vocab_size=120, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=24, add_pooling_layer=False,
                      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.2,
                      **({"embedding_size": 16} if kind == "electra" else {}))
    ours = apply_kernels(ElectraPretrainModel(cfg) if objective == "electra" else TaskModel(cfg, head="mlm"), "cpu")
    ref = copy.deepcopy(ours)
    batches = []
    for i in range(3):
        ids = torch.randint(5, 120, (4, 16))
        am = torch.ones_like(ids)
        if padded:
            am[1, 11:] = 0
            ids[1, 11:] = 0
        ids[2, 3] = ids[3, 7] = cfg.pad_token_id  # the padding id at attended positions: its row gets no gradient
        labels = torch.full_like(ids, -100)
        sel = (torch.rand(ids.shape) < 0.3) & (am == 1)
        labels[sel] = ids[sel]
        batches.append({"input_ids": ids, "attention_mask": am, "labels": labels})

    def run(model):
        model.train()
        if padded:
            model.encoder.unpad = False  # the padded (B, T) path with an additive bias
        losses, grads = [], []
        for i, batch in enumerate(batches):
            torch.manual_seed(100 + i)
            out = model(**batch)
            out.loss.backward()
            losses.append(float(out.loss))
            grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
            if set_to_none:
                model.zero_grad(set_to_none=True)
        return losses, grads

    if padded:
        assert hasattr(ours, "encoder")
    got = run(ours)
    with monkeypatch.context() as mp:
        _plain_torch(mp)
        want = run(ref)
    assert got[0] == pytest.approx(want[0], rel=1e-5)
    for g, w in zip(got[1], want[1]):
        assert g.keys() == w.keys() and len(g) > 10
        for name in g:  # relative to the gradient's scale (a tanh-GELU derivative would be ~1e-3 off)
            err = float((g[name] - w[name]).abs().max() / w[name].abs().max().clamp_min(1e-30))
            assert err < 2e-5, (name, err)


def test_tied_weight_gradient_is_one_tensor_and_never_leaks_across_backward_passes(monkeypatch):
    """The tied token-embedding/decoder weight gets one gradient tensor per backward pass (the decoder's and
    the lookup's parts added in place, no out-of-place sum: the same memory every step). Interleaved graphs —
    an MLM forward, an encoder-only forward, the encoder-only backward, then the MLM backward, then
    ``autograd.grad`` through the encoder alone — give plain PyTorch's gradients: no part is added into a
    gradient that another backward pass already consumed. So do losses that use the weight elsewhere too
    (a penalty on it, a second decoder like SpanBERT's SBO), which autograd sums with the tied pair's."""
    import copy
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    torch.manual_seed(3)
    cfg = ModelConfig(vocab_size=90, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=16, add_pooling_layer=False,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ours = apply_kernels(TaskModel(cfg, head="mlm"), "cpu").train()
    ref = copy.deepcopy(ours)
    ids = torch.randint(5, 90, (3, 12))
    ids[0, 4] = cfg.pad_token_id
    labels = torch.full_like(ids, -100)
    labels[:, ::3] = ids[:, ::3]

    def run(model):
        w = model.encoder.embeddings.word_embeddings.weight
        ptrs, grads = [], []
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=labels).loss.backward()
            ptrs.append(w.grad.data_ptr())
            grads.append(w.grad.clone())
        model.zero_grad(set_to_none=True)
        mlm = model(input_ids=ids, labels=labels).loss
        enc = model.encoder(input_ids=ids).last_hidden_state
        (enc ** 2).sum().backward()
        grads.append(w.grad.clone())
        mlm.backward()
        grads.append(w.grad.clone())
        h = model.encoder.embeddings(ids)
        grads.append(torch.autograd.grad(model.encoder(input_ids=ids).last_hidden_state.sum(), w)[0])
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=labels).loss.backward()
        grads.append(w.grad.clone())
        for other_use in (lambda o: (w ** 2).sum() * 1e-2,  # uses of the weight outside the tied pair,
                          lambda o: F.linear(o.last_hidden_state, w).logsumexp(-1).mean()):  # as SBO's
            model.zero_grad(set_to_none=True)
            out = model(input_ids=ids, labels=labels)
            (out.loss + other_use(out)).backward()
            grads.append(w.grad.clone())
        del h
        return ptrs, grads

    ref_copy = copy.deepcopy(ref)
    got_ptrs, got = run(ours)
    _, got_copy = run(copy.deepcopy(ours))  # a copy of a trained model: new Parameters, no hooks carried over
    with monkeypatch.context() as mp:
        _plain_torch(mp)
        _, want = run(ref)
        _, want_copy = run(ref_copy)
    assert got_ptrs[0] == got_ptrs[1]  # one V×E gradient, in the same memory every step
    for i, (g, w) in enumerate(zip(got + got_copy, want + want_copy)):
        assert torch.allclose(g, w, atol=1e-6, rtol=1e-5), (i, float((g - w).abs().max()))


def test_fused_self_attention_applies_only_to_cpu_fp32_training_with_dropout():
    from bertforge.engine.kernels.cpu import fused_self_attention
    qkv = torch.randn(2, 5, 24, requires_grad=True)
    assert fused_self_attention(qkv, 2, None, 0.1) is not None
    assert fused_self_attention(qkv, 2, None, 0.0) is None  # no dropout: SDPA's fused kernel is faster
    with torch.no_grad():
        assert fused_self_attention(qkv, 2, None, 0.1) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fused_self_attention(qkv, 2, None, 0.1) is None
    assert fused_self_attention(qkv.double(), 2, None, 0.1) is None
    assert fused_self_attention(qkv.transpose(0, 1), 2, None, 0.1) is None
