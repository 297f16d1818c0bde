"""One encoder contract (issue #35, item 4): every encoder takes the same five inputs — ids, mask, segments,
positions and one ``Features`` request — and returns exactly what the request asked for; the kernels in effect
are visible on the model; every head is a ``Head``; a distillation feature is one row of one table.

Independent truths: the request itself (which fields it names), the full-sequence output of a plain request
(what ``cls_only`` / ``rows`` must select from it), softmax rows summing to 1, and a loss computed by hand from
two models' outputs.
"""
from __future__ import annotations

import inspect

import pytest
import torch

from bertforge.config import ModelConfig, load_recipe
from bertforge.data.collate import PadCollator
from bertforge.engine.kernels import apply_kernels
from bertforge.engine.kernels.cpu import CpuEncoder
from bertforge.engine.train.trainer import Trainer
from bertforge.heads import HEADS, Head
from bertforge.models.encoder import Encoder
from bertforge.models.mobilebert import MobileBertEncoder
from bertforge.models.modernbert import ModernBertEncoder
from bertforge.models.output import Features
from bertforge.task_model import ENCODERS, TaskModel

PER_LAYER = ("hidden_states", "attentions", "attention_scores", "values")
L, HEADS_N, H = 3, 4, 32


def _config(family: str) -> ModelConfig:
    kw = dict(model_type=family, vocab_size=90, hidden_size=H, num_hidden_layers=L, num_attention_heads=HEADS_N,
              intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
              attention_probs_dropout_prob=0.0)
    if family == "modernbert":
        kw.update(type_vocab_size=0, add_pooling_layer=False, local_attention=4, global_attn_every_n_layers=2)
    if family == "mobilebert":  # a thin block: 16 wide inside, two stacked FFNs, 8-wide trigram embeddings
        kw.update(intra_bottleneck_size=16, embedding_size=8, num_feedforward_networks=2, intermediate_size=32)
    return ModelConfig(**kw)


def _encoder(kind: str):
    """``bert`` (plain), ``bert-cpu`` (the CPU kernels swapped in), ``modernbert``, ``mobilebert``, ``mpnet`` or
    ``mpnet-cpu``, in eval mode."""
    torch.manual_seed(0)
    model = TaskModel(_config(kind.split("-")[0]))
    apply_kernels(model, "cpu" if kind.endswith("-cpu") else "none")
    return model.encoder.eval()


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 90, (3, 11), generator=g)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 7:] = 0  # right padding: the unpadded paths run
    mask[2, 4:] = 0
    return ids, mask


@pytest.mark.parametrize("cls", [Encoder, ModernBertEncoder, MobileBertEncoder, CpuEncoder])
def test_every_encoder_forward_takes_at_most_five_parameters(cls):
    params = [p for p in inspect.signature(cls.forward).parameters if p != "self"]
    assert params == ["input_ids", "attention_mask", "token_type_ids", "position_ids", "features"]
    assert len(params) <= 5


def test_the_encoder_is_chosen_by_the_model_family():
    assert ENCODERS["modernbert"] is ModernBertEncoder and ENCODERS["mobilebert"] is MobileBertEncoder
    assert type(TaskModel(_config("mobilebert")).encoder) is MobileBertEncoder
    assert all(ENCODERS[f] is Encoder for f in ("bert", "roberta", "albert", "electra", "distilbert", "mpnet"))
    assert type(TaskModel(_config("modernbert")).encoder) is ModernBertEncoder
    assert type(TaskModel(_config("bert")).encoder) is Encoder
    with pytest.raises(Exception, match="build_encoder"):  # the BERT-shaped encoder refuses a ModernBERT config
        Encoder(_config("modernbert"))


@pytest.mark.parametrize("kind", ["bert", "bert-cpu", "modernbert", "mobilebert", "mpnet", "mpnet-cpu"])
@pytest.mark.parametrize("asked", [(), ("hidden_states",), ("attentions",), ("attention_scores",), ("values",),
                                   ("hidden_states", "values"), PER_LAYER])
def test_a_features_request_yields_exactly_the_outputs_asked(kind, asked):
    enc = _encoder(kind)
    ids, mask = _batch()
    with torch.no_grad():
        out = enc(ids, mask, features=Features(**{name: True for name in asked}))
        everything = enc(ids, mask, features=Features(**{name: True for name in PER_LAYER}))
    given = {name for name in PER_LAYER if getattr(out, name) is not None}
    assert given == set(asked)
    for name in asked:
        got = getattr(out, name)
        assert len(got) == (L + 1 if name == "hidden_states" else L)
        for a, b in zip(got, getattr(everything, name)):  # what else was asked changes no value
            assert torch.allclose(a, b, atol=1e-6)
    if "attentions" in asked:  # probabilities: each query row sums to 1
        assert torch.allclose(out.attentions[0].sum(-1), torch.ones(3, HEADS_N, 11), atol=1e-5)
    if "values" in asked:
        assert out.values[0].shape == (3, HEADS_N, 11, enc.config.head_dim)
    if "hidden_states" in asked:
        real = mask.bool()
        assert torch.allclose(out.hidden_states[-1][real], out.last_hidden_state[real], atol=1e-6)


@pytest.mark.parametrize("kind", ["bert", "bert-cpu", "modernbert", "mobilebert", "mpnet", "mpnet-cpu"])
def test_cls_only_and_rows_return_just_those_positions_of_the_full_output(kind):
    enc = _encoder(kind)
    ids, mask = _batch()
    rows = torch.zeros_like(mask, dtype=torch.bool)
    rows[0, 3] = rows[1, 1] = rows[1, 5] = rows[2, 2] = True
    with torch.no_grad():
        full = enc(ids, mask).last_hidden_state
        cls = enc(ids, mask, features=Features(cls_only=True)).last_hidden_state
        picked = enc(ids, mask, features=Features(rows=rows)).last_hidden_state
    assert cls.shape == (3, 1, H) and torch.allclose(cls, full[:, :1], atol=1e-5)
    assert picked.shape == (4, H) and torch.allclose(picked, full[rows], atol=1e-5)


def test_features_union_asks_for_what_either_asks():
    g = [torch.ones(HEADS_N)] * L
    u = Features(hidden_states=True) | Features(values=True, head_gates=g)
    assert u.hidden_states and u.values and u.head_gates is g and not u.attentions
    assert u.per_layer and not Features().per_layer


def test_the_old_keyword_flags_are_refused_by_name():
    model = TaskModel(_config("bert"))
    ids, mask = _batch()
    with pytest.raises(TypeError, match=r"features=Features\(hidden_states="):
        model(ids, mask, output_hidden_states=True)


def test_kernels_attribute_appears_in_repr():
    model = TaskModel(_config("bert"), head="mlm")
    assert model.kernels == "none" and model.encoder.kernels == "none"
    assert "kernels=none" in repr(model) and repr(model.encoder).startswith("Encoder(\n  kernels=none")
    apply_kernels(model, "cpu")
    assert model.kernels == "cpu" and model.encoder.kernels == "cpu"
    assert "kernels=cpu" in repr(model).splitlines()[1] and repr(model.encoder).startswith("CpuEncoder(\n  kernels=cpu")
    apply_kernels(model, "none")
    assert model.kernels == "none" and "kernels=cpu" not in repr(model)
    modern = TaskModel(_config("modernbert"))
    apply_kernels(modern, "cpu")  # ModernBERT's encoder has no CPU kernel: it unpads by itself
    assert modern.encoder.kernels == "none" and "kernels=none" in repr(modern.encoder)


def test_the_trainer_names_the_kernels_when_the_run_starts(tmp_path, capsys):
    torch.manual_seed(0)
    model = TaskModel(_config("bert").replace(num_labels=2), head="sequence_classification")
    data = [{"input_ids": [5 + i, 6, 7, 8], "token_type_ids": [0] * 4, "labels": i % 2} for i in range(8)]
    for mode in ("none", "cpu"):
        recipe = load_recipe(None, ["train.batch_size=4", "train.max_steps=1", "impl.progress=false",
                                    f"impl.kernels={mode}"])
        t = Trainer(model, data, PadCollator(0), recipe, tmp_path / mode)
        assert t.kernels == mode == t.model.kernels
        capsys.readouterr()
        t.fit()
        lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("bertforge train: ")]
        assert lines == [f"bertforge train: step 0 of 1 on cpu, float32, kernels {mode} (impl.kernels={mode})"]


def test_every_head_class_subclasses_head():
    assert all(issubclass(cls, Head) for cls in HEADS.values()), [c for c in HEADS.values() if not issubclass(c, Head)]
    for name in ("hf_suffix", "cls_only", "labelled_rows_only", "masked_lm", "families", "has_labels", "num_labels",
                 "adds_pooler", "tie_weights", "hf_keys"):
        assert hasattr(Head, name), name
    cfg = _config("bert").replace(num_labels=2)
    for name in ("sequence_classification", "mlm", "embedding"):  # a built head reads as its class declares
        head = TaskModel(cfg, head=name).head
        assert head.cls_only == (name == "sequence_classification")
        assert head.masked_lm == (name == "mlm") and head.labelled_rows_only == (name == "mlm")


def test_a_new_distillation_feature_is_one_table_line(monkeypatch):
    """A feature the distiller has never named — the last block's states, unpadded positions included — as one
    row of FEATURES plus one loss naming it: the distiller requests, reads and compares it, and the term equals
    the MSE of the two models' last_hidden_state computed here."""
    from bertforge.distillation import features as F
    from bertforge.distillation.distiller import Distiller, build_terms
    from bertforge.distillation.losses import LOSSES, LossSpec

    def mse(a, b, **_):
        return ((a.float() - b.float()) ** 2).mean()

    monkeypatch.setitem(F.FEATURES, "last", F.Feature(
        "last", lambda d, term, out, feats, inputs: term.spec.fn(out.last_hidden_state, feats["last.0"]),
        teacher=lambda d, out, i, inputs: out.last_hidden_state))
    monkeypatch.setitem(LOSSES, "last_mse", LossSpec("last_mse", mse, "last", layerwise=False))
    torch.manual_seed(0)
    teacher, student = TaskModel(_config("bert")).eval(), TaskModel(_config("bert")).eval()
    d = Distiller(student, [teacher], build_terms([{"loss": "last_mse"}], L, L))
    ids, mask = _batch()
    with torch.no_grad():
        got = d(ids, mask).terms["last_mse"]
        want = mse(student(ids, mask).last_hidden_state, teacher(ids, mask).last_hidden_state)
    assert torch.allclose(got, want)


def test_every_distillation_loss_reads_a_row_of_the_features_table():
    from bertforge.distillation.features import FEATURES
    from bertforge.distillation.losses import LOSSES
    assert {spec.feature for spec in LOSSES.values()} <= set(FEATURES)
    for spec in LOSSES.values():  # a loss applied to layer pairs reads a layer-wise feature, and the other way
        assert spec.layerwise == FEATURES[spec.feature].layerwise, spec.name
