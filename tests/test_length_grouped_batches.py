"""Length-grouped training batches (train.group_by_length) and per-column encoding of (B, C, T) batches:
both change only how texts are padded, never which texts a run sees or what the model computes."""
import random

import torch

from bertforge.config import ModelConfig
from bertforge.engine.train.sampler import EpochSampler, item_length
from bertforge.task_model import TaskModel


def _lengths(n, seed=0):
    rng = random.Random(seed)
    return [rng.choice([rng.randint(5, 20), rng.randint(100, 256)]) for _ in range(n)]


def test_grouped_order_is_a_permutation_with_little_padding():
    n, b = 2000, 32
    lengths = _lengths(n)
    plain = EpochSampler(n, seed=3)
    grouped = EpochSampler(n, seed=3, lengths=lengths, group=b)
    for epoch in (0, 1):
        plain.set_epoch(epoch)
        grouped.set_epoch(epoch)
        order = grouped.global_order()
        assert sorted(order) == list(range(n))  # every item once per epoch

        def padded(o):  # tokens computed when each slice of b is padded to its longest
            return sum(b * max(lengths[i] for i in o[k:k + b]) for k in range(0, n - n % b, b))
        real = sum(lengths[i] for i in order[:n - n % b])
        # random batches of a 50/50 short/long mix pad nearly everything to ~256; grouped ones barely pad
        assert padded(plain.global_order()) > 1.6 * real
        assert padded(order) < 1.1 * real
    # a pure function of (seed, epoch): resume and N processes see the same order
    again = EpochSampler(n, seed=3, lengths=lengths, group=b)
    again.set_epoch(1)
    assert again.global_order() == grouped.global_order()
    grouped.set_epoch(0)
    assert grouped.global_order() != again.global_order()


def test_grouped_batches_are_shuffled_not_sorted_longest_first():
    n, b = 3200, 32
    lengths = _lengths(n, seed=1)
    s = EpochSampler(n, seed=0, lengths=lengths, group=b)
    order = s.global_order()
    maxima = [max(lengths[i] for i in order[k:k + b]) for k in range(0, n, b)]
    # sorted mega-batches alone would make the batch maxima fall within each run of 50; shuffled slices do not
    falls = sum(x >= y for x, y in zip(maxima, maxima[1:]))
    assert 0.3 < falls / (len(maxima) - 1) < 0.7


def test_item_length_reads_lists_columns_and_tensors():
    assert item_length({"input_ids": [1, 2, 3]}) == 3
    assert item_length({"input_ids": [[1, 2], [1, 2, 3, 4, 5]]}) == 5
    assert item_length({"input_ids": torch.zeros(2, 7)}) == 7


def test_columns_encoded_apart_equal_one_pass_over_all_rows():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=64)
    model = TaskModel(cfg, head="embedding").eval()
    b, c, t = 4, 3, 20
    ids = torch.randint(3, 50, (b, c, t))
    mask = torch.zeros(b, c, t, dtype=torch.long)
    for i in range(b):  # queries short, passages long, negatives in between
        for j, n in enumerate((3 + i, 20 - i, 9 + i)):
            mask[i, j, :n] = 1
    ids = ids * mask
    with torch.no_grad():
        apart = model(ids, mask, torch.zeros_like(ids))
        rows = model.encoder(ids.flatten(0, 1), mask.flatten(0, 1), torch.zeros_like(ids).flatten(0, 1))
    from bertforge.models.pooling import pool
    ref = pool(rows.last_hidden_state, mask.flatten(0, 1), "mean", False).reshape(b, c, -1)
    assert apart.logits.shape == (b, c, 32)
    torch.testing.assert_close(apart.logits, ref, rtol=1e-5, atol=1e-5)
    real = mask.flatten(0, 1).bool()
    torch.testing.assert_close(apart.last_hidden_state[real], rows.last_hidden_state[real], rtol=1e-5, atol=1e-5)
    assert apart.loss is not None and torch.isfinite(apart.loss)
