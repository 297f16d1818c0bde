"""`bertforge bench`: the same parameter count for one model dir on every backend (torch, transformers,
onnxruntime): each distinct weight once, the tied input/output embedding once, whatever the backend runs;
a batch that does not fit in memory is refused before any work, with the sizes that fit; --threads and
--int8 are honoured where they apply."""
from __future__ import annotations

import json

import pytest
import torch

from bertforge.cli import main
import bertforge.checkpoint.read  # noqa: F401  (registers the pretraining heads, e.g. mlm)
from bertforge.config import ModelConfig
from bertforge.task_model import TaskModel


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory):
    """A tiny RoBERTa MLM checkpoint whose output projection is tied to the word embeddings (as
    `pretrain --objective roberta` writes), with fresh LayerNorms (equal values the ONNX exporter merges)."""
    torch.manual_seed(0)
    cfg = ModelConfig(model_type="roberta", num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                      intermediate_size=64, vocab_size=300, max_position_embeddings=34, type_vocab_size=1,
                      pad_token_id=1, add_pooling_layer=False)
    m = TaskModel(cfg, head="mlm").eval()
    d = tmp_path_factory.mktemp("bench") / "rob"
    m.save_pretrained(d)
    return d, sum(p.numel() for p in m.parameters())  # parameters() yields a tied tensor once


def _bench(capsys, model, *extra) -> dict:
    rc = main(["bench", "--model", str(model), *extra, "--seq-len", "16", "--iters", "1", "--warmup", "0",
               "--threads", "1"])
    assert rc == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_bench_parameters_agree_across_backends(mlm_dir, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("transformers")
    d, distinct = mlm_dir
    recs = {b: _bench(capsys, d, "--backend", b) for b in ("torch", "transformers", "onnxruntime")}
    assert {b: r["parameters"] for b, r in recs.items()} == dict.fromkeys(recs, distinct)
    # transformers runs the checkpoint's own architecture (MLM head), not a bare encoder + a random pooler
    assert recs["transformers"]["model_class"] == "RobertaForMaskedLM"
    assert "weights_initialised_fresh" not in recs["transformers"]
    assert "checkpoint_weights_unused" not in recs["transformers"]
    assert "parameters_counted" not in recs["onnxruntime"]
    # a dir holding its own model.onnx (FP32 or INT8) counts as the checkpoint it was exported from
    for extra in ([], ["--int8"]):
        out = tmp_path / ("onnx" + "".join(extra))
        assert main(["export", "--model", str(d), "--out", str(out), *extra]) == 0
        capsys.readouterr()
        assert _bench(capsys, out)["parameters"] == distinct
    # and so does a PyTorch INT8 dir (quantization scales / zero points / axes are not weights)
    q = tmp_path / "q8"
    assert main(["quantize", "--model", str(d), "--out", str(q), "--backend", "torch"]) == 0
    capsys.readouterr()
    rec = _bench(capsys, q)
    assert rec["precision"] == "int8" and rec["parameters"] == distinct


def test_bench_onnx_count_for_a_foreign_config_says_what_it_counts():
    """A model.onnx whose config.json bertforge cannot build: the graph's initializers are counted and the
    JSON says so (they may repeat a tied embedding)."""
    pytest.importorskip("onnx")
    import onnx
    from onnx import TensorProto, helper

    from bertforge.runtime.onnx import count_graph_parameters
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 4], [0.0] * 12)
    g = helper.make_graph([], "g", [], [], initializer=[w])
    res = count_graph_parameters({"model_type": "not-a-family"}, onnx.helper.make_model(g).graph)
    assert res["parameters"] == 12 and "initializer" in res["parameters_counted"]


def test_bench_transformers_says_when_it_runs_a_different_model(tmp_path, capsys):
    """SpanBERT's SBO head has no transformers class: transformers runs BertForMaskedLM without it, so its
    count is lower and the JSON lists the checkpoint weights it left out."""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = ModelConfig(model_type="bert", num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                      intermediate_size=64, vocab_size=200, max_position_embeddings=32, add_pooling_layer=False)
    m = TaskModel(cfg, head="mlm_sbo").eval()
    m.save_pretrained(tmp_path / "span")
    torch_rec = _bench(capsys, tmp_path / "span", "--backend", "torch")
    hf_rec = _bench(capsys, tmp_path / "span", "--backend", "transformers")
    assert torch_rec["parameters"] == sum(p.numel() for p in m.parameters())
    unused = hf_rec["checkpoint_weights_unused"]
    assert unused and all(k.startswith("cls.sbo.") for k in unused)
    assert hf_rec["model_class"] == "BertForMaskedLM" and hf_rec["parameters"] < torch_rec["parameters"]


def test_bench_transformers_prints_no_loading_bar(mlm_dir, capsys):
    """stderr carries no transformers "Loading weights" progress bar, and the caller's bar setting is kept."""
    pytest.importorskip("transformers")
    from transformers.utils import logging as hf_logging
    d, _ = mlm_dir
    hf_logging.enable_progress_bar()
    rc = main(["bench", "--model", str(d), "--backend", "transformers", "--seq-len", "8", "--iters", "1",
               "--warmup", "0", "--threads", "1"])
    err = capsys.readouterr().err
    assert rc == 0 and "Loading weights" not in err
    assert hf_logging.is_progress_bar_enabled()



def _bench_argv(model, *extra) -> list:
    return ["bench", "--model", model, "--seq-len", 16, "--iters", 2, "--warmup", 0, *extra]


def test_bench_refuses_a_batch_that_does_not_fit_in_memory(workspace, capsys, monkeypatch, cli_error):
    import importlib

    from bertforge.cli import main
    B = importlib.import_module("bertforge.runtime.bench")  # the module; bertforge.runtime.bench is the function
    monkeypatch.setattr(B, "available_memory_bytes", lambda: 2**30)  # a 1 GiB machine
    for extra in (["--batch-size", "100000"], ["--batch-size", "20000", "--seq-len", "64"]):
        line = cli_error(_bench_argv(workspace.run, *extra), untouched=workspace.run)
        assert "--batch-size" in line and "GiB" in line and "available" in line, line
        assert "lower --batch-size or --seq-len" in line
    # normal sizes still run on the same (pretend) 1 GiB machine
    argv = _bench_argv(workspace.run, "--batch-size", "64", "--seq-len", "64", "--iters", "1")
    assert main([str(a) for a in argv]) == 0
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rec["batch_size"] == 64 and rec["calls"] == 1


def test_memory_estimate_is_sane_for_real_models():
    from bertforge.runtime.bench import activation_bytes, available_memory_bytes, check_memory
    from bertforge.errors import ConfigError
    base = {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072}
    minilm = {"hidden_size": 384, "num_attention_heads": 12, "intermediate_size": 1536}
    assert activation_bytes(base, 64, 512) < 4 * 2**30  # BERT-base batch 64 × 512: a few GiB
    check_memory(minilm, 64, 512, available=8 * 2**30)
    with pytest.raises(ConfigError, match="--batch-size 4096"):
        check_memory(minilm, 4096, 512, available=64 * 2**30)
    avail = available_memory_bytes()
    assert avail is None or avail > 0


def test_bench_threads_within_range_runs(workspace, capsys):
    from bertforge.cli import main
    torch_threads = torch.get_num_threads()
    try:
        assert main([str(a) for a in _bench_argv(workspace.run, "--threads", "1")]) == 0
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["threads"] == 1
    finally:
        torch.set_num_threads(torch_threads)


def test_bench_int8_on_an_int8_onnx_dir_is_fine(workspace, tmp_path, capsys):
    """--int8 is only refused where it would be silently ignored (an FP32 graph)."""
    from bertforge.cli import main
    q = tmp_path / "onnx-int8"
    assert main(["quantize", "--model", str(workspace.run), "--out", str(q), "--reduce-range"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["reduce_range"] is True
    assert json.loads((q / "onnx.json").read_text())["reduce_range"] is True
    assert main([str(a) for a in _bench_argv(q, "--int8")]) == 0
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rec["precision"] == "int8" and "7-bit reduce_range" in rec["quantization"]
