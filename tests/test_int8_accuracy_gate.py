"""The INT8 accuracy gate: measured against FP32 on calibration texts, sensitive MatMuls kept in FP32.

Truths: a model built so that one MatMul cannot survive INT8 on any host (one input channel of its activations
a thousand times larger than the rest: the per-tensor uint8 scale then rounds every other channel to zero —
the outlier features of Dettmers et al. 2022, §3) and whose FP32 function is unchanged by the construction; the
gate must name exactly that node and the graph it writes must agree with FP32. No INT8 graph reproduces FP32's vectors exactly, so
``--max-drop 0`` cannot be met: one line, exit 2, nothing written.
"""
import json

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.compress import int8 as Q
from bertforge.config import ModelConfig
from bertforge.task_model import TaskModel


def _classifier(seed=0, head="sequence_classification"):
    torch.manual_seed(seed)
    cfg = ModelConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64,
                      vocab_size=30522, max_position_embeddings=64, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, num_labels=2)
    return TaskModel(cfg, head=head).eval()


def _outlier_model():
    """An embedding model (no head: agreement = cosine of the mean-pooled vectors). Layer 1's FFN: unit 0 of
    the intermediate layer gives ~10⁶ on every token (so the output MatMul's input has one huge channel) and
    its output weights are divided by as much (so it adds a constant of the same size as before); the other
    units' output weights ×100, so that this FFN dominates the layer's output."""
    m = _classifier(head="base")
    ffn = m.encoder.layers[1].ffn
    with torch.no_grad():
        ffn.intermediate.weight[0].zero_()
        ffn.intermediate.bias[0] = 1e6
        ffn.output.weight.mul_(100.0)
        ffn.output.weight[:, 0] /= 1e8
    return m


def _save(model, path, minilm_dir):
    from bertforge.tokenizer import copy_tokenizer_files
    model.save_pretrained(path)
    copy_tokenizer_files(minilm_dir, path)
    return path


def _calib(tmp_path, n=64):
    from bertforge.data.bundled import lee_background_documents
    lines = [doc for _, (doc,) in lee_background_documents()][:n]
    (tmp_path / "calib.txt").write_text("\n".join(t[:200] for t in lines) + "\n", encoding="utf-8")
    return tmp_path / "calib.txt"


def test_one_node_int8_breaks_is_found_kept_in_fp32_and_the_graph_then_agrees(tmp_path, minilm_dir, capsys):
    src = _save(_outlier_model(), tmp_path / "m", minilm_dir)
    calib = _calib(tmp_path)
    # without the gate's help (a drop it tolerates) INT8 breaks the model's answers
    assert main(["quantize", "--model", str(src), "--out", str(tmp_path / "loose"), "--calib", str(calib),
                 "--max-drop", "100"]) == 0
    loose = json.loads((tmp_path / "loose" / "onnx.json").read_text())["gate"]
    assert loose["agreement"] < 95 and loose["kept_fp32"] == []
    capsys.readouterr()
    assert main(["quantize", "--model", str(src), "--out", str(tmp_path / "q"), "--calib", str(calib),
                 "--max-drop", "2"]) == 0
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    gate = rec["gate"]
    assert gate["kept_fp32"] == ["/ffn/output_1/MatMul"]  # layer 1's FFN output, and only it
    assert gate["most_sensitive"][0]["node"] == "/ffn/output_1/MatMul"
    assert gate["agreement"] >= 98 and gate["drop"] <= 2 and "cosine" in gate["metric"]
    assert json.loads((tmp_path / "q" / "onnx.json").read_text())["gate"]["kept_fp32"] == gate["kept_fp32"]
    # the graph written keeps that MatMul in FP32 and quantizes the others
    import onnx
    ops = [n for n in onnx.load(str(tmp_path / "q" / "model.onnx")).graph.node]
    assert any(n.op_type == "MatMul" and n.name == "/ffn/output_1/MatMul" for n in ops)
    assert sum(n.op_type == "MatMulInteger" for n in ops) >= 4


def test_a_max_drop_no_scheme_can_meet_is_one_line_and_nothing_is_written(tmp_path, minilm_dir, capsys):
    """--max-drop 0: vectors identical to FP32's, which no INT8 graph with a quantized MatMul gives."""
    src = _save(_outlier_model(), tmp_path / "m", minilm_dir)
    out = tmp_path / "q"
    assert main(["quantize", "--model", str(src), "--out", str(out), "--calib", str(_calib(tmp_path)),
                 "--max-drop", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no INT8 scheme meets --max-drop 0" in err[0] and "cosine" in err[0], err
    assert "of 8 MatMuls kept in FP32" in err[0]
    assert not out.exists()


@pytest.mark.parametrize("argv,words", [
    (["--max-drop", "-1"], "--max-drop -1 is not a number of points in [0, 100]"),
    (["--scheme", "u8u8", "--reduce-range"], "--reduce-range means --scheme u8s8-7bit"),
    (["--calibration", "entropy"], "--calibration sets how a static scheme"),
    (["--calib", "missing.txt"], "--calib missing.txt is not a file"),
    (["--backend", "torch", "--target", "avx2"], "--target applies to the onnxruntime backend"),
])
def test_bad_int8_options_are_one_line_and_write_nothing(tmp_path, minilm_dir, capsys, argv, words, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = _save(_classifier(), tmp_path / "m", minilm_dir)
    assert main(["quantize", "--model", str(src), "--out", str(tmp_path / "q"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not (tmp_path / "q").exists()


def test_agreement_measures_each_kind_of_output():
    rng = np.random.default_rng(0)
    mask = np.ones((4, 5), dtype=np.int64)
    logits = rng.normal(size=(4, 3))
    flipped = logits.copy()
    flipped[0] = flipped[0][::-1] * 10  # row 0's label changes
    assert Q.agreement("classification", logits, logits, mask) == 100.0
    assert Q.agreement("classification", logits, flipped, mask) in (75.0, 100.0)
    h = rng.normal(size=(4, 5, 8))
    assert Q.agreement("base", h, h, mask) == pytest.approx(100.0)
    assert Q.agreement("base", h, -h, mask) == pytest.approx(-100.0)
    tags = ["O", "B-PER", "I-PER"]
    tok = np.zeros((1, 5, 3))
    tok[0, :, 0] = 1.0
    tok[0, 1, 1] = tok[0, 2, 2] = 5.0  # one entity, tokens 1–2
    other = tok.copy()
    other[0, 2, 2] = 0.0  # the entity shrinks to token 1: span F1 0
    assert Q.agreement("token_classification", tok, tok, mask[:1], labels=tags) == 100.0
    assert Q.agreement("token_classification", tok, other, mask[:1], labels=tags) == 0.0


def test_static_scheme_keeps_stdout_for_the_json_and_runs_as_int8(tmp_path, minilm_dir, capsys):
    src = _save(_classifier(), tmp_path / "m", minilm_dir)
    out = tmp_path / "s"
    assert main(["quantize", "--model", str(src), "--out", str(out), "--calib", str(_calib(tmp_path, 16)),
                 "--scheme", "s8s8-static", "--calibration", "percentile", "--max-drop", "100"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["scheme"] == "s8s8-static"  # ORT's progress went to stderr
    from bertforge.runtime import load_runner
    assert load_runner(out).precision == "int8"


def test_a_named_scheme_that_saturates_on_the_target_is_written_with_a_warning(tmp_path, minilm_dir, capsys):
    src = _save(_classifier(), tmp_path / "m", minilm_dir)
    assert main(["quantize", "--model", str(src), "--out", str(tmp_path / "q"), "--calib", str(_calib(tmp_path, 16)),
                 "--target", "avx2", "--scheme", "u8s8", "--max-drop", "100"]) == 0
    out = capsys.readouterr()
    rec = json.loads(out.out.strip().splitlines()[-1])
    assert rec["exact_on_target"] is False and "saturates on avx2" in rec["warning"]
    assert "warning: scheme u8s8 saturates on avx2" in out.err and "u8s8-7bit" in out.err
