"""The training engine states facts; the CLI words the advice with its flags.

Errors raised under ``bertforge.engine.train`` name recipe keys and paths, never a CLI flag; they carry a
``reason`` and the ``facts`` from which the CLI builds its message (the CLI's messages are unchanged); and
no production module reads a test hook from the environment."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from bertforge.pipelines.resume_policy import word_error
from bertforge.config import load_recipe
from bertforge.engine.train.trainer import Trainer
from bertforge.errors import ConfigError, TrainingError

SRC = Path(__file__).resolve().parents[1] / "src" / "bertforge"


def _raised_strings(path: Path) -> list:
    """Every string constant inside a ``raise`` statement of ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Raise):
            out += [c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    return out


def test_engine_error_messages_name_no_cli_flag():
    flag = re.compile(r"(?<![\w-])--[a-z]")
    found = {f.name: s for f in (SRC / "train").glob("*.py") for s in _raised_strings(f) if flag.search(s)}
    assert not found, found


def test_no_test_hook_is_read_from_the_environment():
    hooks = [f for f in SRC.rglob("*.py") if "BERTFORGE_TEST" in f.read_text(encoding="utf-8")]
    assert not hooks, hooks


class _Toy(torch.nn.Module):
    def __init__(self, nan_at: int = 10**9):
        super().__init__()
        self.lin, self.calls, self.nan_at = torch.nn.Linear(2, 1), 0, nan_at

    def forward(self, x, y):
        self.calls += 1
        loss = ((self.lin(x).squeeze(-1) - y) ** 2).mean()
        return {"loss": loss * float("nan") if self.calls >= self.nan_at else loss}

    def save_pretrained(self, d):
        from safetensors.torch import save_model
        save_model(self, str(d / "model.safetensors"))


def _data(n):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(2, generator=g), torch.randn((), generator=g)) for _ in range(n)]


def _collate(items):
    return {"x": torch.stack([a for a, _ in items]), "y": torch.stack([b for _, b in items])}


def test_batch_larger_than_data_states_facts_and_the_cli_names_its_flag(tmp_path):
    with pytest.raises(ConfigError) as e:
        Trainer(_Toy(), _data(5), _collate, load_recipe(None, ["train.batch_size=8"]), tmp_path / "r")
    assert "--" not in str(e.value) and "train.batch_size 8 exceeds the 5 training examples" in str(e.value)
    assert e.value.reason == "batch_exceeds_data" and e.value.facts == {"batch_size": 8, "n_examples": 5}
    assert word_error(e.value) == ("train.batch_size 8 exceeds the 5 training examples; pass --batch-size 5 or "
                                   "less, or more data")


def test_non_finite_loss_states_facts_and_the_cli_says_resume(tmp_path):
    r = load_recipe(None, ["train.batch_size=4", "train.max_steps=6", "train.save_every=2", "impl.progress=false"])
    t = Trainer(_Toy(nan_at=5), _data(16), _collate, r, tmp_path / "r")
    with pytest.raises(TrainingError) as e:
        t.fit()
    last = tmp_path / "r" / "checkpoints" / "step-4"
    assert "--" not in str(e.value) and "loss became nan at step 5" in str(e.value)
    assert e.value.reason == "non_finite_loss" and e.value.facts["last"] == last
    assert word_error(e.value) == (f"loss became nan at step 5; lower train.lr or use impl.dtype=float32 and "
                                   f"--resume (last good checkpoint: {last})")


def test_resume_past_the_end_states_facts_and_the_cli_names_its_flags(tmp_path):
    r = load_recipe(None, ["train.batch_size=4", "train.max_steps=4", "impl.progress=false"])
    Trainer(_Toy(), _data(16), _collate, r, tmp_path / "r").fit()
    r.train.max_steps = 2
    with pytest.raises(ConfigError) as e:
        Trainer(_Toy(), _data(16), _collate, r, tmp_path / "r").fit(resume=True)
    assert "--" not in str(e.value) and e.value.reason == "past_end"
    assert word_error(e.value).startswith(f"--resume: {tmp_path / 'r' / 'checkpoints' / 'step-4'} is at step 4, "
                                          f"past this run's 2 steps (train.max_steps / --max-steps, or train.epochs)")


def test_a_message_without_reason_is_printed_as_it_is():
    assert word_error(ConfigError("train.lr must be a finite number > 0 (got 0)")) == \
        "train.lr must be a finite number > 0 (got 0)"
