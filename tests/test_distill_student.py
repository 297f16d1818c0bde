"""Students (copied layers, shapes), the distiller objective, the teacher-output cache, augmentation."""
import json

import numpy as np
import pytest
import torch

from bertforge.config import ModelConfig
from bertforge.distillation.augment import Augmenter, EmbeddingLexicon, MaskedLMPredictor, augment_examples
from bertforge.distillation.cache import TeacherCache
from bertforge.distillation.distiller import Distiller, build_terms, method_terms
from bertforge.distillation.features import combined_logits
from bertforge.distillation.student import build_student, parse_shape
from bertforge.errors import ConfigError
from bertforge.models.output import Features
from bertforge.task_model import TaskModel


def tiny_cfg(**kw):
    d = dict(vocab_size=50, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    d.update(kw)
    return ModelConfig(**d)


def batch(b=3, t=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 50, (b, t), generator=g)
    am = torch.ones(b, t, dtype=torch.long)
    am[0, 5:] = 0
    return {"input_ids": ids, "attention_mask": am, "token_type_ids": torch.zeros_like(ids)}


def test_parse_shape():
    assert parse_shape("4L-312H-12A-1200I") == {"num_hidden_layers": 4, "hidden_size": 312,
                                                "num_attention_heads": 12, "intermediate_size": 1200}
    assert parse_shape("6L-768H") == {"num_hidden_layers": 6, "hidden_size": 768, "num_attention_heads": 12,
                                      "intermediate_size": 3072}
    for bad in ("4L", "4X-312H", "4L-310H-12A"):
        with pytest.raises(ConfigError):
            parse_shape(bad)


def test_copied_layers_equal_teacher_layers(tmp_path):
    torch.manual_seed(0)
    teacher = TaskModel(tiny_cfg(), head="sequence_classification").eval()
    student = build_student("layers:0,2", teacher, head="sequence_classification").eval()
    ts, ss = teacher.state_dict(), student.state_dict()
    for j, i in enumerate([0, 2]):
        for k, v in teacher.encoder.layers[i].state_dict().items():
            assert torch.equal(ss[f"encoder.layers.{j}.{k}"], v)
    for k in ss:
        if k.startswith(("encoder.embeddings", "encoder.pooler", "head")):
            assert torch.equal(ss[k], ts[k]), k
    # independent check: run the teacher's own blocks 0 and 2 by hand
    bt = batch()
    x = teacher.encoder.embeddings(bt["input_ids"], bt["token_type_ids"])
    from bertforge.models.attention import padding_mask_bias
    bias = padding_mask_bias(bt["attention_mask"], x.dtype)
    for i in (0, 2):
        x = teacher.encoder.layers[i](x, bias)[0]
    out = student(**bt, features=Features(hidden_states=True))
    assert torch.allclose(out.hidden_states[-1], x, atol=1e-5)
    # recorded in the saved config.json
    student.save_pretrained(tmp_path / "s")
    cfg = json.loads((tmp_path / "s" / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2 and cfg["bertforge"]["student"]["layers"] == [0, 2]


def test_shape_student_recorded():
    teacher = TaskModel(tiny_cfg())
    s = build_student("2L-16H-2A-40I", teacher)
    c = s.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == (2, 16, 2, 40)
    assert c.vocab_size == 50 and c.bertforge["student"]["shape"]["hidden_size"] == 16


def test_identical_student_has_zero_losses():
    """A student that is a full copy of the teacher must score 0 on every representation/logit loss."""
    torch.manual_seed(1)
    teacher = TaskModel(tiny_cfg(), head="sequence_classification")
    student = build_student("layers:0,1,2,3", teacher, head="sequence_classification")
    entries = method_terms("tinybert", "task") + method_terms("minilm", "task") + [
        {"loss": "cosine", "layers": "uniform"}, {"loss": "pkd", "layers": "pkd_skip"}]
    terms = build_terms(entries, 4, 4)
    d = Distiller(student, [teacher], terms).eval()
    out = d(**batch())
    for name, v in out.terms.items():
        if name == "soft_ce":  # = entropy of the teacher, not 0
            continue
        assert abs(float(v)) < 1e-5, (name, float(v))


def test_projection_and_training_reduces_loss():
    """TinyBERT-shape student (narrower) gets W_h projections; a few Adam steps lower the loss."""
    torch.manual_seed(2)
    teacher = TaskModel(tiny_cfg(), head="base")
    student = build_student("2L-16H-2A-32I", teacher)
    terms = build_terms(method_terms("tinybert", "general"), 2, 4)
    d = Distiller(student, [teacher], terms)
    # TinyBERT eq. 8–9: one W_h shared by every hidden-layer pair, and W_e for the embeddings
    assert set(d.proj) == {"embedding_mse", "hidden_mse"}
    from bertforge.distillation.losses import hidden_mse_loss
    with torch.no_grad():
        bt0 = batch(b=2, t=6)
        hs = student(**bt0, features=Features(hidden_states=True)).hidden_states
        ht = teacher(**bt0, features=Features(hidden_states=True)).hidden_states
        want = sum(hidden_mse_loss(hs[s], ht[t], bt0["attention_mask"], proj=d.proj["hidden_mse"])
                   for s, t in [(1, 2), (2, 4)])
        assert float(d(**bt0).terms["hidden_mse"]) == pytest.approx(float(want), rel=1e-5)
    assert all(not p.requires_grad for p in teacher.parameters())
    names = {n for n, _ in d.named_parameters()}
    assert not any(n.startswith("_teachers") for n in names)
    opt = torch.optim.Adam([p for p in d.parameters() if p.requires_grad], lr=3e-3)
    bt = batch(b=8, t=8)
    first = d(**bt).loss.item()
    for _ in range(30):
        opt.zero_grad()
        d(**bt).loss.backward()
        opt.step()
    assert d(**bt).loss.item() < 0.5 * first
    d.train()
    assert not teacher.training  # the teacher stays in eval mode


def test_multi_teacher_averaged_soft_targets():
    torch.manual_seed(3)
    t1 = TaskModel(tiny_cfg(), head="sequence_classification").eval()
    t2 = TaskModel(tiny_cfg(), head="sequence_classification").eval()
    s = build_student("layers:0", t1, head="sequence_classification")
    d = Distiller(s, [t1, t2], build_terms([{"loss": "kd", "temperature": 3.0}], 1, 4)).eval()
    bt = batch()
    feats = d.teacher_features(**bt)
    z = combined_logits(feats, "logits", 3.0)
    want = (torch.softmax(t1(**bt).logits / 3, -1) + torch.softmax(t2(**bt).logits / 3, -1)) / 2
    assert torch.allclose(torch.softmax(z / 3, -1), want, atol=1e-6)


def test_cache_roundtrip_and_teacher_not_run(tmp_path):
    torch.manual_seed(4)
    teacher = TaskModel(tiny_cfg(), head="sequence_classification")
    student = build_student("2L-16H-2A-32I", teacher, head="sequence_classification",
                            head_config={})
    terms = build_terms(method_terms("tinybert", "task") + [{"loss": "kd", "temperature": 2.0}], 2, 4)
    d = Distiller(student, [teacher], terms).eval()
    cache = TeacherCache(tmp_path / "c", 6, d.cache_shapes(10), {"x": 1})
    d.cache = cache
    calls = []
    teacher.register_forward_hook(lambda *a: calls.append(1))
    bt = {**batch(b=3, t=7), "example_index": torch.tensor([4, 0, 2])}
    live = d(**bt)
    assert len(calls) == 1 and not cache.complete and cache.has(torch.tensor([0, 2, 4]))
    again = d(**bt)
    assert len(calls) == 1  # served from the memory-mapped cache
    for k in live.terms:
        assert float(again.terms[k]) == pytest.approx(float(live.terms[k]), rel=2e-3, abs=2e-3), k
    # reopened with the same fingerprint: still filled; a different fingerprint rebuilds it
    c2 = TeacherCache(tmp_path / "c", 6, d.cache_shapes(10), {"x": 1})
    assert c2.has(torch.tensor([0, 2, 4]))
    c3 = TeacherCache(tmp_path / "c", 6, d.cache_shapes(10), {"x": 2})
    assert not c3.has(torch.tensor([0]))


class _Tok:
    """Whitespace tokenizer: words in ``vocab`` are one piece, others split into characters."""

    def __init__(self, vocab):
        self.vocab = {w: i for i, w in enumerate(vocab)}

    def encode(self, text, add_special_tokens=True):
        ids = []
        for w in text.split():
            ids += [self.vocab[w]] if w in self.vocab else [self.vocab["[UNK]"]] * len(w)
        if add_special_tokens:
            ids = [self.vocab["[CLS]"]] + ids + [self.vocab["[SEP]"]]
        return type("E", (), {"ids": ids})()

    def token_to_id(self, t):
        return self.vocab.get(t)

    def id_to_token(self, i):
        return {v: k for k, v in self.vocab.items()}[i]

    def get_vocab(self):
        return dict(self.vocab)


def test_augmenter_tinybert_rules():
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "great", "fine", "film", "movie", "the"]
    tok = _Tok(vocab)
    seen = []

    def mlm(ids):  # predicts "great" > "fine" > "good" at the masked position
        seen.append(ids.tolist())
        logits = torch.full((1, ids.shape[1], len(vocab)), -5.0)
        logits[0, :, 6], logits[0, :, 7], logits[0, :, 5] = 3.0, 2.0, 1.0
        return logits

    lex = EmbeddingLexicon(["unwatchable", "boring", "dull"], np.array([[1.0, 0], [0.9, 0.1], [0.8, 0.3]]))
    aug = Augmenter(tok, mlm=MaskedLMPredictor(tok, mlm), lexicon=lex, p=1.0, k=1, seed=0)
    out = aug.augment("good unwatchable .", 3)
    # single-piece "good" → MLM top-1 ("great"); multi-piece "unwatchable" → nearest neighbour ("boring")
    assert out == ["great boring ."] * 3
    assert seen[0] == [[2, 4] + [1] * 12 + [3]]  # [CLS] [MASK] unwatchable(11 pieces) . [SEP]
    none = Augmenter(tok, lexicon=lex, p=0.0, k=2, seed=0)
    assert none.augment("good unwatchable .", 2) == ["good unwatchable ."] * 2
    # replacement probability: fraction of replaced words ≈ p over many draws
    half = Augmenter(tok, lexicon=lex, p=0.5, k=2, seed=1)
    reps = sum(w != "unwatchable" for c in half.augment(" ".join(["unwatchable"] * 50), 40) for w in c.split())
    assert reps / 2000 == pytest.approx(0.5, abs=0.04)
    from bertforge.data.readers import Example
    ex = augment_examples([Example("good film", None, 1, "a")], aug, 2)
    assert len(ex) == 3 and all(e.label == 1 for e in ex) and ex[1].guid == "a-aug0"


def test_layer_map_with_an_empty_item_is_refused():
    from bertforge.distillation.mapping import resolve_map
    from bertforge.errors import ConfigError
    assert resolve_map("1:2,2:4", 2, 4) == [(1, 2), (2, 4)]
    with pytest.raises(ConfigError, match="neither a strategy"):
        resolve_map("1:2,,2:4", 2, 4)


def test_a_fully_pruned_layer_builds_without_torch_warnings():
    """A layer with 0 heads / 0 FFN units has (H, 0) weights: building it (evaluate, predict, a pruned dir's
    INT8) printed PyTorch's 'Initializing zero-element tensors is a no-op' twice."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = TaskModel(tiny_cfg(layer_num_heads=[0, 4, 4, 4], layer_intermediate_sizes=[0, 64, 64, 64]),
                      head="base")
    assert m.encoder.layers[0].attention.num_heads == 0


def test_a_layer_map_without_pairs_is_refused():
    """PKD leaves out the student's last layer, so a 1-layer student has no pairs to sum: a one-line
    ConfigError, not an AttributeError from an empty sum."""
    from bertforge.errors import ConfigError
    with pytest.raises(ConfigError, match="pairs no layers of a 1-layer student.*--layer-map"):
        build_terms(method_terms("pkd", "task"), 1, 4)
    assert build_terms(method_terms("pkd", "task"), 2, 4)[1].pairs  # 2 layers: one pair


def test_saved_projections_load_only_where_their_shape_fits(tmp_path):
    """W saved by one stage start the next where term and shape match; another teacher width leaves them
    fresh (the CLI says so) instead of failing or loading a wrong-sized matrix."""
    torch.manual_seed(4)
    t32 = TaskModel(tiny_cfg(), head="base")
    student = build_student("2L-16H-2A-32I", t32)
    terms = build_terms(method_terms("tinybert", "general"), 2, 4)
    d = Distiller(student, [t32], terms)
    with torch.no_grad():
        d.proj["hidden_mse"].weight.fill_(0.5)
    d.save_projections(tmp_path)
    again = Distiller(student, [t32], build_terms(method_terms("tinybert", "general"), 2, 4))
    assert sorted(again.load_projections(tmp_path)) == ["embedding_mse", "hidden_mse"]
    assert torch.all(again.proj["hidden_mse"].weight == 0.5)
    t48 = TaskModel(tiny_cfg(hidden_size=48), head="base")
    wider = Distiller(student, [t48], build_terms(method_terms("tinybert", "general"), 2, 4))
    assert wider.load_projections(tmp_path) == [] and wider.proj["hidden_mse"].weight.shape == (48, 16)


def test_student_layer_specs_with_an_empty_entry_are_refused():
    """``layers:0,,5`` is a typo, not a 2-layer student; spaces after commas are fine."""
    from bertforge.distillation.student import parse_layers
    assert parse_layers("layers:0, 4,5", 6) == [0, 4, 5]
    for spec in ("layers:0,,5", "layers:0,4,", "layers:,4"):
        with pytest.raises(ConfigError, match="empty entry"):
            parse_layers(spec, 6)
    with pytest.raises(ConfigError, match="names no layers"):
        parse_layers("layers:", 6)
