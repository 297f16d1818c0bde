"""MPNet family vs `transformers`' MPNet* classes on the same random weights, both directions.

Dirs written by transformers load in bertforge and the reverse, with outputs within 1e-5 at every real token of
mixed-length padded batches longer than 128 tokens (so every bucket of the relative position bias is read, the
log-spaced ones and the last one included); an unknown relative-attention setting is refused in one line; the
sentence-transformers layout goes both ways (SentenceTransformer(dir) gives bertforge's vectors).
"""
import json

import numpy as np
import pytest
import torch
import transformers as T

from helpers import sentences
from helpers_mpnet import make_tiny_mpnet, padded_batch, randomise, tiny_mpnet_config

from bertforge.checkpoint import load_pretrained
from bertforge.errors import CheckpointError, ConfigError
from bertforge.task_model import TaskModel

HF_CLASSES = {"base": T.MPNetModel, "mlm": T.MPNetForMaskedLM,
              "sequence_classification": T.MPNetForSequenceClassification,
              "token_classification": T.MPNetForTokenClassification,
              "question_answering": T.MPNetForQuestionAnswering}
LENGTHS = ([150, 7, 33], [12, 40, 5, 26])  # beyond 128 (the last bucket) and short


def _hf_config(**kw):
    base = dict(vocab_size=97, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=162, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                layer_norm_eps=1e-5, num_labels=3)
    base.update(kw)
    return T.MPNetConfig(**base)


def _out(out, head):
    if head == "base":
        return out.last_hidden_state
    if head == "question_answering" and hasattr(out, "start_logits"):
        return torch.stack([out.start_logits, out.end_logits], 1)
    return out.logits


def _real(x, mask, head):
    """Entries at real tokens: per-token outputs at mask 1; per-sequence outputs whole."""
    if head == "sequence_classification":
        return x
    if head == "question_answering":
        return x.transpose(1, 2)[mask.bool()]
    return x[mask.bool()]


@pytest.mark.parametrize("head", list(HF_CLASSES))
def test_transformers_dirs_load_with_identical_outputs(head, tmp_path):
    torch.manual_seed(0)
    ref = HF_CLASSES[head](_hf_config(num_labels=2 if head == "question_answering" else 3)).eval()
    randomise(ref)
    ref.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path, strict_head=head != "base")
    assert ours.config.model_type == "mpnet" and ours.head_name == head and ours.config.type_vocab_size == 0
    for lengths in LENGTHS:
        ids, mask = padded_batch(lengths)
        with torch.no_grad():
            a = _out(ours(ids, mask), head)
            b = _out(ref(input_ids=ids, attention_mask=mask), head)
        assert (_real(a, mask, head) - _real(b, mask, head)).abs().max() < 1e-5, lengths


@pytest.mark.parametrize("head", list(HF_CLASSES))
def test_bertforge_dirs_load_in_transformers_with_identical_outputs(head, tmp_path):
    torch.manual_seed(1)
    ours = TaskModel(tiny_mpnet_config(num_labels=2 if head == "question_answering" else 4), head=head).eval()
    randomise(ours)
    ours.save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    assert d["model_type"] == "mpnet" and d["relative_attention_num_buckets"] == 32
    assert d["architectures"] == ["MPNet" + ours.head.hf_suffix if ours.head is not None else "MPNetModel"]
    ref = HF_CLASSES[head].from_pretrained(tmp_path).eval()
    for lengths in LENGTHS:
        ids, mask = padded_batch(lengths, seed=2)
        with torch.no_grad():
            a = _out(ours(ids, mask), head)
            b = _out(ref(input_ids=ids, attention_mask=mask), head)
        assert (_real(a, mask, head) - _real(b, mask, head)).abs().max() < 1e-5, lengths
    ref.save_pretrained(tmp_path / "again")  # and back: transformers' re-save loads with the same outputs
    with torch.no_grad():
        c = _out(load_pretrained(tmp_path / "again")(ids, mask), head)
    assert (_real(a, mask, head) - _real(c, mask, head)).abs().max() < 1e-5


def test_bias_is_computed_once_and_cpu_kernels_give_the_same_outputs():
    """One position bias per call (the table is read once, not per layer); the CPU kernels (which run
    MPNet on the plain path) give the plain modules' outputs, in eval and for the training gradients."""
    from bertforge.engine.kernels import apply_kernels
    torch.manual_seed(0)
    model = TaskModel(tiny_mpnet_config(num_hidden_layers=3), head="mlm")
    randomise(model)
    reads = []
    model.encoder.relative_attention_bias.register_forward_hook(lambda *a: reads.append(1))
    ids, mask = padded_batch([30, 11, 19], seed=4)
    labels = ids.masked_fill(mask == 0, -100)
    outs = {}
    for mode in ("none", "cpu"):
        apply_kernels(model, mode)
        model.zero_grad()
        out = model(ids, mask, labels=labels)
        out.loss.backward()
        outs[mode] = (out.logits.detach(), [p.grad.clone() for p in model.parameters()])
    assert len(reads) == 2 and model.kernels == "cpu"
    assert (outs["none"][0] - outs["cpu"][0]).abs().max() < 1e-5
    assert max((a - b).abs().max() for a, b in zip(outs["none"][1], outs["cpu"][1])) < 1e-5


def test_unknown_relative_attention_settings_are_refused_in_one_line(tmp_path):
    from bertforge.checkpoint import config_from_hf
    ok = _hf_config().to_dict()
    for bad in ({"relative_attention_num_buckets": 64}, {"relative_attention_max_distance": 256},
                {"relative_attention_num_buckets": 32.0}):  # 32.0 used to fail inside nn.Embedding
        with pytest.raises((CheckpointError, ConfigError)) as e:
            config_from_hf({**ok, **bad})
        assert "\n" not in str(e.value) and "relative_attention" in str(e.value)
    with pytest.raises(ConfigError):
        tiny_mpnet_config(relative_attention_num_buckets=16)


def test_cli_refuses_an_unknown_relative_attention_setting_with_exit_2(tmp_path, capsys):
    from bertforge.cli import main
    make_tiny_mpnet(tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, "relative_attention_num_buckets": 48}))
    (tmp_path / "t.txt").write_text("a short text\n")
    assert main(["embed", "--model", str(tmp_path / "m"), "--input", str(tmp_path / "t.txt"),
                 "--out", str(tmp_path / "e.npy")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "relative_attention_num_buckets=48" in err


def _cos(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_sentence_transformers_dirs_both_ways(tmp_path):
    st = pytest.importorskip("sentence_transformers")
    from bertforge.runtime.embedder import load_embedder
    from bertforge.models.pooling import Pooling
    out = make_tiny_mpnet(tmp_path / "emb", pooling=Pooling("mean", True, 64))
    texts = [s for s, _ in sentences(10, 3)]
    ours = load_embedder(out).embed(texts, max_seq_len=64)
    model = st.SentenceTransformer(str(out), device="cpu")
    assert type(model[0].auto_model).__name__ == "MPNetModel"
    theirs = model.encode(texts, convert_to_numpy=True)
    assert ours.shape == theirs.shape == (10, 32) and _cos(ours, theirs).min() >= 0.9999
    model.save(str(tmp_path / "st-saved"))  # a dir sentence-transformers wrote loads in bertforge, same vectors
    again = load_embedder(tmp_path / "st-saved").embed(texts, max_seq_len=64)
    assert _cos(again, theirs).min() >= 0.9999
