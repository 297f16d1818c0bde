"""train.no_duplicates: no global micro-batch of an in-batch-negative run holds a query or positive text twice,
and every pair of an epoch is served exactly once or counted as dropped (property-based, hypothesis)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from bertforge.engine.train.sampler import EpochSampler, no_duplicate_batches

rows = st.lists(st.tuples(st.integers(0, 30), st.integers(0, 12), st.lists(st.integers(0, 12), max_size=2)),
                min_size=1, max_size=120)


def _keys(data):
    """(query, positive, negatives) drawn from small pools, so texts repeat often: queries ``q…``, passages
    ``p…`` (a negative may be another row's positive)."""
    return [((f"q{q}", f"p{p}"), tuple(f"p{n}" for n in negs)) for q, p, negs in data]


@settings(max_examples=200, deadline=None)
@given(rows, st.integers(1, 9), st.randoms(use_true_random=False))
def test_no_batch_repeats_a_text_and_every_pair_is_served_once_or_dropped(data, size, rnd):
    keys = _keys(data)
    order = list(range(len(keys)))
    rnd.shuffle(order)
    batches, deferred, dropped, unfilled = no_duplicate_batches(order, keys, size)
    served = [i for b in batches for i in b]
    assert all(len(b) == size for b in batches) and len(unfilled) < size
    assert sorted(served + dropped + unfilled) == sorted(order)  # each pair once: in one batch, or counted
    for b in batches:
        texts = [t for i in b for t in set(keys[i][0])]
        assert len(texts) == len(set(texts)), "a query or positive twice in a batch"
        for i in b:
            others = {t for j in b if j != i for t in keys[j][0]}
            assert not set(keys[i][1]) & others, "a row's negative is another row's query or positive"
    assert 0 <= deferred <= len(order)


def test_pairs_without_repeats_keep_the_order_and_nothing_is_deferred():
    keys = [((f"q{i}", f"p{i}"), ()) for i in range(10)]
    order = [3, 1, 4, 0, 5, 9, 2, 6, 8, 7]
    batches, deferred, dropped, unfilled = no_duplicate_batches(order, keys, 3)
    assert batches == [[3, 1, 4], [0, 5, 9], [2, 6, 8]] and deferred == 0 and dropped == [] and unfilled == [7]


def test_a_repeated_positive_is_deferred_to_the_next_batch():
    # rows 0 and 1 share passage p0: row 1 waits for the next batch, row 2 takes its place
    keys = [(("q0", "p0"), ()), (("q1", "p0"), ()), (("q2", "p2"), ()), (("q3", "p3"), ())]
    batches, deferred, dropped, unfilled = no_duplicate_batches([0, 1, 2, 3], keys, 2)
    assert batches == [[0, 2], [1, 3]] and deferred == 1 and dropped == unfilled == []


def test_a_text_in_every_remaining_pair_is_dropped_and_counted():
    keys = [(("q0", "p0"), ()), (("q1", "p0"), ()), (("q2", "p0"), ()), (("q3", "p3"), ())]
    batches, deferred, dropped, unfilled = no_duplicate_batches([0, 1, 2, 3], keys, 2)
    assert batches == [[0, 3]] and sorted(dropped + unfilled) == [1, 2] and len(dropped) >= 1


def test_the_epoch_sampler_serves_clean_slices_and_cycles_whole_batches():
    keys = [((f"q{i}", f"p{i % 5}"), ()) for i in range(40)]  # every passage 8 times
    s = EpochSampler(40, seed=1, group=4, keys=keys)
    order = s.global_order(40)
    assert len(order) == 40
    for k in range(0, 40, 4):
        assert len({keys[i][0][1] for i in order[k:k + 4]}) == 4
    assert s.duplicates["dropped"] + s.duplicates["unfilled"] + 4 * s.duplicates["batches"] == 40
    assert s.global_order(40) == order  # a pure function of (seed, epoch)


def test_without_keys_the_order_is_the_plain_permutation():
    plain = EpochSampler(40, seed=1, group=4).global_order(40)
    assert sorted(plain) == list(range(40))
    assert EpochSampler(40, seed=1, group=4, keys=None).duplicates is None


def test_retrieval_pairs_name_their_texts_by_tokens():
    from bertforge.tasks.retrieval import PairExample, Pairs
    items = [{"input_ids": [[1, 2], [3, 4], [5]]}, {"input_ids": [[1, 2], [6], [7]]}]
    keys = Pairs(items, [PairExample("a", "b"), PairExample("a", "c")]).batch_keys()
    assert keys == [(((1, 2), (3, 4)), ((5,),)), (((1, 2), (6,)), ((7,),))]


def test_too_few_distinct_texts_for_one_batch_is_a_data_error():
    from bertforge.errors import DataError
    keys = [((f"q{i}", "p0"), ()) for i in range(8)]
    with pytest.raises(DataError, match="no_duplicates"):
        EpochSampler(8, seed=0, group=2, keys=keys).global_order(8)
