"""The search losses equal their references: InfoNCE / MultipleNegativesRanking (and its symmetric form) equal
sentence-transformers' MultipleNegativesRankingLoss on the same embeddings; Matryoshka is the sum over the
nested dims; Margin-MSE and the pooled-embedding MSE equal hand-computed values."""
import math

import pytest
import torch

from bertforge.tasks.retrieval import (check_dims, margin_mse_loss, matryoshka_loss, mine_hard_negatives, mnrl_loss,
                                       mnrl_symmetric_loss)


def _emb(b=6, c=3, h=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, c, h, generator=g)


@pytest.mark.parametrize("cols", [2, 4])
def test_mnrl_equals_sentence_transformers(cols):
    st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    emb = _emb(c=cols)
    ref = st_losses.MultipleNegativesRankingLoss(model=None, scale=20.0)
    want = ref.compute_loss_from_embeddings([emb[:, j] for j in range(cols)], None)
    assert float(mnrl_loss(emb, scale=20.0)) == pytest.approx(float(want), rel=1e-5)


def test_symmetric_mnrl_equals_sentence_transformers_both_directions():
    st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    emb = _emb(c=3, seed=1)
    ref = st_losses.MultipleNegativesRankingLoss(model=None, scale=10.0, directions=("query_to_doc", "doc_to_query"),
                                                 partition_mode="per_direction")
    want = ref.compute_loss_from_embeddings([emb[:, j] for j in range(3)], None)
    got = mnrl_symmetric_loss(emb, scale=10.0)
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    assert float(got) != pytest.approx(float(mnrl_loss(emb, scale=10.0)), rel=1e-3)  # the second direction counts


def test_mnrl_hand_computed_two_examples():
    # q0=(1,0), q1=(0,1); p0=(1,0), p1=(1,1)/√2 (cosines 1, 1/√2 | 0, 1/√2), scale 1
    emb = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [1.0, 1.0]]])
    c = 1 / math.sqrt(2)
    l0 = -math.log(math.exp(1) / (math.exp(1) + math.exp(c)))
    l1 = -math.log(math.exp(c) / (math.exp(0) + math.exp(c)))
    assert float(mnrl_loss(emb, scale=1.0)) == pytest.approx((l0 + l1) / 2, rel=1e-6)


def test_matryoshka_is_the_weighted_sum_over_truncated_dims():
    emb = _emb(h=32, seed=2)
    dims, w = [32, 16, 8], [1.0, 0.5, 2.0]
    want = sum(wi * float(mnrl_loss(emb[..., :d], scale=20.0)) for d, wi in zip(dims, w))
    assert float(matryoshka_loss(mnrl_loss, emb, dims, w, scale=20.0)) == pytest.approx(want, rel=1e-6)
    # each prefix is its own embedding: a loss of the 8-dim prefix differs from the full one
    assert float(mnrl_loss(emb[..., :8])) != pytest.approx(float(mnrl_loss(emb)), rel=1e-3)


def test_margin_mse_hand_computed():
    q = torch.tensor([[1.0, 2.0], [0.0, 1.0]])
    p = torch.tensor([[1.0, 1.0], [2.0, 3.0]])
    n = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    t = torch.tensor([0.5, 4.0])
    # dot margins: (3 − 2) = 1 and (3 − 0) = 3 → ((1 − 0.5)² + (3 − 4)²) / 2 = 0.625
    assert float(margin_mse_loss(q, p, n, t)) == pytest.approx(0.625)


def test_margin_mse_equals_sentence_transformers():
    st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    e = _emb(c=3, seed=3)
    t = torch.randn(6)
    want = st_losses.MarginMSELoss(model=None).compute_loss_from_embeddings([e[:, 0], e[:, 1], e[:, 2]], t)
    assert float(margin_mse_loss(e[:, 0], e[:, 1], e[:, 2], t)) == pytest.approx(float(want), rel=1e-5)


def test_mined_negatives_are_the_best_ranked_non_positives():
    q = torch.eye(3).numpy()
    docs = torch.tensor([[1.0, 0, 0], [0.9, 0.1, 0], [0, 1.0, 0], [0.3, 0.8, 0.2], [0, 0, 1.0]]).numpy()
    got = mine_hard_negatives(q, docs, positives=[0, 2, 4], n=1)
    assert got == [[1], [3], [3]]
    assert mine_hard_negatives(q, docs, positives=[0, 2, 4], n=1, skip=1)[0] == [3]


def test_matryoshka_dim_larger_than_the_model_is_refused():
    from bertforge.errors import ConfigError
    assert check_dims("64,384,128", 384) == [384, 128, 64]
    with pytest.raises(ConfigError, match="larger than the model's embedding width 384"):
        check_dims("512,256", 384)
