"""Mean / CLS / max pooling against hand-computed rows, and the torch and numpy paths agreeing."""
import numpy as np
import pytest
import torch

from bertforge.models.pooling import pool, pool_numpy


H = torch.tensor([[[1.0, 2.0], [3.0, -4.0], [100.0, 100.0]],
                  [[0.0, 1.0], [5.0, 5.0], [-1.0, 9.0]]])
M = torch.tensor([[1, 1, 0], [1, 1, 1]])


@pytest.mark.parametrize("mode,expected", [
    ("mean", [[2.0, -1.0], [4 / 3, 5.0]]),
    ("cls", [[1.0, 2.0], [0.0, 1.0]]),
    ("max", [[3.0, 2.0], [5.0, 9.0]]),
])
def test_pooling_matches_hand_computed_rows_and_ignores_padding(mode, expected):
    got = pool(H, M, mode)
    assert torch.allclose(got, torch.tensor(expected), atol=1e-6)
    assert np.allclose(pool_numpy(H.numpy(), M.numpy(), mode), expected, atol=1e-6)


def test_normalize_gives_unit_rows_in_the_same_direction():
    got = pool(H, M, "mean", normalize=True)
    assert torch.allclose(got.norm(dim=-1), torch.ones(2), atol=1e-6)
    assert torch.allclose(got[0], torch.tensor([2.0, -1.0]) / 5 ** 0.5, atol=1e-6)
    assert np.allclose(pool_numpy(H.numpy(), M.numpy(), "mean", normalize=True), got.numpy(), atol=1e-6)


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unknown pooling 'sum'"):
        pool(H, M, "sum")
