"""`bertforge bundle`: standard-op graphs whose outputs are the answers, equal to bertforge's own runners on the
same weights, read by bertforge_lite (lite/) — and the bad inputs that must fail in one line.

Truth: bertforge's runner on the source dir (PyTorch for a checkpoint, ONNX Runtime for an INT8 dir) with the
post-processing written out in numpy here (softmax, sigmoid ≥ threshold, argmax, pooling). Tolerances: FP32
1e-5 (float32 re-ordered sums of values ≤ ~10), the INT8 dir 1e-4 (bundle_manifest.TOLERANCE).
"""
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import make_tiny_checkpoint

LITE = Path(__file__).resolve().parents[1] / "lite"
NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
TEXTS = ["good movie", "the plot was fine and funny", "bad", "great great great " * 30]


def _head(root: Path, name: str, head: str, tok_dir: Path, seed: int, **cfg_kw) -> Path:
    import torch
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    from bertforge.tokenizer import load_tokenizer
    tok = load_tokenizer(tok_dir)
    torch.manual_seed(seed)
    cfg = ModelConfig(model_type="bert", vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=64, **cfg_kw)
    m = TaskModel(cfg, head=head).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    m.save_pretrained(root / name, tokenizer=tok)
    return root / name


@pytest.fixture(scope="module")
def lite():
    sys.path.insert(0, str(LITE))
    import bertforge_lite
    yield bertforge_lite
    sys.path.remove(str(LITE))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    from bertforge.checkpoint.layout import write_pooling, write_truncate_dim
    from bertforge.checkpoint.read import load_pretrained
    from bertforge.compress.onnx import deploy
    root = tmp_path_factory.mktemp("bundle")
    d = {"emb": make_tiny_checkpoint(root / "emb")}
    write_pooling(d["emb"], "mean", normalize=True, hidden_size=32)
    write_truncate_dim(d["emb"], 16)
    d["cls"] = _head(root, "cls", "sequence_classification", d["emb"], 1, num_labels=3,
                     id2label={0: "neg", 1: "neu", 2: "pos"})
    d["reg"] = _head(root, "reg", "sequence_classification", d["emb"], 2, num_labels=1,
                     problem_type="regression", id2label={0: "score"})
    d["multi"] = _head(root, "multi", "sequence_classification", d["emb"], 3, num_labels=3,
                       problem_type="multi_label_classification", id2label={0: "a", 1: "b", 2: "c"})
    cfg = json.loads((d["multi"] / "config.json").read_text())
    cfg.setdefault("bertforge", {})["thresholds"] = {"use": "per_label", "global": 0.5,
                                                    "per_label": [0.3, 0.5, 0.7]}
    (d["multi"] / "config.json").write_text(json.dumps(cfg))
    d["ner"] = _head(root, "ner", "token_classification", d["emb"], 4, num_labels=5,
                     id2label=dict(enumerate(NER_LABELS)), add_pooling_layer=False)
    d["qa"] = _head(root, "qa", "question_answering", d["emb"], 5, num_labels=2, add_pooling_layer=False)
    deploy(load_pretrained(d["cls"]), root / "cls-int8", source_dir=d["cls"], quantize=True)
    d["cls-int8"] = root / "cls-int8"
    d["mlm"] = _head(root, "mlm", "mlm", d["emb"], 6)
    return d


@pytest.fixture(scope="module")
def bundled(dirs, tmp_path_factory):
    import bertforge
    out = tmp_path_factory.mktemp("bundles") / "B"
    names = ("emb", "cls", "reg", "multi", "ner", "qa", "cls-int8")
    bertforge.bundle({n: dirs[n] for n in names}, out, fused=False)
    return out


def _feeds(runner, tok, texts, max_length):
    from bertforge.tokenizer import encode_texts
    encs = encode_texts(tok, texts, None, max_length)
    t = max(len(e.ids) for e in encs)
    ids = np.zeros((len(encs), t), np.int64)
    am = np.zeros_like(ids)
    for i, e in enumerate(encs):
        ids[i, :len(e.ids)], am[i, :len(e.ids)] = e.ids, 1
    return ids, am, np.zeros_like(ids)


def _logits(path, texts, max_length=64):
    from bertforge.runtime import load_runner
    r = load_runner(path)
    ids, am, tt = _feeds(r, r.tokenizer, texts, max_length)
    return r(ids, am, tt, outputs=("logits",))["logits"], am


def test_graphs_use_the_default_onnx_domain_only(bundled):
    import onnx
    from bertforge.compress.bundle_graph import foreign_ops
    m = json.loads((bundled / "manifest.json").read_text())
    for name, e in m["models"].items():
        assert foreign_ops(onnx.load(str(bundled / e["graph"]))) == [], name
    assert m["models"]["cls-int8"]["precision"] == "int8"
    # a bundle leaves this host: its manifest names each source dir, never this host's absolute path
    assert {e["source"] for e in m["models"].values()} >= {"cls-int8"}
    assert not any(os.sep in e["source"] for e in m["models"].values())


def test_embedding_is_pooled_truncated_normalised_in_the_graph(bundled, dirs, lite):
    from bertforge.runtime.embedder import load_embedder
    got = lite.Bundle(bundled, "emb").embed(TEXTS)
    ref = load_embedder(dirs["emb"]).embed(TEXTS, max_seq_len=64)
    assert got.shape == (4, 16)  # truncate_dim 16 of H = 32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    assert np.abs(got - ref).max() <= 1e-5


@pytest.mark.parametrize("name,tol", [("cls", 1e-5), ("cls-int8", 1e-4)])
def test_classification_softmax_and_label(bundled, dirs, lite, name, tol):
    got = lite.Bundle(bundled, name).classify(TEXTS)
    z, _ = _logits(dirs[name], TEXTS)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    labels = ["neg", "neu", "pos"]
    for g, row in zip(got, p):
        assert np.abs(np.array([g["scores"][k] for k in labels]) - row).max() <= tol
        assert g["label"] == labels[int(row.argmax())]


def test_multilabel_thresholds_and_regression(bundled, dirs, lite):
    got = lite.Bundle(bundled, "multi").classify(TEXTS)
    z, _ = _logits(dirs["multi"], TEXTS)
    s = 1 / (1 + np.exp(-z))
    th = np.array([0.3, 0.5, 0.7])
    for g, row in zip(got, s):
        assert np.abs(np.array([g["scores"][k] for k in "abc"]) - row).max() <= 1e-5
        assert g["labels"] == [k for k, on in zip("abc", row >= th) if on]
    reg = lite.Bundle(bundled, "reg").classify(TEXTS)
    z, _ = _logits(dirs["reg"], TEXTS)
    assert np.abs(np.array([r["score"] for r in reg]) - z[:, 0]).max() <= 1e-5


def test_ner_tags_scores_and_char_offsets(bundled, dirs, lite):
    b = lite.Bundle(bundled, "ner")
    out = b.run(TEXTS)
    z, am = _logits(dirs["ner"], TEXTS)
    for i, (tags, sc) in enumerate(zip(out["tag_ids"], out["tag_scores"])):
        n = int(am[i].sum())
        p = np.exp(z[i, :n] - z[i, :n].max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        assert (tags == z[i, :n].argmax(-1)).all()
        assert np.abs(sc - p.max(-1)).max() <= 1e-5
    for text, ents in zip(TEXTS, b.ner(TEXTS)):
        for e in ents:
            assert text[e["start"]:e["end"]] == e["text"] and e["label"] in ("PER", "LOC")


def test_qa_logits_and_span(bundled, dirs, lite):
    from bertforge.runtime import load_runner
    from bertforge.runtime.base import split_qa
    b = lite.Bundle(bundled, "qa")
    q, c = "what was fine", "the plot was fine and the acting was good"
    out = b.run([(q, c)])
    r = load_runner(dirs["qa"])
    enc = b.encode([(q, c)])[0]
    ids = np.asarray([enc.ids], np.int64)
    ref = split_qa(r(ids, np.ones_like(ids), np.asarray([enc.type_ids], np.int64), outputs=("logits",)))
    assert np.abs(out["start_logits"][0] - ref["start_logits"][0]).max() <= 1e-5
    a = b.qa(q, c)
    assert c[a["start"]:a["end"]] == a["answer"] and a["start"] >= 0


def test_verify_passes_then_fails_on_a_changed_file(bundled, tmp_path, lite, cli_error):
    import shutil
    from bertforge.cli import main
    assert main(["bundle", "verify", str(bundled)]) == 0
    assert set(lite.verify(bundled)) == {"emb", "cls", "reg", "multi", "ner", "qa", "cls-int8"}
    bad = tmp_path / "bad"
    shutil.copytree(bundled, bad)
    with open(bad / "cls" / "model.onnx", "ab") as f:
        f.write(b"\0")
    line = cli_error(["bundle", "verify", bad], bad)
    assert "cls/model.onnx changed" in line
    with pytest.raises(lite.BundleError, match="changed"):
        lite.verify(bad)


def test_bad_inputs_one_line_and_documented_behaviour(bundled, dirs, tmp_path, lite, cli_error):
    out = tmp_path / "never"
    assert "training head" in cli_error(["bundle", "--model", dirs["mlm"], "--out", out], dirs["mlm"])
    assert "no config.json" in cli_error(["bundle", "--model", tmp_path, "--out", out], dirs["emb"])
    assert not out.exists()
    with pytest.raises(lite.BundleError, match="cannot do this — use .ner"):
        lite.Bundle(bundled, "ner").embed(["a text"])
    b = lite.Bundle(bundled, "emb")
    with pytest.raises(ValueError, match="gives no token"):  # this tiny tokenizer adds no [CLS]/[SEP]
        b.embed([""])
    long = b.encode(["great " * 500])[0]
    assert len(long.ids) == b.max_length == 64  # truncated to the manifest's max_length


def test_fused_graph_beside_the_standard_one(dirs, tmp_path, lite):
    import bertforge
    r = bertforge.bundle({"cls": dirs["cls"]}, tmp_path / "F", fused=True)
    e = r.manifest["models"]["cls"]
    assert e["fused_graph"] == "cls/model.fused.onnx" and "cls/model.fused.onnx" in r.manifest["files"]
    import onnxruntime as ort
    b = lite.Bundle(tmp_path / "F")
    feeds = b.feeds(b.encode(TEXTS))
    fused = ort.InferenceSession(str(tmp_path / "F" / e["fused_graph"]), providers=["CPUExecutionProvider"])
    assert np.abs(fused.run(["scores"], feeds)[0] - b.session.run(["scores"], feeds)[0]).max() <= 1e-5


def test_modernbert_and_static_embedders_bundle(dirs, tmp_path, lite):
    """ModernBERT (rotary, local windows: standard ops already) and a static table (its graph's own
    sentence_embedding output re-routed) give bertforge's vectors."""
    import torch
    import bertforge
    from bertforge.config import ModelConfig
    from bertforge.models.static import save_static, static_config
    from bertforge.runtime.embedder import load_embedder
    from bertforge.task_model import TaskModel
    from bertforge.tokenizer import load_tokenizer
    tok = load_tokenizer(dirs["emb"])
    torch.manual_seed(0)
    cfg = ModelConfig(model_type="modernbert", vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=3,
                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    TaskModel(cfg, head="base").save_pretrained(tmp_path / "mb", tokenizer=tok)
    (tmp_path / "static").mkdir()
    save_static(tmp_path / "static", torch.randn(tok.get_vocab_size(), 16), dirs["emb"],
                static_config(tok.get_vocab_size(), 16))
    for name, dim in (("mb", 32), ("static", 16)):
        b = bertforge.bundle({name: tmp_path / name}, tmp_path / f"B-{name}").out
        got = lite.Bundle(b).embed(TEXTS)
        ref = load_embedder(tmp_path / name).embed(TEXTS, max_seq_len=64)
        assert got.shape == (4, dim) and np.abs(got - ref).max() <= 1e-5, name


def test_one_text_is_one_answer_and_non_strings_are_refused(bundled, lite):
    """A str is one text (not a list of characters); anything but strings is a BundleError naming it."""
    emb, cls, ner = (lite.Bundle(bundled, n) for n in ("emb", "cls", "ner"))
    text = "great film about a dog"
    np.testing.assert_array_equal(emb.embed(text), emb.embed([text])[0])
    assert emb.embed(text).shape == (16,)  # the declared truncate_dim
    assert cls.classify(text) == cls.classify([text])[0]
    assert ner.ner(text) == ner.ner([text])[0]
    for bad, what in ((None, "NoneType"), ([1, 2], "an int"), (["ok", None], "text 1"), (b"x", "bytes"),
                      (["\udcff"], "lone surrogate")):
        with pytest.raises(lite.BundleError, match=what):
            emb.embed(bad)
    with pytest.raises(lite.BundleError, match="threads"):
        lite.Bundle(bundled, "emb", threads=0)


@pytest.mark.parametrize("edit, message", [
    (lambda e: e.pop("kind"), "kind None"),
    (lambda e: e["pooling"].update(truncate_dim=3), "golden vectors have 16 dimensions"),
    (lambda e: e.update(graph="/etc/passwd"), "not a file of the bundle"),
    (lambda e: e.update(max_length="abc"), "max_length 'abc'"),
])
def test_a_damaged_manifest_is_refused_on_load_and_by_both_verifies(bundled, tmp_path, lite, cli_error, edit,
                                                                    message):
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(bundled, bad)
    m = json.loads((bad / "manifest.json").read_text())
    edit(m["models"]["emb"])
    (bad / "manifest.json").write_text(json.dumps(m))
    assert message in cli_error(["bundle", "verify", bad], bad)
    with pytest.raises(lite.BundleError, match=message.replace("(", r"\(")):
        lite.verify(bad)
    with pytest.raises(lite.BundleError, match=message.replace("(", r"\(")):
        lite.Bundle(bad, "emb")


def test_a_missing_graph_or_tokenizer_is_one_line_on_load(bundled, tmp_path, lite):
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(bundled, bad)
    (bad / "emb" / "model.onnx").write_bytes(b"not a graph")
    with pytest.raises(lite.BundleError, match="cannot be loaded by onnxruntime"):
        lite.Bundle(bad, "emb")
    bad2 = tmp_path / "bad2"
    shutil.copytree(bundled, bad2)
    (bad2 / "emb" / "tokenizer.json").write_text("{oops")
    with pytest.raises(lite.BundleError, match="not a readable tokenizer"):
        lite.Bundle(bad2, "emb")


def test_two_models_of_one_name_are_refused(dirs, tmp_path, cli_error):
    out = tmp_path / "dup"
    line = cli_error(["bundle", "--model", f"a={dirs['emb']}", "--model", f"a={dirs['cls']}", "--out", out],
                     dirs["emb"])
    assert "two models are named 'a'" in line and not out.exists()
    import bertforge
    r = bertforge.bundle({"emb": dirs["emb"]}, tmp_path / "one")
    assert len(repr(r)) < 200 and "emb: embedding fp32" in repr(r)
    from bertforge.errors import BertforgeError
    with pytest.raises(BertforgeError, match="overwrite=True") as e:  # Python errors name Python options
        bertforge.bundle({"emb": dirs["emb"]}, tmp_path / "one")
    assert "--" not in str(e.value)


def test_a_bundle_passed_where_a_checkpoint_is_needed_says_so(bundled, cli_error):
    line = cli_error(["serve", "--model", bundled, "--port", "0"], bundled)
    assert "is a bundle" in line and "bertforge_lite" in line
