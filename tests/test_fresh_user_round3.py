"""Behaviour fixes from the third fresh-user round (session 8): long sentences are split, not cut, when
pretraining sequences are built; ELECTRA discriminators export to ONNX (parity on real tokens only);
prune evaluates at the model's fine-tuning length; `import bertforge` stays light; overrides may follow a
many-valued option; model config values are range-checked.

Independent truths: token counts of the corpus itself, ``transformers``-free hand-built inputs, the
PyTorch model's own outputs, and ``sys.modules`` of a fresh interpreter.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from resilience_util import make_tiny_checkpoint, sentences


def _corpus(tmp_path, text: str):
    from tokenizers.implementations import BertWordPieceTokenizer
    from bertforge.data.corpus import TokenizedCorpus
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator([s for s, _ in sentences(200)], vocab_size=120, min_frequency=1)
    f = tmp_path / "c.txt"
    f.write_text(text)
    return TokenizedCorpus.build([f], wp._tokenizer, cache_dir=tmp_path / "cache"), wp._tokenizer


@pytest.mark.parametrize("mode", ["full", "doc", "sop"])
def test_a_sentence_longer_than_a_sequence_is_split_at_word_starts_and_fully_used(tmp_path, mode):
    from bertforge.data.corpus import PretrainDataset
    words = [s for s, _ in sentences(400, 3)]
    long_doc = " ".join(w.rstrip(".") for w in words[:200])  # one "sentence" of ~1000 words, no full stop
    text = long_doc + "\n\n" + ". ".join(words[200:260]) + ".\n\n" + " ".join(words[260:400]) + "\n"
    c, _ = _corpus(tmp_path, text)
    assert c.lengths.max() > 400  # the corpus really has sentences far longer than a sequence
    ds = PretrainDataset(c, mode, 64, 2, 3)
    cap = 64 - 3
    assert (ds.hi - ds.lo).max() <= cap
    assert (ds.hi - ds.lo).min() >= 1
    assert ds.lo[0] == 0 and ds.hi[-1] == c.num_tokens and (ds.lo[1:] == ds.hi[:-1]).all()  # a partition
    ws = np.asarray(c.word_starts)
    assert all(ws[o] == 1 for o in ds.lo)  # every piece starts at a word start (these words are short)
    if mode == "full":  # every corpus token lands in exactly one sequence
        served = sum(len(ds[i]["input_ids"]) - 2 for i in range(len(ds)))
        seps = sum(int((ds[i]["input_ids"][1:-1] == 3).sum()) for i in range(len(ds)))
        assert served - seps == c.num_tokens
    for i in range(len(ds)):
        assert len(ds[i]["input_ids"]) <= 64


def test_a_single_word_longer_than_a_piece_is_cut_mid_word(tmp_path):
    from bertforge.data.corpus import TokenizedCorpus, _pieces
    c, _ = _corpus(tmp_path, "x" * 400 + "\n")
    sent, lo, hi = _pieces(c, np.arange(len(c)), 10)
    assert (hi - lo).max() <= 10 and lo[0] == 0 and hi[-1] == c.num_tokens and (lo[1:] == hi[:-1]).all()
    assert isinstance(c, TokenizedCorpus) and (sent == 0).all()


def test_electra_discriminator_exports_with_parity_on_real_tokens(tmp_path):
    from bertforge.compress import onnx as bo
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    import bertforge.objectives  # noqa: F401  registers the electra_discriminator head
    torch.manual_seed(0)
    cfg = ModelConfig(model_type="electra", vocab_size=64, hidden_size=32, embedding_size=16, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=32,
                      add_pooling_layer=False)
    model = TaskModel(cfg, head="electra_discriminator").eval()
    for fused in (True, False):
        rec = bo.deploy(model, tmp_path / f"e{fused}", quantize=False, fused=fused)
        assert rec["fp32_max_abs_diff"] < 1e-4
    # padded rows are in the check batch, and real tokens agree
    x = bo.dummy_inputs(model, 2, 16, seed=1)
    with torch.no_grad():
        ref = model(**x).logits.numpy()
    got = bo.run_session(bo.session(tmp_path / "eTrue" / "model.onnx"), x)
    pad = x["attention_mask"].numpy() == 0
    assert pad.any() and np.abs(got[~pad] - ref[~pad]).max() < 1e-4


def test_prune_defaults_to_the_fine_tuning_length():
    from bertforge.commands.prune import resolve_seq_len
    cfg = {"model_type": "bert", "max_position_embeddings": 512, "bertforge": {"max_seq_len": 32}}
    assert resolve_seq_len(None, cfg) == 32
    assert resolve_seq_len(None, {"model_type": "bert", "max_position_embeddings": 512}) == 128
    assert resolve_seq_len(None, {"model_type": "bert", "max_position_embeddings": 64}) == 64
    assert resolve_seq_len(48, cfg) == 48


def test_import_bertforge_does_not_load_torch_until_used():
    code = ("import sys, bertforge; a = 'torch' in sys.modules; from bertforge import ModelConfig, load_pretrained; "
            "print(a, 'torch' in sys.modules, ModelConfig.__name__, callable(load_pretrained))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "ModelConfig", "True"]


def test_overrides_after_a_many_valued_option_are_overrides(monkeypatch):
    from bertforge import cli
    seen = {}

    def fake_run(args):
        seen.update(corpus=args.corpus, overrides=args.overrides)
        return 0
    import bertforge.commands.pretrain as pt
    monkeypatch.setattr(pt, "run", fake_run)
    assert cli.main(["pretrain", "--objective", "bert", "--corpus", "a.txt", "b.txt", "pretrain.max_span=4",
                     "--out", "o", "train.lr=1e-4"]) == 0
    assert seen == {"corpus": ["a.txt", "b.txt"], "overrides": ["pretrain.max_span=4", "train.lr=1e-4"]}


@pytest.mark.parametrize("kw,needle", [
    ({"num_attention_heads": 0}, "model.num_attention_heads=0"),
    ({"hidden_size": -8}, "model.hidden_size=-8"),
    ({"hidden_size": "big"}, "model.hidden_size='big'"),
    ({"hidden_dropout_prob": 1.5}, "model.hidden_dropout_prob=1.5"),
    ({"attention_probs_dropout_prob": float("nan")}, "model.attention_probs_dropout_prob=nan"),
    ({"vocab_size": 0}, "model.vocab_size=0"),
    ({"layer_norm_eps": 0.0}, "model.layer_norm_eps=0.0"),
])
def test_model_config_values_are_range_checked(kw, needle):
    from bertforge.config import ModelConfig
    from bertforge.errors import ConfigError
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.").replace("(", r"\(")):
        ModelConfig(**kw)


def test_prune_refuses_its_own_input_and_keeps_it(tmp_path, capsys):
    from bertforge.cli import main
    base = make_tiny_checkpoint(tmp_path / "tiny")
    before = {p.name: p.read_bytes() for p in base.iterdir() if p.is_file()}
    assert main(["prune", "--model", str(base), "--out", str(base), "--fraction", "0.5", "--data",
                 str(tmp_path / "x.txt"), "--overwrite"]) == 2
    assert "would replace the input" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in base.iterdir() if p.is_file()} == before


def test_roberta_positions_follow_its_pad_id():
    """RoBERTa numbers positions from pad_token_id + 1 (HF create_position_ids_from_input_ids)."""
    from bertforge.hf import token_positions
    assert token_positions({"model_type": "roberta", "max_position_embeddings": 514, "pad_token_id": 1}) == 512
    assert token_positions({"model_type": "roberta", "max_position_embeddings": 129, "pad_token_id": 0}) == 128
    assert token_positions({"model_type": "roberta", "max_position_embeddings": 514}) == 512
    assert token_positions({"model_type": "bert", "max_position_embeddings": 128, "pad_token_id": 0}) == 128


def test_saved_model_files_get_a_normal_file_mode(tmp_path):
    """safetensors writes 0600; a saved checkpoint's files follow the umask like any other file."""
    import os
    from bertforge.hf import load_pretrained
    old = os.umask(0o022)
    try:
        d = make_tiny_checkpoint(tmp_path / "m")
        load_pretrained(d).save_pretrained(tmp_path / "again")
    finally:
        os.umask(old)
    for f in ("m/model.safetensors", "again/model.safetensors", "again/config.json"):
        assert (tmp_path / f).stat().st_mode & 0o777 == 0o644, f
