"""More bad-input cases (bench, prune, recipe overrides) found by a new-user run: each exits 2 with one
``bertforge: error: …`` line that names the flag/key, no traceback, and nothing written. Plus the
behaviour fixes that go with them (encoder-only magnitude pruning, --eval in magnitude mode, the
min-heads warning).
"""
from __future__ import annotations

import json
import os

import pytest
import torch

from resilience_util import cli_error_line, sentences, tiny_workspace

pytestmark = pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """A tiny base checkpoint (2 layers × 2 heads, 64 positions), a fine-tuned SST-2 classifier of it,
    its ONNX export and its torch INT8 quantization."""
    from bertforge.cli import main
    d = tmp_path_factory.mktemp("bad_more")
    ns = tiny_workspace(d)
    ns.text = d / "corpus.txt"
    ns.text.write_text("\n".join(s for s, _ in sentences(16, 2)) + "\n")
    ns.onnx = d / "onnx"
    assert main(["export", "--model", str(ns.run), "--out", str(ns.onnx)]) == 0
    ns.int8 = d / "int8"
    assert main(["quantize", "--model", str(ns.run), "--out", str(ns.int8), "--backend", "torch"]) == 0
    return ns


def _ft(w, *extra):
    return ["finetune", "--model", w.tiny, "--task", "sst2", "--train", w.train, "--out", w.d / "new",
            "--max-steps", 1, "--batch-size", 8, "--max-seq-len", 32, "--no-progress", *extra]


def _bench(w, *extra, model=None):
    return ["bench", "--model", model or w.run, "--seq-len", 16, "--iters", 2, "--warmup", 0, *extra]


def _prune(w, *extra, model=None, data=True):
    return ["prune", "--model", model or w.run, "--out", w.d / "pr",
            *(["--data", w.train] if data else []), *extra]


CORES = os.cpu_count() or 1

# (id, argv builder, substrings the one error line must contain)
CASES = [
    # ---- bench: timing options (bugs 1, 2)
    ("bench-iters-zero", lambda w: _bench(w, "--iters", 0), ["--iters 0", "≥ 1"]),
    ("bench-warmup-negative", lambda w: _bench(w, "--warmup", -1), ["--warmup -1", "≥ 0"]),
    ("bench-min-seconds-negative", lambda w: _bench(w, "--min-seconds", -2), ["--min-seconds -2", "≥ 0"]),
    ("bench-threads-negative", lambda w: _bench(w, "--threads", -3),
     ["--threads -3", f"choose 1–{4 * CORES}", f"has {CORES} core"]),
    ("bench-threads-zero", lambda w: _bench(w, "--threads", 0), ["--threads 0", f"choose 1–{4 * CORES}"]),
    ("bench-threads-huge", lambda w: _bench(w, "--threads", 100000),
     ["--threads 100000", f"choose 1–{4 * CORES}", f"this machine has {CORES} core"]),
    # ---- bench: --int8 on an FP32 ONNX dir (bug 4), transformers on ONNX / INT8 dirs (bug 5)
    ("bench-int8-on-fp32-onnx", lambda w: _bench(w, "--int8", model=w.onnx),
     ["--int8", "FP32 ONNX graph", "bertforge quantize", "drop --int8"]),
    ("bench-transformers-on-onnx", lambda w: _bench(w, "--backend", "transformers", model=w.onnx),
     ["ONNX graph (model.onnx)", "no model.safetensors", "--backend onnxruntime"]),
    ("bench-transformers-int8", lambda w: _bench(w, "--backend", "transformers", "--int8", model=w.run),
     ["--int8 is for bertforge models"]),
    ("quantize-torch-no-fused", lambda w: ["quantize", "--model", w.run, "--out", w.d / "q", "--backend", "torch",
                                           "--no-fused"], ["--no-fused applies to the onnxruntime backend",
                                                           "shapes the exported ONNX graph"]),
    ("quantize-task-without-eval", lambda w: ["quantize", "--model", w.run, "--out", w.d / "q", "--task", "stsb"],
     ["--task sets up the accuracy check of --eval"]),
    ("export-fusions-without-optimizer", lambda w: ["export", "--model", w.run, "--out", w.d / "x", "--no-optimize",
                                                    "--fusions", "all"], ["--no-optimize", "pass one of them"]),
    ("bench-transformers-on-int8", lambda w: _bench(w, "--backend", "transformers", model=w.int8),
     ["PyTorch INT8 model (model.int8.safetensors)", "no model.safetensors", "--backend torch"]),
    # ---- prune: numeric flags (bug 6)
    ("prune-batch-size-zero", lambda w: _prune(w, "--fraction", 0.5, "--batch-size", 0), ["--batch-size 0"]),
    ("prune-batch-size-negative", lambda w: _prune(w, "--fraction", 0.5, "--batch-size", -1),
     ["--batch-size -1", "≥ 1"]),
    ("prune-max-samples-zero", lambda w: _prune(w, "--fraction", 0.5, "--max-samples", 0),
     ["--max-samples 0", "≥ 1"]),
    ("prune-max-samples-negative", lambda w: _prune(w, "--fraction", 0.5, "--max-samples", -5),
     ["--max-samples -5"]),
    ("prune-max-eval-samples-zero", lambda w: _prune(w, "--fraction", 0.5, "--eval", w.train,
                                                      "--max-eval-samples", 0), ["--max-eval-samples 0"]),
    ("prune-steps-zero", lambda w: _prune(w, "--fraction", 0.5, "--steps", 0), ["--steps 0", "≥ 1"]),
    ("prune-min-heads-negative", lambda w: _prune(w, "--fraction", 0.5, "--min-heads-per-layer", -1),
     ["--min-heads-per-layer -1", "≥ 0"]),
    ("prune-max-seq-len-one", lambda w: _prune(w, "--fraction", 0.5, "--max-seq-len", 1),
     ["--max-seq-len 1", "≥ 2"]),
    ("prune-max-seq-len-beyond-positions", lambda w: _prune(w, "--fraction", 0.5, "--max-seq-len", 1000),
     ["--max-seq-len 1000 exceeds the model's 64 positions"]),
    ("prune-fraction-negative", lambda w: _prune(w, "--fraction", -0.1), ["--fraction -0.1", "[0, 1)"]),
    ("prune-ffn-fraction-one", lambda w: _prune(w, "--ffn-fraction", 1), ["--ffn-fraction 1", "[0, 1)"]),
    ("prune-magnitude-out-of-range", lambda w: _prune(w, "--magnitude", 2, data=False),
     ["--magnitude 2", "(0, 1)"]),
    ("prune-magnitude-zero", lambda w: _prune(w, "--magnitude", 0, data=False), ["--magnitude 0", "(0, 1)"]),
    ("prune-nothing", lambda w: _prune(w, "--fraction", 0), ["nothing to prune with --fraction 0",
                                                             "share above 0"]),
    ("prune-magnitude-with-fraction", lambda w: _prune(w, "--magnitude", 0.5, "--fraction", 0.3, data=False),
     ["--magnitude", "--fraction", "cannot be combined"]),
    ("prune-magnitude-with-importance-data", lambda w: _prune(w, "--magnitude", 0.5),
     ["--data belongs to head/FFN importance pruning", "drop --data"]),
    ("prune-magnitude-with-steps", lambda w: _prune(w, "--magnitude", 0.5, "--steps", 3, data=False),
     ["--steps belongs to head/FFN importance pruning"]),
    ("prune-magnitude-with-ffn-fraction", lambda w: _prune(w, "--magnitude", 0.5, "--ffn-fraction", 0.3,
                                                            data=False), ["--magnitude", "--ffn-fraction"]),
    # ---- prune: mlm loss without an MLM head (bug 7), unreachable min-heads (bug 9)
    ("prune-loss-mlm-on-classifier", lambda w: _prune(w, "--fraction", 0.5, "--loss", "mlm"),
     ["--loss mlm needs a model with an MLM head", "--loss task", "fisher"]),
    ("prune-min-heads-13", lambda w: _prune(w, "--fraction", 0.3, "--min-heads-per-layer", 13),
     ["--min-heads-per-layer 13", "2 heads per layer", "removes none"]),
    ("prune-min-heads-all", lambda w: _prune(w, "--fraction", 0.3, "--min-heads-per-layer", 2),
     ["--min-heads-per-layer 2", "below 2"]),
    # ---- recipe overrides are type-checked (bug 10)
    ("ft-lr-abc", lambda w: _ft(w, "train.lr=abc"), ["train.lr=abc: expected a number"]),
    ("ft-batch-size-abc", lambda w: _ft(w, "train.batch_size=abc"), ["train.batch_size=abc: expected an integer"]),
    ("ft-epochs-abc", lambda w: _ft(w, "train.epochs=abc"), ["train.epochs=abc: expected a number"]),
    ("ft-seed-abc", lambda w: _ft(w, "train.seed=abc"), ["train.seed=abc: expected an integer"]),
    ("ft-seed-float", lambda w: _ft(w, "train.seed=1.5"), ["train.seed=1.5: expected an integer"]),
    ("ft-warmup-ratio-abc", lambda w: _ft(w, "train.warmup_ratio=abc"), ["train.warmup_ratio=abc: expected a number"]),
    ("ft-max-seq-len-abc", lambda w: _ft(w, "data.max_seq_len=abc"), ["data.max_seq_len=abc: expected an integer"]),
    ("ft-load-best-maybe", lambda w: _ft(w, "train.load_best_at_end=maybe"),
     ["train.load_best_at_end=maybe: expected true/false"]),
    ("ft-max-steps-abc", lambda w: _ft(w, "train.max_steps=abc"), ["train.max_steps=abc: expected an integer"]),
    ("ft-adam-betas-scalar", lambda w: _ft(w, "train.adam_betas=0.9"), ["train.adam_betas=0.9: expected a list"]),
    ("ft-model-key-abc", lambda w: _ft(w, "model.hidden_dropout_prob=abc"),
     ["model.hidden_dropout_prob=abc: expected a number"]),
    ("distill-temperature-abc", lambda w: ["distill", "--teacher", w.run, "--student", "1L-16H-2A-32I",
                                           "--train", w.train, "--out", w.d / "dst", "distill.temperature=abc"],
     ["distill.temperature=abc: expected a number"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_more(case, w, capsys):
    name, argv, needles = case
    line = cli_error_line(argv(w), capsys, untouched=w.run)
    for n in needles:
        assert n in line, (n, line)


# ------------------------------------------------------------------------------ bench: memory (bug 3)
def test_bench_refuses_a_batch_that_does_not_fit_in_memory(w, capsys, monkeypatch):
    import importlib

    from bertforge.cli import main
    B = importlib.import_module("bertforge.evaluate.bench")  # the module; bertforge.evaluate.bench is the function
    monkeypatch.setattr(B, "available_memory_bytes", lambda: 2**30)  # a 1 GiB machine
    for extra in (["--batch-size", "100000"], ["--batch-size", "20000", "--seq-len", "64"]):
        line = cli_error_line(_bench(w, *extra), capsys, untouched=w.run)
        assert "--batch-size" in line and "GiB" in line and "available" in line, line
        assert "lower --batch-size or --seq-len" in line
    # normal sizes still run on the same (pretend) 1 GiB machine
    assert main([str(a) for a in _bench(w, "--batch-size", "64", "--seq-len", "64", "--iters", "1")]) == 0
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rec["batch_size"] == 64 and rec["calls"] == 1


def test_memory_estimate_is_sane_for_real_models():
    from bertforge.evaluate.bench import activation_bytes, available_memory_bytes, check_memory
    from bertforge.errors import ConfigError
    base = {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072}
    minilm = {"hidden_size": 384, "num_attention_heads": 12, "intermediate_size": 1536}
    assert activation_bytes(base, 64, 512) < 4 * 2**30  # BERT-base batch 64 × 512: a few GiB
    check_memory(minilm, 64, 512, available=8 * 2**30)
    with pytest.raises(ConfigError, match="--batch-size 4096"):
        check_memory(minilm, 4096, 512, available=64 * 2**30)
    avail = available_memory_bytes()
    assert avail is None or avail > 0


def test_bench_threads_within_range_runs(w, capsys):
    from bertforge.cli import main
    torch_threads = torch.get_num_threads()
    try:
        assert main([str(a) for a in _bench(w, "--threads", "1")]) == 0
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["threads"] == 1
    finally:
        torch.set_num_threads(torch_threads)


def test_bench_int8_on_an_int8_onnx_dir_is_fine(w, capsys):
    """--int8 is only refused where it would be silently ignored (an FP32 graph)."""
    from bertforge.cli import main
    q = w.d / "onnx-int8"
    assert main(["quantize", "--model", str(w.run), "--out", str(q), "--reduce-range"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["reduce_range"] is True
    assert json.loads((q / "onnx.json").read_text())["reduce_range"] is True
    assert main([str(a) for a in _bench(w, "--int8", model=q)]) == 0
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rec["precision"] == "int8" and "7-bit reduce_range" in rec["quantization"]


# ------------------------------------------------------------------- prune: magnitude mode (bug 8)
def test_magnitude_prune_spares_pooler_and_classifier_and_reports_eval(w, capsys):
    from bertforge.cli import main
    from bertforge.hf import load_pretrained
    out = w.d / "mag"
    ref = load_pretrained(w.run)
    assert main(["prune", "--model", str(w.run), "--out", str(out), "--magnitude", "0.5",
                 "--eval", str(w.train)]) == 0
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    m = load_pretrained(out)
    # the pooler and the task head are untouched
    torch.testing.assert_close(m.encoder.pooler.weight, ref.encoder.pooler.weight, atol=0, rtol=0)
    torch.testing.assert_close(m.head.classifier.weight, ref.head.classifier.weight, atol=0, rtol=0)
    # half of the encoder's Linear weights are zero
    enc = [mod.weight for mod in m.encoder.layers.modules() if isinstance(mod, torch.nn.Linear)]
    zeros = sum(int((x == 0).sum()) for x in enc)
    total = sum(x.numel() for x in enc)
    assert abs(zeros / total - 0.5) < 1e-3
    assert rec["magnitude"]["modules"] == "encoder" and abs(rec["magnitude"]["sparsity"] - 0.5) < 1e-3
    # --eval is honoured: the task metric before and after, in stdout and prune.json
    assert rec["metric"] == "accuracy"
    assert 0 <= rec["eval"]["unpruned"] <= 1 and 0 <= rec["eval"]["pruned"] <= 1
    saved = json.loads((out / "prune.json").read_text())
    assert saved["eval"] == rec["eval"]


def test_magnitude_prune_library_modules_all_ranks_every_linear():
    from bertforge.compress import prune as P
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    torch.manual_seed(0)
    m = TaskModel(ModelConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=48,
                              vocab_size=120, max_position_embeddings=40), head="sequence_classification")
    pooler = m.encoder.pooler.weight.detach().clone()
    P.magnitude_prune(m, 0.4)
    assert torch.equal(m.encoder.pooler.weight, pooler)
    rep = P.magnitude_prune(m, 0.6, modules="all")
    assert rep["modules"] == "all" and int((m.encoder.pooler.weight == 0).sum()) > 0


# --------------------------------------------------------------- prune: reachable fraction (bug 9)
def test_min_heads_lowering_the_fraction_warns_once(w, capsys):
    from bertforge.cli import main
    out = w.d / "minheads"
    # 2 layers × 2 heads; --fraction 0.75 wants 3 heads but 1 per layer must stay → only 2 can go
    assert main(["prune", "--model", str(w.tiny), "--out", str(out), "--data", str(w.text), "--fraction", "0.75",
                 "--min-heads-per-layer", "1", "--max-seq-len", "24"]) == 0
    captured = capsys.readouterr()
    warn = [x for x in captured.err.splitlines() if "warning" in x]
    assert len(warn) == 1 and "only 2 of 4 heads" in warn[0] and "--fraction 0.75" in warn[0], captured.err
    assert json.loads(captured.out.strip().splitlines()[-1])["heads_per_layer"] == [1, 1]


# ----------------------------------------------------------------- recipe overrides (bug 10, library)
@pytest.mark.parametrize("ov,want", [
    ("train.lr=3e-5", ("train", "lr", 3e-5)),
    ("train.epochs=2", ("train", "epochs", 2.0)),
    ("train.batch_size=16", ("train", "batch_size", 16)),
    ("train.load_best_at_end=no", ("train", "load_best_at_end", False)),
    ("train.load_best_at_end=1", ("train", "load_best_at_end", True)),
    ("train.load_best_at_end=True", ("train", "load_best_at_end", True)),
    ("train.max_steps=none", ("train", "max_steps", None)),
    ("train.adam_betas=[0.9,0.98]", ("train", "adam_betas", (0.9, 0.98))),
    ("data.text_columns=[0,1]", ("data", "text_columns", [0, 1])),
    ("impl.threads=2", ("impl", "threads", 2)),
])
def test_good_overrides_are_coerced(ov, want):
    from bertforge.config import load_recipe
    r = load_recipe(None, [ov])
    sec, key, value = want
    assert getattr(getattr(r, sec), key) == value


@pytest.mark.parametrize("ov,needle", [
    ("train.load_best_at_end=on", "expected true/false"),
    ("train.grad_accum_steps=[1]", "expected an integer"),
    ("impl.compile=2", "expected true/false"),
    ("data.max_train_samples=lots", "expected an integer"),
])
def test_bad_overrides_name_key_value_and_type(ov, needle):
    from bertforge.config import load_recipe
    from bertforge.errors import ConfigError
    with pytest.raises(ConfigError) as e:
        load_recipe(None, [ov])
    assert str(e.value).startswith(ov.split("=")[0] + "=") and needle in str(e.value)


def test_recipe_file_values_are_type_checked(tmp_path):
    from bertforge.config import load_recipe
    from bertforge.errors import ConfigError
    p = tmp_path / "r.yaml"
    p.write_text("train:\n  lr: fast\n")
    with pytest.raises(ConfigError, match="train.lr=fast: expected a number"):
        load_recipe(str(p))
    p.write_text("distill:\n  temperature: hot\n")
    with pytest.raises(ConfigError, match="distill.temperature=hot"):
        load_recipe(str(p), extra_sections=("distill",))


def test_evaluate_and_predict_score_export_and_int8_dirs(w, capsys):
    """An ONNX export (FP32, within 1e-4 of PyTorch) scores the same accuracy as its checkpoint; the torch
    INT8 dir scores what `quantize --eval` reported for it; predict writes one line per example."""
    from bertforge.cli import main

    def evaluate(model):
        assert main(["evaluate", "--model", str(model), "--data", str(w.train)]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    fp32, onnx_fp32, int8 = evaluate(w.run), evaluate(w.onnx), evaluate(w.int8)
    assert onnx_fp32["accuracy"] == fp32["accuracy"] and onnx_fp32["n"] == fp32["n"] == 24
    q = w.d / "int8-eval"
    assert main(["quantize", "--model", str(w.run), "--out", str(q), "--backend", "torch", "--eval",
                 str(w.train)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["eval"]["int8"]["accuracy"] == \
        int8["accuracy"]
    preds = w.d / "onnx-preds.jsonl"
    assert main(["predict", "--model", str(w.onnx), "--data", str(w.train), "--out", str(preds)]) == 0
    assert len(preds.read_text().splitlines()) == 24
