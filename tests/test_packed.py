"""MKL-packed FP32 inference (bertforge.compress.packed): the same outputs as the unpacked model.

Truth: the model before packing (nn.Linear → cblas_sgemm on the plain weight), on the same inputs.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from bertforge.compress import packed
from bertforge.config import ModelConfig
from bertforge.task_model import TaskModel

pytestmark = pytest.mark.skipif(not packed.available(), reason="PyTorch built without MKL")


def test_packed_model_equals_unpacked_at_any_batch_and_length():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=300, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=80, max_position_embeddings=160)
    model = TaskModel(cfg, head="sequence_classification").eval()
    fast = copy.deepcopy(model)
    n_linear = sum(type(m) is nn.Linear for m in model.modules())
    assert packed.pack_linears(fast) == n_linear > 0
    assert not any(type(m) is nn.Linear for m in fast.modules())
    for b, t in [(1, 1), (1, 7), (1, 128), (3, 150)]:
        ids = torch.randint(5, 300, (b, t))
        am = torch.ones(b, t, dtype=torch.long)
        am[0, t // 2:] = 0 if t > 1 else 1
        with torch.inference_mode():
            ref = model(input_ids=ids, attention_mask=am).logits
            got = fast(input_ids=ids, attention_mask=am).logits
        assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5), (b, t, (got - ref).abs().max())


def test_packed_linear_falls_back_for_other_dtypes_and_gradients():
    torch.manual_seed(1)
    lin = nn.Linear(16, 8)
    p = packed.PackedLinear(lin)
    x = torch.randn(5, 16)
    assert torch.allclose(p(x), lin(x), atol=1e-6)
    xb = x.bfloat16()
    assert p(xb).dtype == torch.bfloat16
    xg = x.clone().requires_grad_()
    p(xg).sum().backward()  # falls back to F.linear, so the input gradient is Wᵀ·1
    assert torch.allclose(xg.grad, lin.weight.detach().sum(0).expand(5, 16), atol=1e-6)
