"""ModernBERT family vs `transformers`' ModernBert* classes on the same random weights, both directions.

Dirs written by transformers load in bertforge and the reverse, with logits within 1e-5 at every real token
of mixed-length padded batches, at a length below and above the local window; the unpadded path equals the
padded one; a window that covers the sequence is exactly global attention.
"""
import json

import pytest
import torch
import transformers as T

from bertforge.checkpoint import load_pretrained
from bertforge.config import ModelConfig
from bertforge.task_model import TaskModel

HF_CLASSES = {"base": T.ModernBertModel, "mlm": T.ModernBertForMaskedLM,
              "sequence_classification": T.ModernBertForSequenceClassification,
              "token_classification": T.ModernBertForTokenClassification,
              "question_answering": T.ModernBertForQuestionAnswering}
WINDOW = 16  # local_attention: each local layer sees ±8 positions


def _hf_config(**kw):
    base = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                max_position_embeddings=256, local_attention=WINDOW, global_attn_every_n_layers=3,
                global_rope_theta=160000.0, local_rope_theta=10000.0, pad_token_id=0, bos_token_id=None,
                eos_token_id=None, cls_token_id=None, sep_token_id=None, num_labels=3,
                attn_implementation="eager")
    base.update(kw)
    return T.ModernBertConfig(**base)


def _batch(lengths, seed=0, vocab=97):
    g = torch.Generator().manual_seed(seed)
    t = max(lengths)
    ids = torch.randint(1, vocab, (len(lengths), t), generator=g)
    mask = (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


def _logits(out, head):
    if head == "base":
        return out.last_hidden_state
    if head == "question_answering" and hasattr(out, "start_logits"):
        return torch.stack([out.start_logits, out.end_logits], 1)
    return out.logits


def _real(x, mask, head):
    """The entries at real tokens: per-token outputs at mask 1; per-sequence outputs whole."""
    if head in ("sequence_classification",):
        return x
    if head == "question_answering":
        return x.transpose(1, 2)[mask.bool()]
    return x[mask.bool()]


def _randomise(model):
    """Norm weights away from 1 (and any biases away from 0), so every weight reaches the logits."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("head,pooling", [(h, "cls") for h in HF_CLASSES] + [("sequence_classification", "mean")])
def test_transformers_dirs_load_with_identical_logits(head, pooling, tmp_path):
    torch.manual_seed(0)
    labels = 2 if head == "question_answering" else 3
    ref = HF_CLASSES[head](_hf_config(classifier_pooling=pooling, num_labels=labels)).eval()
    _randomise(ref)
    ref.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path, strict_head=head != "base")
    assert ours.config.model_type == "modernbert" and ours.head_name == head
    for lengths in ([5, 12, 3], [40, 23, 31, 7]):  # all below the ±8 window, then above it
        ids, mask = _batch(lengths)
        with torch.no_grad():
            a = _logits(ours(ids, mask), head)
            b = _logits(ref(input_ids=ids, attention_mask=mask), head)
        assert (_real(a, mask, head) - _real(b, mask, head)).abs().max() < 1e-5, lengths


@pytest.mark.parametrize("head", ["base", "mlm", "sequence_classification", "token_classification"])
def test_bertforge_dirs_load_in_transformers_with_identical_logits(head, tmp_path):
    torch.manual_seed(1)
    cfg = ModelConfig(model_type="modernbert", vocab_size=97, hidden_size=32, num_hidden_layers=3,
                      num_attention_heads=2, intermediate_size=40, max_position_embeddings=128,
                      local_attention=WINDOW, global_attn_every_n_layers=2, layer_norm_eps=1e-5,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, type_vocab_size=0,
                      add_pooling_layer=False, num_labels=4, norm_bias=head == "token_classification",
                      classifier_pooling="mean" if head == "sequence_classification" else "cls")
    ours = TaskModel(cfg, head=head).eval()
    _randomise(ours)
    ours.save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    assert d["model_type"] == "modernbert" and d["layer_types"] == ["full_attention", "sliding_attention"] * 1 + [
        "full_attention"]
    ref = HF_CLASSES[head].from_pretrained(tmp_path, attn_implementation="eager").eval()
    ids, mask = _batch([30, 9, 22], seed=2)
    with torch.no_grad():
        a = _logits(ours(ids, mask), head)
        b = _logits(ref(input_ids=ids, attention_mask=mask), head)
    assert (_real(a, mask, head) - _real(b, mask, head)).abs().max() < 1e-5
    # and back: the dir transformers re-saves loads in bertforge with the same logits
    ref.save_pretrained(tmp_path / "again")
    with torch.no_grad():
        c = _logits(load_pretrained(tmp_path / "again")(ids, mask), head)
    assert (_real(a, mask, head) - _real(c, mask, head)).abs().max() < 1e-5


def _tiny(**kw):
    base = dict(model_type="modernbert", vocab_size=97, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                intermediate_size=48, max_position_embeddings=256, local_attention=WINDOW, type_vocab_size=0,
                add_pooling_layer=False, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    base.update(kw)
    return ModelConfig(**base)


def test_window_covering_the_sequence_is_exactly_global_attention():
    torch.manual_seed(0)
    # same RoPE base on both kinds, so only the window differs between local and global layers
    local = TaskModel(_tiny(local_attention=64, local_rope_theta=160000.0)).eval()
    glob = TaskModel(_tiny(local_attention=64, local_rope_theta=160000.0, global_attn_every_n_layers=1)).eval()
    glob.load_state_dict(local.state_dict())
    ids, mask = _batch([32, 20, 11])  # 64 // 2 = 32 ≥ 31 = T − 1
    with torch.no_grad():
        a, b = local(ids, mask).last_hidden_state, glob(ids, mask).last_hidden_state
    assert torch.equal(a[mask.bool()], b[mask.bool()])
    ids, mask = _batch([40, 20, 11])  # now the window is narrower than the sequence: they differ
    with torch.no_grad():
        a, b = local(ids, mask).last_hidden_state, glob(ids, mask).last_hidden_state
    assert (a[mask.bool()] - b[mask.bool()]).abs().max() > 1e-3


def test_unpadded_forward_and_gradients_equal_the_padded_ones():
    torch.manual_seed(0)
    model = TaskModel(_tiny(), head="mlm")
    ids, mask = _batch([40, 9, 27, 33], seed=5)
    labels = torch.full_like(ids, -100)
    labels[:, ::3] = ids[:, ::3]
    labels[mask == 0] = -100
    outs = {}
    for unpad in (True, False):
        model.encoder.unpad = unpad
        model.zero_grad()
        out = model(ids, mask, labels=labels)
        out.loss.backward()
        outs[unpad] = (out.loss.detach(), [p.grad.clone() for p in model.parameters()])
    assert abs(outs[True][0] - outs[False][0]) < 1e-6
    assert max((a - b).abs().max() for a, b in zip(outs[True][1], outs[False][1])) < 1e-5


def test_hub_config_spellings_and_refusals():
    """The hub's ModernBERT-base config.json (transformers 4.x keys) reads as transformers 5 reads it; what this
    family does not implement is refused with one line."""
    from bertforge.errors import CheckpointError
    from bertforge.checkpoint import config_from_hf
    hub = {"model_type": "modernbert", "architectures": ["ModernBertForMaskedLM"], "vocab_size": 50368,
           "hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22, "num_attention_heads": 12,
           "hidden_activation": "gelu", "max_position_embeddings": 8192, "norm_eps": 1e-5, "norm_bias": False,
           "global_attn_every_n_layers": 3, "local_attention": 128, "global_rope_theta": 160000.0,
           "local_rope_theta": 10000.0, "pad_token_id": 50283, "classifier_pooling": "mean",
           "attention_bias": False, "mlp_bias": False, "classifier_bias": False}
    c = config_from_hf(hub)
    ref = T.ModernBertConfig(**{k: v for k, v in hub.items() if k not in ("model_type", "architectures")})
    assert [c.layer_type(i) for i in range(22)] == ref.layer_types
    assert (c.global_rope_theta, c.local_rope_theta) == (ref.rope_parameters["full_attention"]["rope_theta"],
                                                         ref.rope_parameters["sliding_attention"]["rope_theta"])
    assert (c.local_attention, c.classifier_pooling, c.type_vocab_size, c.layer_norm_eps) == (128, "mean", 0, 1e-5)
    for bad in ({"attention_bias": True}, {"tie_word_embeddings": False},
                {"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1e4}}}):
        with pytest.raises(CheckpointError):
            config_from_hf({**hub, **bad})
