"""Logged loss terms are summed on the device and read once per log step, with the same values as summing
the host floats one by one (the float64 additions are the same, in the same order).

Independent truth: Python's float sum of ``float(v)`` for each value."""
from __future__ import annotations

import torch

from bertforge.engine.train.distributed import DistContext
from bertforge.engine.train.running import RunningMeans


def test_device_sums_equal_host_float_sums_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    values = [torch.randn((), generator=g) * 10 ** float(torch.randint(-3, 4, (1,), generator=g)) for _ in range(50)]
    m = RunningMeans()
    for v in values:
        m.add("loss", v)
        m.add("loss_bf16", v.to(torch.bfloat16))
        m.add("mlm_count", 7.0)
    host = 0.0
    for v in values:
        host += float(v)
    host_bf16 = 0.0
    for v in values:
        host_bf16 += float(v.to(torch.bfloat16).float())
    means = m.means(DistContext())
    assert means["loss"] == host / len(values)
    assert means["loss_bf16"] == host_bf16 / len(values)
    assert means["mlm_count"] == 7.0
    assert list(means) == ["loss", "loss_bf16", "mlm_count"]  # in the order they were first logged


def test_values_stay_on_the_device_until_read():
    m = RunningMeans({"loss": (1.5, 1)})  # a resumed log window
    m.add("loss", torch.tensor(2.5))
    s, c = m._d["loss"]
    assert torch.is_tensor(s) and s.dtype == torch.float64 and c == 2  # not yet read to the host
    assert m.reduce(DistContext()) == {"loss": (4.0, 2)}
    m.clear()
    assert m.reduce(DistContext()) == {}
