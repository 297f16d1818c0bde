"""The runtime layer: one Runner interface over PyTorch, ONNX Runtime and ``transformers``.

Truths used: ``transformers``' own BERT classes on the same (random) weights, and ONNX Runtime on the graph
``bertforge export`` writes, give the logits / hidden states of bertforge's PyTorch model (within 1e-4 on
the real, non-padded positions); what :func:`load_runner` picks is read from the files each dir holds.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from bertforge.config import ModelConfig
from bertforge.errors import CheckpointError, ConfigError
from bertforge.task_model import TaskModel
from bertforge.runtime import load_runner
from bertforge.runtime.base import head_kind

pytest.importorskip("onnxruntime")
pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")

VOCAB = 150


def _model(head: str, seed: int = 0, **kw) -> TaskModel:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=48, max_position_embeddings=40, **kw)
    m = TaskModel(cfg, head=head).eval()
    with torch.no_grad():  # no zero biases / unit LayerNorms: every weight matters, and differs
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A classification, a base (embedding) and a QA checkpoint dir, the FP32 ONNX export of each, and an
    ONNX Runtime INT8 and a PyTorch INT8 dir of the classifier."""
    from bertforge.compress import quantize as bq
    from bertforge.compress.onnx import deploy
    root = tmp_path_factory.mktemp("runtime")
    out = {}
    for head, kw in (("sequence_classification", {"num_labels": 3}), ("base", {}),
                     ("question_answering", {"num_labels": 2, "add_pooling_layer": False})):
        m = _model(head, **kw)
        m.save_pretrained(root / head)
        deploy(m, root / f"{head}-onnx", source_dir=root / head)
        out[head], out[f"{head}-onnx"] = root / head, root / f"{head}-onnx"
    cls = _model("sequence_classification", num_labels=3)
    deploy(cls, root / "onnx-int8", quantize=True, check=False)
    bq.save_quantized(bq.quantize_dynamic(cls), cls, root / "torch-int8")
    out["onnx-int8"], out["torch-int8"] = root / "onnx-int8", root / "torch-int8"
    return out


def _batch(b: int = 3, t: int = 11, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (b, t), generator=g)
    am = torch.ones_like(ids)
    am[1, t - 4:] = 0  # padded rows: only real positions are compared
    am[2, t - 7:] = 0
    return ids.numpy(), am.numpy(), np.zeros_like(ids.numpy())


def _max_diff(a: np.ndarray, b: np.ndarray, mask: np.ndarray = None) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    if mask is not None:  # (B, T, …) outputs: real positions only
        a, b = a[mask.astype(bool)], b[mask.astype(bool)]
    return float(np.abs(a - b).max())


# ------------------------------------------------------------------------------------------ parity
def test_classifier_logits_agree_on_all_three_backends(dirs):
    ids, am, tt = _batch()
    torch_out = load_runner(dirs["sequence_classification"], "torch")(ids, am, tt)
    hf_out = load_runner(dirs["sequence_classification"], "transformers")(ids, am, tt)
    ort_out = load_runner(dirs["sequence_classification-onnx"])(ids, am, tt)
    assert set(torch_out) == set(hf_out) == set(ort_out) == {"logits"}
    assert torch_out["logits"].shape == (3, 3) and torch_out["logits"].dtype == np.float32
    assert np.abs(torch_out["logits"]).max() > 1e-2  # not trivially equal
    assert _max_diff(torch_out["logits"], hf_out["logits"]) < 1e-4
    assert _max_diff(torch_out["logits"], ort_out["logits"]) < 1e-4


def test_embedding_model_hidden_states_agree_on_all_three_backends(dirs):
    ids, am, tt = _batch()
    runners = [load_runner(dirs["base"], "torch"), load_runner(dirs["base"], "transformers"),
               load_runner(dirs["base-onnx"])]
    outs = [r(ids, am, tt) for r in runners]
    assert all(set(o) == {"last_hidden_state"} for o in outs)
    assert outs[0]["last_hidden_state"].shape == (3, 11, 32)
    for o in outs[1:]:
        assert _max_diff(outs[0]["last_hidden_state"], o["last_hidden_state"], am) < 1e-4


def test_encoder_states_of_a_classifier_cover_every_position(dirs):
    """A [CLS]-only head skips the other positions of the last layer; asking for ``last_hidden_state``
    returns all of them, as transformers' hidden_states[-1]."""
    ids, am, tt = _batch()
    want = ("last_hidden_state",)
    ours = load_runner(dirs["sequence_classification"], "torch")(ids, am, tt, outputs=want)
    ref = load_runner(dirs["sequence_classification"], "transformers")(ids, am, tt, outputs=want)
    assert _max_diff(ours["last_hidden_state"], ref["last_hidden_state"], am) < 1e-4
    both = load_runner(dirs["sequence_classification"], "torch")(ids, am, tt, outputs=("logits", *want))
    assert _max_diff(both["last_hidden_state"], ours["last_hidden_state"], am) < 1e-5


def test_qa_start_and_end_logits_agree_and_are_named_as_transformers_names_them(dirs):
    ids, am, tt = _batch()
    outs = [load_runner(dirs["question_answering"], b)(ids, am, tt) for b in ("torch", "transformers")]
    outs.append(load_runner(dirs["question_answering-onnx"])(ids, am, tt))
    for o in outs:
        assert {"logits", "start_logits", "end_logits"} <= set(o)
        assert o["logits"].shape == (3, 2, 11) and o["start_logits"].shape == (3, 11)
        assert np.array_equal(o["logits"][:, 0], o["start_logits"])
        assert np.array_equal(o["logits"][:, 1], o["end_logits"])
    for o in outs[1:]:
        for k in ("start_logits", "end_logits"):
            assert _max_diff(outs[0][k], o[k], am) < 1e-4


def test_int8_runners_stay_close_to_fp32(dirs):
    """Not a parity test: INT8 logits are within a few percent of the FP32 model's."""
    ids, am, tt = _batch()
    ref = load_runner(dirs["sequence_classification"])(ids, am, tt)["logits"]
    for key in ("onnx-int8", "torch-int8"):
        got = load_runner(dirs[key])(ids, am, tt)["logits"]
        assert _max_diff(got, ref) < 0.05 * np.abs(ref).max() + 2e-2, key


def test_torch_tensors_and_numpy_arrays_are_both_accepted(dirs):
    ids, am, tt = _batch()
    for key in ("sequence_classification", "sequence_classification-onnx"):
        r = load_runner(dirs[key])
        a = r(ids, am, tt)["logits"]
        b = r(torch.from_numpy(ids), torch.from_numpy(am))["logits"]  # token types default to zeros
        assert np.array_equal(a, b)


# ------------------------------------------------------------------------------------ what is picked
def test_load_runner_picks_the_backend_by_what_the_dir_holds(dirs):
    cases = {"sequence_classification": ("torch", "fp32", "classification"),
             "base": ("torch", "fp32", "base"),
             "question_answering": ("torch", "fp32", "question_answering"),
             "sequence_classification-onnx": ("onnxruntime", "fp32", "classification"),
             "base-onnx": ("onnxruntime", "fp32", "base"),
             "onnx-int8": ("onnxruntime", "int8", "classification"),
             "torch-int8": ("torch", "int8", "classification")}
    for key, (backend, precision, kind) in cases.items():
        r = load_runner(dirs[key])
        assert (r.backend, r.precision, r.kind) == (backend, precision, kind), key
    graph = load_runner(dirs["base-onnx"] / "model.onnx")  # a bare .onnx file
    assert graph.backend == "onnxruntime" and graph.kind == "base"
    hf = load_runner(dirs["sequence_classification"], "transformers")
    assert hf.backend == "transformers" and hf.info["model_class"] == "BertForSequenceClassification"


def test_one_model_reports_one_parameter_count_on_every_backend(dirs):
    d = dirs["sequence_classification"]
    n = sum(p.numel() for p in _model("sequence_classification", num_labels=3).parameters())
    counts = {b: load_runner(d, b).num_parameters for b in ("torch", "transformers", "onnxruntime")}
    counts["export"] = load_runner(dirs["sequence_classification-onnx"]).num_parameters
    counts["torch-int8"] = load_runner(dirs["torch-int8"]).num_parameters
    assert counts == dict.fromkeys(counts, n)


def test_onnxruntime_on_a_checkpoint_exports_on_the_fly(dirs):
    ids, am, tt = _batch()
    r = load_runner(dirs["sequence_classification"], "onnxruntime")
    assert r.info["exported_on_the_fly"] and r.precision == "fp32" and r.weight_files == []
    ref = load_runner(dirs["sequence_classification"], "torch")(ids, am, tt)["logits"]
    assert _max_diff(r(ids, am, tt)["logits"], ref) < 1e-4
    assert load_runner(dirs["sequence_classification"], "onnxruntime", int8=True).precision == "int8"


def test_runner_threads_and_describe(dirs):
    r = load_runner(dirs["sequence_classification-onnx"], threads=1)
    assert r.threads == 1
    rec = r.describe()
    assert rec["backend"] == "onnxruntime" and rec["weights_file"] == "model.onnx"
    assert rec["file_mb"] == round((dirs["sequence_classification-onnx"] / "model.onnx").stat().st_size / 2**20, 3)


def test_head_kind_names_what_the_head_predicts():
    assert head_kind("sequence_classification", {"num_labels": 1}) == "regression"
    assert head_kind("sequence_classification", {"id2label": {"0": "a", "1": "b"}}) == "classification"
    assert head_kind("sequence_classification", {"num_labels": 2, "problem_type": "regression"}) == "regression"
    assert head_kind(None, {}) == head_kind("base", {}) == "base"
    assert head_kind("token_classification", {}) == "token_classification"


# ---------------------------------------------------------------------------------------- bad input
def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert msg and "\n" not in msg
    return msg


def test_bad_paths_give_one_actionable_line(dirs, tmp_path):
    with pytest.raises(CheckpointError) as e:
        load_runner(tmp_path / "nope")
    assert "does not exist" in _one_line(e)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError) as e:
        load_runner(tmp_path / "junk")
    assert "no config.json" in _one_line(e)
    (tmp_path / "cfg-only").mkdir()
    (tmp_path / "cfg-only" / "config.json").write_text((dirs["base"] / "config.json").read_text())
    with pytest.raises(CheckpointError) as e:
        load_runner(tmp_path / "cfg-only")
    assert "model.safetensors" in _one_line(e)
    with pytest.raises(CheckpointError) as e:
        load_runner(tmp_path / "junk" / "notes.txt")
    assert "not a checkpoint directory" in _one_line(e)
    bad = tmp_path / "bad-onnx"
    bad.mkdir()
    (bad / "model.onnx").write_bytes(b"not a graph")
    with pytest.raises(CheckpointError) as e:
        load_runner(bad)
    assert "ONNX Runtime cannot load" in _one_line(e)


def test_backends_that_cannot_run_a_dir_say_which_can(dirs):
    with pytest.raises(CheckpointError) as e:
        load_runner(dirs["sequence_classification-onnx"], "transformers")
    assert "--backend onnxruntime" in _one_line(e)
    with pytest.raises(CheckpointError) as e:
        load_runner(dirs["torch-int8"], "transformers")
    assert "--backend torch" in _one_line(e)
    with pytest.raises(CheckpointError) as e:
        load_runner(dirs["torch-int8"], "onnxruntime")
    assert "PyTorch INT8" in _one_line(e)
    with pytest.raises(ConfigError) as e:
        load_runner(dirs["base"], "tensorflow")
    assert "choose one of" in _one_line(e)
    with pytest.raises(ConfigError) as e:
        load_runner(dirs["sequence_classification-onnx"], int8=True)
    assert "FP32 ONNX graph" in _one_line(e)
    with pytest.raises(ConfigError) as e:
        load_runner(dirs["base"])(_batch()[0], outputs=("logits",))
    assert "no output 'logits'" in _one_line(e)
