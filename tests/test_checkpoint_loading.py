"""Loading and saving checkpoint dirs: a shallower model keeps the first layers and says so; a missing pooler
starts fresh for classification; sharded `transformers` checkpoints load; RoBERTa's positions follow its
pad id; a head that would start fresh, a config that disagrees with the weights, bad tokenizer arguments
and a mistyped local path are each refused with a message that names them.

Independent truths: the saved weights themselves (safetensors), `transformers`' models on the same files.
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from helpers import make_tiny_checkpoint


def test_fewer_layers_than_the_checkpoint_keeps_the_first_ones_and_says_so(tmp_path, capsys):
    from bertforge.checkpoint import load_pretrained
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
    from bertforge.checkpoint import load_pretrained
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


def test_a_sharded_transformers_checkpoint_loads(workspace, tmp_path):
    """transformers' save_pretrained(max_shard_size=…) writes an index and shards: bertforge reads them
    and gives transformers' logits on the same weights; a missing shard is a CheckpointError."""
    import shutil

    import transformers

    from bertforge.errors import CheckpointError
    from bertforge.checkpoint import load_pretrained
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=load_pretrained(workspace.tiny).config.vocab_size, hidden_size=32,
                                  num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=64)
    hf = transformers.BertForSequenceClassification(cfg).eval()
    d = tmp_path / "sharded"
    hf.save_pretrained(d, max_shard_size="40KB")
    index = d / "model.safetensors.index.json"
    assert index.is_file() and len(set(json.loads(index.read_text())["weight_map"].values())) > 1
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(workspace.tiny / f, d / f)
    ids = torch.randint(5, cfg.vocab_size, (2, 9))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        ours = load_pretrained(d).eval()(ids, mask).logits
        ref = hf(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(ours, ref, atol=1e-5), (ours - ref).abs().max()
    from bertforge.runtime.embedder import load_embedder
    shards = sorted(d.glob("model-*.safetensors"))
    assert load_embedder(d).size_mb == pytest.approx(sum(f.stat().st_size for f in shards) / 1e6)
    next(p for p in d.iterdir() if p.name.startswith("model-")).unlink()
    with pytest.raises(CheckpointError, match="not a file beside it"):
        load_pretrained(d)


def test_save_pretrained_checks_its_tokenizer_arguments_first(workspace, tmp_path):
    from bertforge.errors import ConfigError
    from bertforge.checkpoint import load_pretrained
    m = load_pretrained(workspace.tiny)
    for kw, msg in (({"tokenizer_dir": tmp_path / "nope"}, "holds no tokenizer file"),
                    ({"tokenizer_dir": tmp_path}, "holds no tokenizer file"),
                    ({"tokenizer": "x"}, "pass a tokenizers.Tokenizer")):
        with pytest.raises(ConfigError, match=msg):
            m.save_pretrained(tmp_path / "out", **kw)
        assert not (tmp_path / "out").exists()  # nothing written
    m.save_pretrained(tmp_path / "ok", tokenizer_dir=workspace.tiny)
    assert (tmp_path / "ok" / "tokenizer.json").is_file()


def test_strict_head_and_a_config_that_disagrees_with_the_weights(workspace, tmp_path, capsys):
    """strict_head=True refuses a head that would start fresh; a config whose hidden size disagrees with
    the weights is named as such, without a false note about the head's label count."""
    import shutil

    from bertforge.errors import CheckpointError
    from bertforge.checkpoint import load_pretrained
    with pytest.raises(CheckpointError, match="sequence_classification head weights not in"):
        load_pretrained(workspace.tiny, head="sequence_classification", strict_head=True)
    assert load_pretrained(workspace.run, strict_head=True).head is not None  # a trained head loads
    bad = tmp_path / "bad"
    shutil.copytree(workspace.run, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg.update(hidden_size=64, intermediate_size=64)
    cfg.pop("embedding_size", None)
    (bad / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    with pytest.raises(CheckpointError, match="config.json and the weights disagree"):
        load_pretrained(bad)
    assert "output(s)" not in capsys.readouterr().err


def test_a_mistyped_local_path_is_not_tried_on_the_hub(workspace, tmp_path, monkeypatch, cli_error):
    from bertforge.checkpoint import resolve_model_dir
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert resolve_model_dir("runs/qa") == tmp_path.joinpath("runs/qa").relative_to(tmp_path)
    assert resolve_model_dir("a/b/c") == type(tmp_path)("a/b/c")  # not of the owner/name form
    line = cli_error(["evaluate", "--model", "runs/qa", "--data", workspace.train], untouched=workspace.run)
    assert "runs/qa does not exist" in line and "hub" not in line


def test_roberta_positions_follow_its_pad_id():
    """RoBERTa numbers positions from pad_token_id + 1 (HF create_position_ids_from_input_ids)."""
    from bertforge.checkpoint import token_positions
    assert token_positions({"model_type": "roberta", "max_position_embeddings": 514, "pad_token_id": 1}) == 512
    assert token_positions({"model_type": "roberta", "max_position_embeddings": 129, "pad_token_id": 0}) == 128
    assert token_positions({"model_type": "roberta", "max_position_embeddings": 514}) == 512
    assert token_positions({"model_type": "bert", "max_position_embeddings": 128, "pad_token_id": 0}) == 128
