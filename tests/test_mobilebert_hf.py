"""MobileBERT family vs `transformers`' MobileBert* classes on the same random weights, both directions.

Dirs written by transformers load in bertforge and the reverse, with outputs within 1e-5 at every real token
of mixed-length padded batches, for every head (encoder, MLM, MLM + NSP, sequence and token classification,
QA) and for three block shapes: MobileBERT (NoNorm, ReLU, stacked FFNs, trigram embeddings, shared Q/K
bottleneck), the IB-BERT teacher (LayerNorm, one FFN, a bottleneck wider than the inter-block width) and a
block without bottleneck. The tolerance is float32 rounding of the same operations in another order.
"""
import json

import pytest
import torch
import transformers as T

from bertforge.checkpoint import load_pretrained
from bertforge.config import ModelConfig
from bertforge.errors import CheckpointError, ConfigError
from bertforge.models.mobilebert import MobileBertEncoder, NoNorm
from bertforge.task_model import TaskModel

HF_CLASSES = {"base": T.MobileBertModel, "mlm": T.MobileBertForMaskedLM, "mlm_nsp": T.MobileBertForPreTraining,
              "sequence_classification": T.MobileBertForSequenceClassification,
              "token_classification": T.MobileBertForTokenClassification,
              "question_answering": T.MobileBertForQuestionAnswering}
SHAPES = {  # HF MobileBertConfig keywords of each block shape
    "mobilebert": dict(hidden_size=48, embedding_size=16, intra_bottleneck_size=24, num_attention_heads=4,
                       intermediate_size=24, num_feedforward_networks=3, normalization_type="no_norm",
                       hidden_act="relu"),
    "ib-bert": dict(hidden_size=32, embedding_size=16, intra_bottleneck_size=64, num_attention_heads=4,
                    intermediate_size=80, num_feedforward_networks=1, normalization_type="layer_norm",
                    hidden_act="gelu", trigram_input=False),
    "no-bottleneck": dict(hidden_size=32, embedding_size=32, use_bottleneck=False, num_attention_heads=2,
                          intermediate_size=40, num_feedforward_networks=2, normalization_type="layer_norm",
                          trigram_input=False, hidden_act="relu"),
}


#: every head on the MobileBERT shape, the encoder and MLM heads on the other two
CASES = [(h, "mobilebert") for h in HF_CLASSES] + [(h, s) for s in ("ib-bert", "no-bottleneck") for h in ("base", "mlm")]


def _hf_config(shape="mobilebert", **kw):
    base = dict(vocab_size=97, num_hidden_layers=3, max_position_embeddings=64, type_vocab_size=2, pad_token_id=0,
                num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="eager")
    base.update(SHAPES[shape])
    base.update(kw)
    return T.MobileBertConfig(**base)


def _batch(lengths, seed=0, vocab=97):
    g = torch.Generator().manual_seed(seed)
    t = max(lengths)
    ids = torch.randint(1, vocab, (len(lengths), t), generator=g)
    mask = (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).long()
    types = (torch.arange(t)[None, :] >= torch.tensor(lengths)[:, None] // 2).long() * mask
    return ids.masked_fill(mask == 0, 0), mask, types


def _ref_outputs(ref, head, ids, mask, types) -> list:
    out = ref(input_ids=ids, attention_mask=mask, token_type_ids=types)
    if head == "base":
        return [out.last_hidden_state, out.pooler_output]
    if head == "mlm_nsp":
        return [out.prediction_logits, out.seq_relationship_logits]
    if head == "question_answering":
        return [torch.stack([out.start_logits, out.end_logits], 1)]
    return [out.logits]


def _our_outputs(model, head, ids, mask, types) -> list:
    out = model(ids, mask, types)
    if head == "base":
        return [out.last_hidden_state, out.pooler_output]
    if head == "mlm_nsp":  # the NSP logits from the same pooled state
        return [out.logits, model.head.seq_relationship(out.pooler_output)]
    return [out.logits]


def _real(x, mask, head):
    """The entries at real tokens: per-token outputs at mask 1; per-sequence outputs whole."""
    if x.dim() == 2:
        return x
    if head == "question_answering":
        return x.transpose(1, 2)[mask.bool()]
    return x[mask.bool()]


def _max_diff(a: list, b: list, mask, head) -> float:
    assert len(a) == len(b)
    return max(float((_real(x, mask, head) - _real(y, mask, head)).abs().max()) for x, y in zip(a, b))


def _randomise(model):
    """Norm weights away from 1 and biases away from 0, so every weight reaches the outputs."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or name.endswith("bias"):
                p.add_(0.1 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("head,shape", CASES)
def test_transformers_dirs_load_with_identical_outputs(head, shape, tmp_path):
    torch.manual_seed(0)
    labels = 2 if head == "question_answering" else 3
    ref = HF_CLASSES[head](_hf_config(shape, num_labels=labels)).eval()
    _randomise(ref)
    ref.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path, strict_head=head != "base")
    assert ours.config.model_type == "mobilebert" and ours.head_name == head
    assert isinstance(ours.encoder, MobileBertEncoder)
    for lengths in ([5, 12, 3], [17, 9, 13, 2]):
        ids, mask, types = _batch(lengths)
        with torch.no_grad():
            a = _our_outputs(ours, head, ids, mask, types)
            b = _ref_outputs(ref, head, ids, mask, types)
        assert _max_diff(a, b, mask, head) < 1e-5, lengths


def _our_config(shape: str, head: str) -> ModelConfig:
    hf = _hf_config(shape, num_labels=2 if head == "question_answering" else 4)
    keys = ("hidden_size", "embedding_size", "intra_bottleneck_size", "num_attention_heads", "intermediate_size",
            "num_feedforward_networks", "normalization_type", "hidden_act", "trigram_input", "use_bottleneck",
            "vocab_size", "num_hidden_layers", "max_position_embeddings", "num_labels")
    return ModelConfig(model_type="mobilebert", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                       add_pooling_layer=head in ("base", "mlm_nsp", "sequence_classification"),
                       **{k: getattr(hf, k) for k in keys})


@pytest.mark.parametrize("head,shape", CASES)
def test_bertforge_dirs_load_in_transformers_with_identical_outputs(head, shape, tmp_path):
    torch.manual_seed(1)
    ours = TaskModel(_our_config(shape, head), head=head).eval()
    _randomise(ours)
    ours.save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    assert d["model_type"] == "mobilebert" and d["architectures"][0].startswith("MobileBert")
    ref = HF_CLASSES[head].from_pretrained(tmp_path, attn_implementation="eager").eval()
    ids, mask, types = _batch([19, 7, 12], seed=2)
    with torch.no_grad():
        a = _our_outputs(ours, head, ids, mask, types)
        b = _ref_outputs(ref, head, ids, mask, types)
    assert _max_diff(a, b, mask, head) < 1e-5
    # and back: the dir transformers re-saves loads in bertforge with the same outputs
    ref.save_pretrained(tmp_path / "again")
    with torch.no_grad():
        c = _our_outputs(load_pretrained(tmp_path / "again"), head, ids, mask, types)
    assert _max_diff(a, c, mask, head) < 1e-5


def test_the_block_is_thin_inside_and_its_norm_is_no_norm():
    cfg = _our_config("mobilebert", "base")
    enc = TaskModel(cfg).encoder
    lyr = enc.layers[0]
    assert isinstance(lyr.attention_norm, NoNorm) and len(lyr.ffns) == cfg.num_feedforward_networks - 1
    assert lyr.attention.query.weight.shape == (cfg.intra_bottleneck_size, cfg.intra_bottleneck_size)
    assert lyr.attention.value.weight.shape == (cfg.intra_bottleneck_size, cfg.hidden_size)
    assert enc.embeddings.transformation.weight.shape == (cfg.hidden_size, 3 * cfg.embedding_size)
    x = torch.randn(2, 5, 3)
    n = NoNorm(3)
    with torch.no_grad():
        n.weight.copy_(torch.tensor([2.0, 3.0, 4.0]))
        n.bias.copy_(torch.tensor([1.0, 0.0, -1.0]))
    assert torch.equal(n(x), x * torch.tensor([2.0, 3.0, 4.0]) + torch.tensor([1.0, 0.0, -1.0]))


def test_widths_that_do_not_divide_and_unsupported_checkpoints_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="intra-block width 24 is not divisible by num_attention_heads 5"):
        ModelConfig(model_type="mobilebert", hidden_size=50, intra_bottleneck_size=24, num_attention_heads=5)
    ref = T.MobileBertModel(_hf_config(classifier_activation=False))
    ref.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="classifier_activation=false"):
        load_pretrained(tmp_path)
