"""Behaviour fixes from the fifth fresh-user round (session 9): a shallower model keeps the first layers
and says so; classification from an encoder saved without a pooler (SpanBERT); qa-split, embedded-corpus
and embed-eval never replace their input, a run's files or an existing output without --overwrite;
embed-eval checks its options first and truncates to the model's positions; recipe files accept 1e-4 and
refuse scalar sections; an unknown metric_for_best is named; a corpus file given twice is refused; from
the sixth round, a batch with labels on some rows only (predict) collates without labels.

Independent truths: the saved checkpoint's own weights (safetensors), transformers' model on the saved
files, the files' bytes before and after, and embeddings of hand-truncated text.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from resilience_util import make_tiny_checkpoint


def test_fewer_layers_than_the_checkpoint_keeps_the_first_ones_and_says_so(tmp_path, capsys):
    from bertforge.hf import load_pretrained
    ckpt = make_tiny_checkpoint(tmp_path / "m", layers=3)
    model = load_pretrained(ckpt, num_hidden_layers=1)
    err = capsys.readouterr().err
    assert "keeping the first 1 of the 3 encoder layers" in err and "model.num_hidden_layers=1" in err
    assert len(model.encoder.layers) == 1
    saved = load_file(str(ckpt / "model.safetensors"))
    w = saved["bert.encoder.layer.0.intermediate.dense.weight"]
    assert torch.equal(model.encoder.layers[0].ffn.intermediate.weight, w)
    load_pretrained(ckpt)  # the checkpoint's own depth: nothing to say
    assert "keeping" not in capsys.readouterr().err


def test_classifying_from_an_encoder_saved_without_pooler_gets_a_fresh_one(tmp_path, capsys):
    """SpanBERT pretraining saves no pooler; the bert sequence-classification head reads the pooler output.
    Loading for classification gives a fresh pooler (as transformers' BertForSequenceClassification
    does), the encoder weights are the checkpoint's, and the saved model loads in transformers with the
    same logits."""
    import transformers
    from bertforge.config import ModelConfig
    from bertforge.hf import load_pretrained
    from bertforge.task_model import TaskModel
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=32, add_pooling_layer=False)
    TaskModel(cfg, head="base").save_pretrained(tmp_path / "enc")
    model = load_pretrained(tmp_path / "enc", head="sequence_classification").eval()
    assert "has no pooler weights" in capsys.readouterr().err
    assert model.encoder.pooler is not None and model.config.add_pooling_layer
    ids = torch.randint(5, 60, (2, 7))
    logits = model(input_ids=ids)["logits"]
    assert logits.shape == (2, 2) and torch.isfinite(logits).all()
    saved = load_file(str(tmp_path / "enc" / "model.safetensors"))
    assert torch.equal(model.encoder.layers[0].ffn.intermediate.weight,
                       saved["bert.encoder.layer.0.intermediate.dense.weight"])
    model.save_pretrained(tmp_path / "cls")
    hf = transformers.BertForSequenceClassification.from_pretrained(str(tmp_path / "cls")).eval()
    with torch.no_grad():
        assert torch.allclose(hf(input_ids=ids).logits, logits, atol=1e-5)


# ------------------------------------------------------------------ outputs never replace inputs or runs
def test_qa_split_never_replaces_its_input_a_run_or_an_existing_split(tmp_path, capsys, data_dir):
    from resilience_util import cli_error_line
    from bertforge.cli import main
    squad = data_dir / "squad" / "dev-v1.1.json"
    split = tmp_path / "split"
    assert main(["qa-split", "--data", str(squad), "--out-dir", str(split)]) == 0
    train = split / "train.json"
    articles = len(json.loads(train.read_text())["data"])
    guard = tmp_path / "guard"
    guard.mkdir()
    # again into the same folder: refused without --overwrite; its own input: refused even with it
    line = cli_error_line(["qa-split", "--data", squad, "--out-dir", split], capsys, guard)
    assert "train.json exists" in line and "--overwrite" in line
    line = cli_error_line(["qa-split", "--data", train, "--out-dir", split, "--overwrite"], capsys, guard)
    assert "is the input file" in line
    assert len(json.loads(train.read_text())["data"]) == articles
    run_dir = make_tiny_checkpoint(tmp_path / "run")
    line = cli_error_line(["qa-split", "--data", train, "--out-dir", run_dir], capsys, run_dir)
    assert "holds a bertforge run or model" in line
    line = cli_error_line(["qa-split", "--data", train, "--out-dir", run_dir / "sub"], capsys, run_dir)
    assert "lies inside" in line
    assert main(["qa-split", "--data", str(squad), "--out-dir", str(split), "--overwrite"]) == 0


def test_embedded_corpus_keeps_user_files_and_leaves_nothing_on_error(tmp_path, capsys):
    from resilience_util import cli_error_line
    mine = tmp_path / "mydata"
    mine.mkdir()
    (mine / "train.txt").write_text("my precious\n")
    line = cli_error_line(["embedded-corpus", "--out", mine, "--max-documents", 5], capsys, mine)
    assert "train.txt exists" in line and "--overwrite" in line
    afile = tmp_path / "afile"
    afile.write_text("hi\n")
    assert "is a file" in cli_error_line(["embedded-corpus", "--out", afile], capsys, mine)
    fresh = tmp_path / "fresh"
    assert "--max-documents -3 must be ≥ 1" in cli_error_line(
        ["embedded-corpus", "--out", fresh, "--max-documents", -3], capsys, mine)
    assert not fresh.exists()


def test_embed_eval_out_is_checked_before_any_work(tmp_path, capsys):
    from resilience_util import cli_error_line
    ckpt = make_tiny_checkpoint(tmp_path / "m")
    common = ["embed-eval", "--model", ckpt, "--rounds", 1, "--iters", 1, "--seq-len", 8, "--no-progress"]
    line = cli_error_line([*common, "--out", ckpt / "model.safetensors"], capsys, ckpt)
    assert "inside the model directory" in line
    existing = tmp_path / "results.json"
    existing.write_text("{}")
    assert "--overwrite" in cli_error_line([*common, "--out", existing], capsys, ckpt)
    assert existing.read_text() == "{}"
    for flag, value in (("--threads", -1), ("--lee-max-seq-len", -5), ("--max-eval-samples", 0)):
        assert flag in cli_error_line([*common, flag, value], capsys, ckpt)
    assert "exceeds the 64 positions" in cli_error_line([*common[:-3], "--seq-len", 100], capsys, ckpt)


def test_embedding_truncates_to_the_models_positions(tmp_path):
    """A 32-position model embeds a 200-word document (Lee documents are longer than 256 tokens): the
    text is cut at the model's limit, and the embedding equals the one of the text cut by hand."""
    from bertforge.evaluate.embedded import TorchEmbedder
    from resilience_util import sentences
    ckpt = make_tiny_checkpoint(tmp_path / "m", max_pos=32)
    e = TorchEmbedder(ckpt)
    assert e.max_positions == 32 and e.truncation(256) == 32 and e.truncation(16) == 16
    long_text = " ".join(s for s, _ in sentences(40))
    assert len(e.tok.encode(long_text).ids) > 100
    got = e.embed([long_text], 256)
    assert np.allclose(got, e.embed([long_text], 32), atol=1e-6)


# ------------------------------------------------------------------------------- recipes and messages
def test_recipe_file_numbers_in_exponent_form_and_scalar_sections(tmp_path):
    from bertforge.config import load_recipe
    from bertforge.errors import ConfigError
    ok = tmp_path / "ok.yaml"
    ok.write_text("train:\n  lr: 1e-4\n  max_steps: 1e3\nmodel:\n  hidden_dropout_prob: 1e-1\n")
    r = load_recipe(str(ok))
    assert r.train.lr == 1e-4 and r.train.max_steps == 1000 and r.model["hidden_dropout_prob"] == 0.1
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: 5\n")
    with pytest.raises(ConfigError, match="section 'train' must be a mapping"):
        load_recipe(str(bad))


def test_an_unknown_metric_for_best_is_named_once(tmp_path, capsys):
    from bertforge.config import ModelConfig, load_recipe
    from bertforge.data.collate import PadCollator
    from bertforge.task_model import TaskModel
    from bertforge.train.trainer import Trainer
    cfg = ModelConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=32, num_labels=2)
    data = [{"input_ids": [3, 4, 5], "token_type_ids": [0, 0, 0], "labels": 1}] * 8
    recipe = load_recipe(None, ["train.batch_size=4", "train.max_steps=2", "train.eval_every=1",
                                "impl.progress=false", "train.metric_for_best=nope"])
    t = Trainer(TaskModel(cfg, head="sequence_classification"), data, PadCollator(0), recipe, tmp_path / "r",
                eval_fn=lambda m: {"accuracy": 0.5})
    result = t.fit()
    err = capsys.readouterr().err
    assert err.count("train.metric_for_best='nope' is not among the evaluation's metrics (accuracy)") == 1
    assert result["best"] is None


def test_a_corpus_file_given_twice_is_refused(tmp_path, capsys):
    from resilience_util import cli_error_line, sentences
    f = tmp_path / "c.txt"
    f.write_text("\n".join(s for s, _ in sentences(50)) + "\n")
    line = cli_error_line(["pretrain", "--objective", "bert", "--corpus", f, str(tmp_path / "." / "c.txt"),
                           "--out", tmp_path / "run", "--max-steps", 1], capsys, tmp_path / "run")
    assert "lists" in line and "twice" in line


def test_a_batch_with_labels_on_some_rows_only_is_collated_without_labels():
    """predict on a JSONL file where some rows carry a label: no KeyError, the batch simply has no labels."""
    from bertforge.data.collate import PadCollator
    rows = [{"input_ids": [5, 6, 7], "labels": 1}, {"input_ids": [8, 9]}]
    batch = PadCollator(0)(rows)
    assert "labels" not in batch and batch["input_ids"].tolist() == [[5, 6, 7], [8, 9, 0]]
    assert PadCollator(0)([rows[0], {"input_ids": [8], "labels": 0}])["labels"].tolist() == [1, 0]
