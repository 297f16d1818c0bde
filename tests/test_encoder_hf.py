"""Encoder core vs `transformers` on the same weights, in both directions.

Parity is checked at real-token positions: at padding positions the outputs are meaningless and
`transformers` itself disagrees with itself there (eager vs SDPA differ by ~4e-5 on MiniLM).
"""
import json

import pytest
import torch
import transformers as T

from bertforge.checkpoint import load_pretrained
from bertforge.config import ModelConfig
from bertforge.models.output import Features
from bertforge.task_model import TaskModel
from bertforge.tokenizer import encode_texts, load_tokenizer

SENTENCES = ["The quick brown fox jumps over the lazy dog.", "Padding matters.",
             "A somewhat longer sentence, with punctuation; and a café in Zürich!"]


def _batch(tok, texts, max_length=48, pad=0):
    enc = encode_texts(tok, texts, max_length=max_length)
    n = max(len(e.ids) for e in enc)
    ids = torch.tensor([e.ids + [pad] * (n - len(e.ids)) for e in enc])
    mask = torch.tensor([[1] * len(e.ids) + [0] * (n - len(e.ids)) for e in enc])
    return ids, mask


def _max_diff(ours, theirs, mask):
    m = mask.bool()
    return max((a - b)[m].abs().max().item() for a, b in zip(ours, theirs))


def test_minilm_hidden_states_and_attentions_match_transformers(minilm_dir):
    tok = load_tokenizer(minilm_dir)
    ids, mask = _batch(tok, SENTENCES)
    assert (mask == 0).any(), "the batch must contain padding"
    ours = load_pretrained(minilm_dir).eval()
    ref = T.AutoModel.from_pretrained(str(minilm_dir), attn_implementation="eager").eval()
    with torch.no_grad():
        a = ours(ids, mask, features=Features(hidden_states=True, attentions=True))
        b = ref(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        fast = ours(ids, mask)  # packed / SDPA path
    assert len(a.hidden_states) == 7 and len(a.attentions) == 6
    assert _max_diff(a.hidden_states, b.hidden_states, mask) < 1e-5
    # attention probabilities: every (query, key) where the query is a real token
    qm = mask[:, None, :, None].expand_as(a.attentions[0]).bool()
    assert max((x - y)[qm].abs().max().item() for x, y in zip(a.attentions, b.attentions)) < 1e-5
    assert _max_diff([fast.last_hidden_state], [b.last_hidden_state], mask) < 1e-5
    assert (a.pooler_output - b.pooler_output).abs().max() < 1e-5


def _random_hf(family, tmp_path):
    kw = dict(vocab_size=120, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
              max_position_embeddings=64, hidden_act="gelu")
    if family == "bert":
        cfg = T.BertConfig(hidden_size=32, **kw)
    elif family == "roberta":
        cfg = T.RobertaConfig(hidden_size=32, pad_token_id=1, type_vocab_size=1, **kw)
    elif family == "albert":
        cfg = T.AlbertConfig(hidden_size=32, embedding_size=16, **{**kw, "hidden_act": "gelu_new"})
    elif family == "electra":
        cfg = T.ElectraConfig(hidden_size=32, embedding_size=16, **kw)
    else:
        cfg = T.DistilBertConfig(vocab_size=120, dim=32, n_layers=3, n_heads=4, hidden_dim=64,
                                 max_position_embeddings=64)
    torch.manual_seed(0)
    model = T.AutoModel.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():  # make LayerNorms and biases non-trivial so a wrong map cannot pass
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    d = tmp_path / family
    model.save_pretrained(d)
    return model, d, cfg


def _ids(family, pad):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 120, (3, 20), generator=g)
    mask = torch.ones(3, 20, dtype=torch.long)
    mask[1, 12:] = 0
    mask[2, 5:] = 0
    ids[mask == 0] = pad
    return ids, mask


@pytest.mark.parametrize("family", ["bert", "roberta", "albert", "electra", "distilbert"])
def test_random_hf_checkpoint_loads_into_ours(family, tmp_path):
    ref, d, cfg = _random_hf(family, tmp_path)
    pad = cfg.pad_token_id
    ours = load_pretrained(d).eval()
    assert ours.config.model_type == family
    if family == "albert":
        assert ours.config.layer_sharing == "all"
        assert ours.encoder.layers[0].attention is ours.encoder.layers[2].attention
        assert ours.encoder.layers[0].ffn is ours.encoder.layers[2].ffn
    ids, mask = _ids(family, pad)
    with torch.no_grad():
        a = ours(ids, mask, features=Features(hidden_states=True, attentions=True))
        b = ref(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    assert _max_diff(a.hidden_states, b.hidden_states, mask) < 1e-5
    qm = mask[:, None, :, None].expand_as(a.attentions[0]).bool()
    assert max((x - y)[qm].abs().max().item() for x, y in zip(a.attentions, b.attentions)) < 1e-5


@pytest.mark.parametrize("family", ["bert", "roberta", "albert", "electra", "distilbert"])
@pytest.mark.parametrize("head", ["base", "sequence_classification"])
def test_our_saved_dir_loads_in_transformers(family, head, tmp_path):
    cfg = ModelConfig(model_type=family, vocab_size=100, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=48, max_position_embeddings=40,
                      pad_token_id=1 if family == "roberta" else 0,
                      type_vocab_size=0 if family == "distilbert" else 2,
                      embedding_size=16 if family in ("albert", "electra") else None,
                      layer_sharing="all" if family == "albert" else "none",
                      add_pooling_layer=family in ("bert", "albert"), num_labels=3)
    torch.manual_seed(0)
    ours = TaskModel(cfg, head=head).eval()
    with torch.no_grad():
        for p in ours.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    ours.save_pretrained(tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert saved["model_type"] == family and saved["architectures"]
    auto = T.AutoModel if head == "base" else T.AutoModelForSequenceClassification
    ref = auto.from_pretrained(str(tmp_path / "m"), attn_implementation="eager").eval()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 100, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 7:] = 0
    ids[mask == 0] = cfg.pad_token_id
    with torch.no_grad():
        a = ours(ids, mask, features=Features(hidden_states=True))
        b = ref(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    assert _max_diff(a.hidden_states, b.hidden_states, mask) < 1e-5
    if head != "base":
        assert (a.logits - b.logits).abs().max() < 1e-5
    # and back into ours
    again = load_pretrained(tmp_path / "m").eval()
    with torch.no_grad():
        c = again(ids, mask, features=Features(hidden_states=True))
    assert _max_diff(a.hidden_states, c.hidden_states, mask) == 0.0


@pytest.mark.parametrize("sharing", ["none", "attention", "ffn", "all"])
def test_layer_sharing_ties_the_named_modules(sharing):
    cfg = ModelConfig(model_type="albert", vocab_size=50, hidden_size=16, embedding_size=8,
                      num_hidden_layers=3, num_attention_heads=2, intermediate_size=32,
                      layer_sharing=sharing)
    enc = TaskModel(cfg).encoder
    l0, l2 = enc.layers[0], enc.layers[2]
    assert (l0.attention is l2.attention) == (sharing in ("attention", "all"))
    assert (l0.ffn is l2.ffn) == (sharing in ("ffn", "all"))
    n_unique = sum(p.numel() for p in enc.parameters())
    none = sum(p.numel() for p in TaskModel(cfg.replace(layer_sharing="none")).encoder.parameters())
    assert (n_unique < none) == (sharing != "none")


def test_packed_path_equals_padded_path_forward_and_backward():
    cfg = ModelConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=40, num_labels=2)
    torch.manual_seed(0)
    from bertforge.engine.kernels import apply_kernels
    model = apply_kernels(TaskModel(cfg, head="sequence_classification"), "cpu")  # the unpadded path is a kernel
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    ids, mask = _ids("bert", 0)
    ids = ids % 60
    labels = torch.tensor([0, 1, 1])
    grads = []
    for unpad in (False, True):
        model.encoder.unpad = unpad
        model.zero_grad()
        out = model(ids, mask, labels=labels)
        out.loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    assert max((grads[0][k] - grads[1][k]).abs().max().item() for k in grads[0]) < 1e-6


def test_load_pretrained_takes_the_embedded_name_as_the_cli_does(minilm_dir):
    from bertforge import load_pretrained
    a, b = load_pretrained("minilm"), load_pretrained(minilm_dir)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
