"""impl.dtype: bf16 autocast only where the device multiplies bf16 natively ('auto'), and a warning where
bfloat16 is asked for on a CPU that would emulate it (~100x slower matmuls)."""
import pytest
import torch

from bertforge.cli.commands._common import check_recipe
from bertforge.config import ModelConfig, load_recipe
from bertforge.data.collate import PadCollator
from bertforge.engine.train import precision, trainer as trainer_mod
from bertforge.errors import ConfigError
from bertforge.task_model import TaskModel


def test_native_bf16_from_cpu_flags():
    assert precision.native_bf16("cpu", ["avx2", "avx512f", "avx512_bf16"])
    assert precision.native_bf16("cpu", ["avx2", "amx_bf16", "amx_tile"])
    assert precision.native_bf16("cpu", ["asimd", "bf16"])  # ARMv8.6 BF16
    assert not precision.native_bf16("cpu", ["sse4_2", "avx", "avx2", "fma"])  # AVX2-only (AMD Zen 3)
    assert not precision.native_bf16("cpu", [])


def test_auto_resolves_by_this_cpu_and_check_recipe_records_it():
    want = "bfloat16" if precision.native_bf16("cpu") else "float32"
    assert precision.resolve_dtype("auto", "cpu") == want
    assert precision.resolve_dtype("float32", "cpu") == "float32"
    assert precision.resolve_dtype("bfloat16", "cpu") == "bfloat16"
    r = check_recipe(load_recipe(None, ["impl.dtype=auto", "impl.device=cpu"]))
    assert r.impl.dtype == want
    with pytest.raises(ConfigError, match="auto"):
        check_recipe(load_recipe(None, ["impl.dtype=float16"]))


@pytest.mark.parametrize("native", [False, True])
def test_trainer_warns_on_emulated_bf16_only(tmp_path, monkeypatch, capsys, native):
    monkeypatch.setattr(precision, "cpu_flags", lambda: ["avx2"] + (["avx512_bf16"] if native else []))
    cfg = ModelConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=16, num_labels=2)
    data = [{"input_ids": [3, 4, 5], "token_type_ids": [0, 0, 0], "labels": 1}] * 4
    recipe = load_recipe(None, ["impl.dtype=bfloat16", "impl.progress=false", "train.max_steps=1", "train.batch_size=2",
                                "impl.device=cpu"])
    t = trainer_mod.Trainer(TaskModel(cfg, head="sequence_classification"), data, PadCollator(0), recipe,
                            tmp_path / "run")
    err = capsys.readouterr().err
    assert ("bf16 matmuls are ~100x slower" in err) is (not native)
    assert t.dtype == "bfloat16"  # asked for explicitly: honoured, only warned about


def test_translate_default_recipe_uses_auto():
    from bertforge.pipelines.translate import DEFAULT_RECIPE
    assert DEFAULT_RECIPE["impl"]["dtype"] == "auto"
