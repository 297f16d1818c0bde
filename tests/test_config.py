"""Recipes and overrides (config.py): ``key=value`` overrides are typed and may follow any option, recipe
files are type-checked like overrides, and model config values are range-checked — each refusal a
ConfigError that names the key and the value.
"""
from __future__ import annotations

import pytest


def test_overrides_after_a_many_valued_option_are_overrides(monkeypatch):
    from bertforge import cli
    seen = {}

    def fake_run(args):
        seen.update(corpus=args.corpus, overrides=args.overrides)
        return 0
    import bertforge.cli.commands.pretrain as pt
    monkeypatch.setattr(pt, "run", fake_run)
    assert cli.main(["pretrain", "--objective", "bert", "--corpus", "a.txt", "b.txt", "pretrain.max_span=4",
                     "--out", "o", "train.lr=1e-4"]) == 0
    assert seen == {"corpus": ["a.txt", "b.txt"], "overrides": ["pretrain.max_span=4", "train.lr=1e-4"]}


@pytest.mark.parametrize("kw,needle", [
    ({"num_attention_heads": 0}, "model.num_attention_heads=0"),
    ({"hidden_size": -8}, "model.hidden_size=-8"),
    ({"hidden_size": "big"}, "model.hidden_size='big'"),
    ({"hidden_dropout_prob": 1.5}, "model.hidden_dropout_prob=1.5"),
    ({"attention_probs_dropout_prob": float("nan")}, "model.attention_probs_dropout_prob=nan"),
    ({"vocab_size": 0}, "model.vocab_size=0"),
    ({"layer_norm_eps": 0.0}, "model.layer_norm_eps=0.0"),
])
def test_model_config_values_are_range_checked(kw, needle):
    from bertforge.config import ModelConfig
    from bertforge.errors import ConfigError
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.").replace("(", r"\(")):
        ModelConfig(**kw)


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


def test_recipe_file_numbers_in_exponent_form_and_scalar_sections(tmp_path):
    from bertforge.config import load_recipe
    from bertforge.errors import ConfigError
    ok = tmp_path / "ok.yaml"
    ok.write_text("train:\n  lr: 1e-4\n  max_steps: 1e3\nmodel:\n  hidden_dropout_prob: 1e-1\n")
    r = load_recipe(str(ok))
    assert r.train.lr == 1e-4 and r.train.max_steps == 1000 and r.model["hidden_dropout_prob"] == 0.1
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: 5\n")
    with pytest.raises(ConfigError, match="section 'train' must be a mapping"):
        load_recipe(str(bad))
