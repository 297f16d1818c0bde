"""Trainer: schedules against their formulas, gradient accumulation ≡ a larger batch, recipe saved."""

import pytest
import torch
import yaml

from bertforge.config import ModelConfig, load_recipe
from bertforge.data.collate import PadCollator
from bertforge.engine.train.optim import lr_lambda
from bertforge.engine.train.trainer import Trainer
from bertforge.errors import ConfigError
from bertforge.task_model import TaskModel


def test_linear_warmup_then_decay_values():
    f = lr_lambda("linear", warmup=4, total=12)
    # step s (1-based) ≤ 4: s/4; afterwards 1 − (s−4)/8
    assert [round(f(i), 6) for i in range(12)] == [0.25, 0.5, 0.75, 1.0, 0.875, 0.75, 0.625, 0.5,
                                                   0.375, 0.25, 0.125, 0.0]


def test_inverse_sqrt_is_the_transformer_schedule():
    d_model, warmup = 512, 4000
    peak = d_model ** -0.5 * warmup ** -0.5
    f = lr_lambda("inverse_sqrt", warmup=warmup, total=100000)
    for step in (1, 100, 3999, 4000, 4001, 20000):
        paper = d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)  # Vaswani et al. eq. 3
        assert peak * f(step - 1) == pytest.approx(paper, rel=1e-9)


def test_unknown_schedule_is_a_config_error():
    with pytest.raises(ConfigError):
        lr_lambda("triangular", 1, 2)


def _data(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        L = int(torch.randint(4, 12, (1,), generator=g))
        ids = torch.randint(3, 50, (L,), generator=g).tolist()
        out.append({"input_ids": ids, "token_type_ids": [0] * L, "labels": int(sum(ids) % 2)})
    return out


def _train(tmp_path, name, batch, accum, steps=3):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=32, num_labels=2)
    model = TaskModel(cfg, head="sequence_classification")
    recipe = load_recipe(None, [f"train.batch_size={batch}", f"train.grad_accum_steps={accum}",
                                f"train.max_steps={steps}", "train.dropout_off=true", "train.lr=1e-3",
                                "impl.progress=false", "train.log_every=1"])
    t = Trainer(model, _data(), PadCollator(0), recipe, tmp_path / name)
    t.fit()
    return model, tmp_path / name


def test_gradient_accumulation_equals_larger_batch(tmp_path):
    a, _ = _train(tmp_path, "big", batch=8, accum=1)
    b, out = _train(tmp_path, "accum", batch=4, accum=2)
    for (n, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.allclose(p, q, atol=1e-6), n
    saved = yaml.safe_load((out / "recipe.yaml").read_text())
    assert saved["train"]["grad_accum_steps"] == 2 and saved["train"]["batch_size"] == 4
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len([ln for ln in lines if '"loss"' in ln]) == 3


def test_result_names_the_saved_step_and_the_last_evaluation(tmp_path):
    """An evaluation that peaks at step 2 of 4: the best checkpoint is written at the top, the result says
    so (model_step 2), and the last evaluation's metric is reported with its own step (eval_step 4); the
    saved weights are the step-2 checkpoint's, byte for byte."""
    from safetensors.torch import load_file
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=32, num_labels=2)
    model = TaskModel(cfg, head="sequence_classification")
    recipe = load_recipe(None, ["train.batch_size=8", "train.max_steps=4", "train.eval_every=1",
                                "train.save_every=1", "train.metric_for_best=score", "impl.progress=false",
                                "train.keep_checkpoints=4"])
    scores = iter([0.1, 0.9, 0.5, 0.3])
    t = Trainer(model, _data(), PadCollator(0), recipe, tmp_path / "run",
                eval_fn=lambda m: {"score": next(scores)})
    res = t.fit()
    assert (res["best_step"], res["model_step"], res["eval_step"], res["score"]) == (2, 2, 4, 0.3)
    top = load_file(str(tmp_path / "run" / "model.safetensors"))
    ck = load_file(str(tmp_path / "run" / "checkpoints" / "step-2" / "model.safetensors"))
    assert top.keys() == ck.keys() and all(torch.equal(top[k], ck[k]) for k in top)
    with pytest.raises(ConfigError, match="train.batch_size 64 exceeds the 32 training examples"):
        Trainer(model, _data(), PadCollator(0), load_recipe(None, ["train.batch_size=64"]), tmp_path / "big")


def test_an_unknown_metric_for_best_is_named_once(tmp_path, capsys):
    from bertforge.config import ModelConfig, load_recipe
    from bertforge.data.collate import PadCollator
    from bertforge.task_model import TaskModel
    from bertforge.engine.train.trainer import Trainer
    cfg = ModelConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=32, num_labels=2)
    data = [{"input_ids": [3, 4, 5], "token_type_ids": [0, 0, 0], "labels": 1}] * 8
    recipe = load_recipe(None, ["train.batch_size=4", "train.max_steps=2", "train.eval_every=1",
                                "impl.progress=false", "train.metric_for_best=nope"])
    t = Trainer(TaskModel(cfg, head="sequence_classification"), data, PadCollator(0), recipe, tmp_path / "r",
                eval_fn=lambda m: {"accuracy": 0.5})
    result = t.fit()
    err = capsys.readouterr().err
    assert err.count("train.metric_for_best='nope' is not among the evaluation's metrics (accuracy)") == 1
    assert result["best"] is None
