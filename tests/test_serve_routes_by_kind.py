"""Which routes a served model answers, by its kind: /rerank for embedding models (cosine) and one-output
cross-encoders (scores), never for a classifier with several labels (it has no pair score)."""
from bertforge.server.models import ServedModel


class _Runner:
    outputs = ("last_hidden_state", "logits")


def test_rerank_is_answered_by_embedding_models_and_one_output_classifiers_only():
    assert "rerank" in ServedModel("enc", _Runner(), "base").routes
    assert "rerank" in ServedModel("emb", _Runner(), "embedding").routes  # finetune --task retrieval
    assert "rerank" in ServedModel("ce", _Runner(), "classification", labels=["score"]).routes
    assert "rerank" not in ServedModel("four", _Runner(), "classification", labels=list("abcd")).routes
    assert ServedModel("four", _Runner(), "classification", labels=list("abcd")).routes[0] == "predict"
