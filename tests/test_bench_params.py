"""`bertforge bench` reports the same parameter count for one model dir on every backend: each distinct
weight once (the tied input/output embedding once), whatever the backend runs (user trial: torch,
transformers and onnxruntime gave three different numbers for one pretraining run dir)."""
from __future__ import annotations

import json

import pytest
import torch

from bertforge.cli import main
import bertforge.hf  # noqa: F401  (registers the pretraining heads, e.g. mlm)
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
    d = tmp_path_factory.mktemp("s12bench") / "rob"
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

    from bertforge.evaluate.bench import _onnx_dir_parameters
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 4], [0.0] * 12)
    g = helper.make_graph([], "g", [], [], initializer=[w])
    res = _onnx_dir_parameters({"model_type": "not-a-family"}, onnx.helper.make_model(g).graph)
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
