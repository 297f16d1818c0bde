"""``bertforge quantize --bits``: the low-bit dir (MatMulNBits graph + lowbit.json) is ModelDir format ``low-bit``,
runs through the one ONNX runner that ``evaluate`` / ``bench`` / ``serve`` use, computes what the fake-quantized
PyTorch model computes, records bits per layer within the size budget, and bad input is one line, exit 2."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers import make_tiny_checkpoint


@pytest.fixture(scope="module")
def lowbit(workspace):
    from bertforge.cli import main
    torch.set_num_threads(1)
    out = workspace.d / "run-lowbit"
    if not out.exists():
        assert main(["quantize", "--model", str(workspace.run), "--out", str(out), "--bits", "mixed",
                     "--size-budget", "0.03", "--group-size", "16", "--qat-steps", "2", "--qat-batch-size", "8",
                     "--calib", str(_calib(workspace)), "--eval", str(workspace.train), "--hessian-iters", "5",
                     "--trace-samples", "2"]) == 0
    return workspace, out


def _calib(ws):
    from helpers import sentences
    p = ws.d / "calib.txt"
    p.write_text("\n".join(s for s, _ in sentences(24, 5)) + "\n")
    return p


def test_low_bit_dir_records_bits_within_the_budget_and_equals_the_torch_model(lowbit):
    from bertforge.checkpoint.modeldir import ModelDir
    ws, out = lowbit
    rec = json.loads((out / "lowbit.json").read_text())
    md = ModelDir.open(out)
    assert md.format == "low-bit" and md.graph == out / "model.onnx"
    assert set(rec["bits_per_layer"].values()) <= {2, 3, 4, 8}
    assert rec["true_mb"] <= 0.03
    assert rec["graph"]["matmul_nbits"] >= 6 and rec["graph"]["gather_block_quantized"] == 1
    assert set(rec["eval"]) >= {"fp32", "round_to_nearest", "low_bit"}
    # FP32 sums of a 2-layer H=32 model: far below 1e-4 of logits of size ~1 (summation order only)
    assert rec["onnx_vs_torch_max_abs_diff"] < 1e-4
    assert all(len(v["top_eigenvalues"]) == 2 for v in rec["sensitivity"].values())


def test_low_bit_dir_runs_in_the_runner_evaluate_and_serve_use(lowbit, capsys):
    from bertforge.cli import main
    from bertforge.runtime import load_runner
    from bertforge.server.models import load_model
    ws, out = lowbit
    r = load_runner(out)
    assert r.backend == "onnxruntime" and r.precision == "low-bit"
    ids = torch.tensor([[2, 7, 9, 3, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    logits = r(input_ids=ids, attention_mask=mask)["logits"]
    assert np.all(np.isfinite(logits)) and logits.shape == (1, 2)
    served = load_model("q", out)
    assert served.kind == "classification"
    capsys.readouterr()
    assert main(["evaluate", "--model", str(out), "--data", str(ws.train)]) == 0
    assert "accuracy" in capsys.readouterr().out


def test_bad_low_bit_input_is_one_line(workspace, tmp_path, cli_error):
    run = workspace.run
    line = cli_error(["quantize", "--model", run, "--out", tmp_path / "a", "--bits", "5"], run)
    assert "--bits 5" in line
    line = cli_error(["quantize", "--model", run, "--out", tmp_path / "b", "--bits", "mixed", "--size-budget",
                      "0.001"], run)
    assert "below what 2 bits allow" in line
    least = line.rsplit("pass at least ", 1)[1].strip()
    floor = float(line.split("(", 1)[1].split(" MB")[0])
    assert float(least) >= floor and float(least) - floor < 1.001e-3  # the least it names passes the 2-bit floor
    line = cli_error(["quantize", "--model", run, "--out", tmp_path / "c", "--bits", "mixed"], run)
    assert "--size-budget" in line
    for bad in ("inf", "nan", "0", "-3"):
        line = cli_error(["quantize", "--model", run, "--out", tmp_path / "d", "--bits", "mixed", "--size-budget",
                          bad], run)
        assert "a finite size in MB above 0" in line, (bad, line)


def test_low_bit_of_a_static_model_is_refused(tmp_path, cli_error):
    from bertforge.cli import main
    teacher = make_tiny_checkpoint(tmp_path / "teacher")
    static = tmp_path / "static"
    assert main(["distill", "--method", "static", "--teacher", str(teacher), "--dim", "8", "--out", str(static),
                 "--no-progress"]) == 0
    line = cli_error(["quantize", "--model", static, "--out", tmp_path / "q", "--bits", "4"], static)
    assert "static" in line


def test_an_encoder_without_head_embeds_as_its_fake_quantized_model(tmp_path):
    """Python API, ``--bits 3`` (stored in the 4-bit layout) with pooled-embedding QAT: the graph's token states
    equal the PyTorch fake-quantized model's (the record's check) and the embedder reads the dir."""
    import bertforge
    from helpers import sentences
    from bertforge.runtime.embedder import load_embedder
    tiny = make_tiny_checkpoint(tmp_path / "tiny")
    texts = [s for s, _ in sentences(16, 3)]
    rec = bertforge.quantize(str(tiny), str(tmp_path / "q3"), bits=3, group_size=16, qat_steps=1,
                             qat_batch_size=8, calib=texts).record
    assert set(rec["bits_per_layer"].values()) == {3} and "sensitivity" not in rec  # fixed bits: no Hessian
    assert rec["onnx_vs_torch_max_abs_diff"] < 1e-4
    assert rec["true_mb"] < rec["file_mb"]  # 3-bit codes are stored in 4 bits
    vecs = load_embedder(tmp_path / "q3").embed(texts[:3], 32)
    assert np.all(np.isfinite(vecs)) and vecs.shape[0] == 3


def test_qat_that_moves_the_model_away_from_fp32_is_undone(tmp_path, capsys):
    """QAT at a learning rate far too high moves the fake-quantized model away from the FP32 one on the held-out
    calibration texts: the round-to-nearest weights are put back, so the dir computes what ``qat_steps=0`` gives
    (same grids, same seed), and lowbit.json says so."""
    import bertforge
    from helpers import sentences
    from bertforge.runtime.embedder import load_embedder
    torch.set_num_threads(1)
    tiny = make_tiny_checkpoint(tmp_path / "tiny")
    texts = [s for s, _ in sentences(32, 3)]
    common = dict(bits=4, group_size=16, calib=texts, seed=0)
    bertforge.quantize(str(tiny), str(tmp_path / "rtn"), qat_steps=0, **common)
    rec = bertforge.quantize(str(tiny), str(tmp_path / "bad"), qat_steps=6, qat_batch_size=8, qat_lr=0.5,
                             **common).record["qat"]
    assert rec["heldout_texts"] == 8  # a quarter of 32 calibration texts
    assert rec["heldout_loss_qat"] > rec["heldout_loss_rtn"] and rec["kept"] is False
    assert "round-to-nearest weights are kept" in capsys.readouterr().err
    a = load_embedder(tmp_path / "rtn").embed(texts[:4], 32)
    b = load_embedder(tmp_path / "bad").embed(texts[:4], 32)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
