"""Defaults that work (issue 39, item 4): a sequence head on a dir that declares its pooling reads it unless
``model.pooling`` says otherwise (``pooler``: the [CLS] pooler, logits equal to ``transformers``' on the same
weights); each task's ``train_defaults`` (its benchmark recipe) apply unless the run set that key; a multi-label
run at the constant predictor's macro-F1 is told so with the flags to try."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import yaml

from bertforge.checkpoint.layout import write_pooling
from bertforge.checkpoint.modeldir import ModelDir
from bertforge.config import load_recipe
from bertforge.pipelines.defaults import apply_task_defaults, collapse_hints, default_pooling
from bertforge.pipelines.report import collapse_message
from bertforge.tasks import TASKS, get_task
from helpers import make_tiny_checkpoint


@pytest.fixture(scope="module")
def declared(tmp_path_factory):
    """A tiny BERT dir that declares mean pooling in the sentence-transformers layout."""
    d = make_tiny_checkpoint(tmp_path_factory.mktemp("st") / "m")
    write_pooling(d, "mean", hidden_size=32)
    return d


def _args(**kw):
    return SimpleNamespace(**{"lr": None, "epochs": None, "batch_size": None, **kw})


def test_the_declared_pooling_is_the_default_and_model_pooling_wins(declared, capsys):
    md = ModelDir.open(declared)
    r = load_recipe(None, [])
    assert default_pooling(r, md, "sequence_classification") == "mean" and r.model["pooling"] == "mean"
    assert "mean pooling declared" in capsys.readouterr().err
    for given, reads in (("pooler", None), ("max", "max")):
        r = load_recipe(None, [f"model.pooling={given}"])
        assert default_pooling(r, md, "sequence_classification") == reads
        assert r.model["pooling"] == given  # recorded as asked
    r = load_recipe(None, [])
    assert default_pooling(r, md, "token_classification") is None and "pooling" not in r.model


def test_a_dir_without_declared_pooling_keeps_the_pooler(tmp_path):
    md = ModelDir.open(make_tiny_checkpoint(tmp_path / "plain"))
    r = load_recipe(None, [])
    assert default_pooling(r, md, "sequence_classification") is None and "pooling" not in r.model


def test_pooling_pooler_gives_transformers_logits(declared, tmp_path):
    transformers = pytest.importorskip("transformers")
    from bertforge.checkpoint.read import load_pretrained
    torch.manual_seed(0)
    m = load_pretrained(declared, head="sequence_classification", num_labels=3, notes=False, pooling="pooler")
    assert m.config.pooling is None and m.head.use_pooler
    m.save_pretrained(tmp_path / "clf", tokenizer_dir=declared)
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "clf").eval()
    ids = torch.tensor([[2, 17, 33, 41, 3, 0], [2, 50, 3, 0, 0, 0]])
    am = (ids != 0).long()
    with torch.no_grad():
        ours = m.eval()(input_ids=ids, attention_mask=am, token_type_ids=torch.zeros_like(ids)).logits
        ref = hf(input_ids=ids, attention_mask=am, token_type_ids=torch.zeros_like(ids)).logits
    # float32 forward of the same weights in two implementations: rounding only (~1e-7 relative per op)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    mean = load_pretrained(declared, head="sequence_classification", num_labels=3, notes=False, pooling="mean")
    mean.head.load_state_dict(m.head.state_dict())
    with torch.no_grad():
        other = mean.eval()(input_ids=ids, attention_mask=am, token_type_ids=torch.zeros_like(ids)).logits
    assert not torch.allclose(other, ref, atol=1e-3)  # mean pooling reads another vector than the pooler


def test_task_defaults_apply_unless_the_run_sets_the_key(capsys):
    goemo = get_task("goemotions")
    r = load_recipe(None, [])
    assert apply_task_defaults(r, goemo, _args()) == {"train.lr": 8e-5, "train.pos_weight": "sqrt"}
    assert (r.train.lr, r.train.pos_weight) == (8e-5, "sqrt")
    assert "train.lr=8e-05, train.pos_weight=sqrt" in capsys.readouterr().err
    r = load_recipe(None, ["train.pos_weight=none"])  # an override
    r.train.lr = 1e-4
    assert apply_task_defaults(r, goemo, _args(lr=1e-4)) == {}  # --lr and the override both win
    assert r.train.lr == 1e-4 and r.train.pos_weight in (None, "none")  # "none" parses as null
    r = load_recipe(None, ["train.lr=5e-5"])  # a value equal to the old default is still a choice
    assert apply_task_defaults(r, goemo, _args()) == {"train.pos_weight": "sqrt"} and r.train.lr == 5e-5
    assert apply_task_defaults(load_recipe(None, []), get_task("sst2"), _args()) == {}


def test_the_recipe_file_sets_keys_too(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text(yaml.safe_dump({"train": {"lr": 3e-5}}))
    r = load_recipe(f, [])
    assert apply_task_defaults(r, get_task("conll2003"), _args()) == {} and r.train.lr == 3e-5


def test_every_tasks_defaults_are_recipe_keys():
    r = load_recipe(None, [])
    for t in TASKS.values():
        for key in t.train_defaults:
            section, name = key.split(".", 1)
            assert hasattr(getattr(r, section), name), (t.name, key)
    assert {t: TASKS[t].train_defaults.get("train.lr") for t in ("goemotions", "conll2003", "squad", "retrieval")} \
        == {"goemotions": 8e-5, "conll2003": 1.5e-4, "squad": 1e-4, "retrieval": 2e-5}


def test_a_multilabel_run_at_the_constant_predictor_names_the_flags_to_try():
    goemo = get_task("goemotions")
    r = load_recipe(None, ["train.lr=5e-5", "model.pooling=pooler"])
    hints = collapse_hints(r, goemo)
    assert hints[:3] == ["--lr 8e-05", "train.pos_weight=sqrt", "model.pooling=mean"]
    msg = collapse_message({"macro_f1": 0.07, "constant_macro_f1": 0.0751}, goemo, "at step 40", hints)
    assert msg.startswith("warning: macro_f1 0.07 at step 40 is no better than the constant predictor's 0.0751")
    assert "--lr 8e-05" in msg and "train.pos_weight=sqrt" in msg and "model.pooling=mean" in msg
    assert collapse_message({"macro_f1": 0.30, "constant_macro_f1": 0.0751}, goemo) is None


def test_finetune_records_the_defaults_it_applied(declared, tmp_path, capsys):
    import bertforge
    rows = "".join(f"{w} {w}\t{i % 28}\tid{i}\n" for i, w in enumerate(["cat", "dog", "bird", "fish"] * 4))
    (tmp_path / "g.tsv").write_text(rows)
    bertforge.finetune(declared, "goemotions", tmp_path / "g.tsv", tmp_path / "run", max_steps=1, batch_size=4,
                       max_seq_len=16, no_progress=True, overwrite=True)
    saved = yaml.safe_load((tmp_path / "run" / "recipe.yaml").read_text())
    assert saved["model"]["pooling"] == "mean"
    assert (saved["train"]["lr"], saved["train"]["pos_weight"]) == (8e-5, "sqrt")
    err = capsys.readouterr().err
    assert "defaults from its benchmark recipe" in err and "mean pooling declared" in err
