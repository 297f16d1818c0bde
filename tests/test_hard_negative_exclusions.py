"""Hard-negative mining never mines a positive of the same query text (sentence-transformers PR #2848) nor a
passage within the margin of the query's positive (its ``absolute_margin``): hand-built embeddings whose
scores are known exactly."""
from __future__ import annotations

import numpy as np
import pytest

from bertforge.tasks.hard_negatives import mine_hard_negatives, positives_by_query


def _unit(angle_deg):
    a = np.deg2rad(angle_deg)
    return np.array([np.cos(a), np.sin(a)], dtype=np.float32)


# one query along x; documents at known angles, so cosine scores are cos(angle)
QUERY = np.stack([_unit(0)])
DOCS = np.stack([_unit(a) for a in (10, 12, 14, 40, 60, 80)])  # cos: .985 .978 .970 .766 .500 .174


def test_every_positive_of_the_query_text_is_excluded_not_only_the_rows_own():
    # rows 0 and 1 ask the same question; their positives are documents 0 and 1
    only_own = mine_hard_negatives(QUERY, DOCS, [0], n=1)
    assert only_own == [[1]]  # the row's own positive alone excluded: the other positive is mined (the bug)
    both = mine_hard_negatives(QUERY, DOCS, [[0, 1]], n=1)
    assert both == [[2]]


def test_positives_by_query_groups_rows_by_query_text():
    from bertforge.tasks.retrieval import PairExample
    ex = [PairExample("q", "a"), PairExample("q", "b"), PairExample("r", "a")]
    assert positives_by_query(ex, {"a": 0, "b": 1}) == {"q": {0, 1}, "r": {0}}


def test_a_passage_within_the_margin_of_the_positive_is_skipped():
    # positive doc 0 scores cos 10° = .9848; doc 1 (.9781) and doc 2 (.9703) are within 0.05 of it, doc 3
    # (.7660) is not: with the margin the first negative is doc 3
    assert mine_hard_negatives(QUERY, DOCS, [0], n=1, margin=None) == [[1]]
    stats = {}
    assert mine_hard_negatives(QUERY, DOCS, [0], n=2, margin=0.05, stats=stats) == [[3, 4]]
    assert stats == {"fallback": 0, "margin_skipped": 2}
    # with several positives the least similar one sets the bar: positives 0 and 2 (.9703) → below .9203
    assert mine_hard_negatives(QUERY, DOCS, [[0, 2]], n=1, margin=0.05) == [[3]]


def test_a_query_with_too_few_passages_below_the_margin_takes_its_lowest_scored_ones():
    stats = {}
    # positive doc 5 scores .174: every other passage scores above it, so none passes a 0.05 margin
    assert mine_hard_negatives(QUERY, DOCS, [5], n=2, margin=0.05, stats=stats) == [[4, 3]]
    assert stats["fallback"] == 1


def test_skip_counts_after_the_exclusions():
    assert mine_hard_negatives(QUERY, DOCS, [[0, 1]], n=1, skip=1, margin=None) == [[3]]


def test_the_margin_setting_is_checked():
    from bertforge.errors import ConfigError
    from bertforge.tasks import adapter_for, get_task
    a = adapter_for(get_task("retrieval"), None, 32)
    a.configure({}, 8)
    assert a.hard_negatives_margin == 0.05
    a.configure({"hard_negatives_margin": None}, 8)
    assert a.hard_negatives_margin is None
    with pytest.raises(ConfigError, match="hard_negatives_margin"):
        a.configure({"hard_negatives_margin": -1}, 8)
