"""`bertforge translate train/decode` end to end on a toy word-substitution language (learnable in a few
hundred tiny steps), plus the recipe/defaults contract and user errors (exit 2, one line)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from bertforge.cli import main

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["cat", "dog", "man", "woman", "runs", "sits", "red", "blue", "big", "small", "park", "street",
         "ball", "child", "eats", "sees"]
GLOSS = {w: w[::-1].capitalize() + "o" for w in WORDS}  # a deterministic "German"


def _corpus(n, seed):
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(n):
        ws = [rng.choice(WORDS) for _ in range(rng.randint(3, 6))]
        src.append(" ".join(ws) + ".")
        tgt.append(" ".join(GLOSS[w] for w in ws) + ".")
    return src, tgt


def _write(d: Path, name: str, lines):
    p = d / name
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(p)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    d = tmp_path_factory.mktemp("toy")
    s, t = _corpus(1200, 0)
    vs, vt = _corpus(60, 1)
    files = {"src": _write(d, "train.en", s), "tgt": _write(d, "train.de", t),
             "vsrc": _write(d, "val.en", vs), "vtgt": _write(d, "val.de", vt)}
    return d, files


def _train_args(f: dict, out) -> list:
    """`translate train` on the toy corpus files into ``out``."""
    return ["translate", "train", "--src", f["src"], "--tgt", f["tgt"], "--valid-src", f["vsrc"],
            "--valid-tgt", f["vtgt"], "--out", str(out)]


def test_translate_train_then_decode_learns_toy_language(toy, capsys, monkeypatch):
    d, f = toy
    out = d / "run"
    rc = main([*_train_args(f, out), "--no-progress", "--max-steps", "300",
               "--max-tokens", "600", "model.d_model=64", "model.ffn_dim=128", "model.encoder_layers=2",
               "model.decoder_layers=2", "model.num_heads=4", "model.dropout=0.0", "translate.vocab_size=120",
               "train.warmup_steps=50", "train.lr=3e-3", "train.eval_every=150", "train.save_every=150",
               "translate.eval_bleu_sentences=30", "impl.dtype=float32", "impl.threads=1"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["step"] == 300
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "bertforge-transformer"
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    evals = [json.loads(x)["eval"] for x in (out / "metrics.jsonl").read_text().splitlines()
             if "eval" in json.loads(x)]
    assert len(evals) == 2 and evals[-1]["val_loss"] < evals[0]["val_loss"] + 1e-6
    for beam in ("1", "4"):
        hyp = d / f"hyp{beam}.txt"
        rc = main(["translate", "decode", "--model", str(out), "--input", f["vsrc"], "--beam", beam,
                   "--output", str(hyp), "--reference", f["vtgt"], "--threads", "1"])
        assert rc == 0
        r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert r["sentences"] == 60
        # the toy language is word-for-word: a model that learned it scores far above chance
        assert r["bleu"] > 60, r
        lines = hyp.read_text(encoding="utf-8").splitlines()
        assert len(lines) == 60 and lines[0].endswith(".")
    # without --beam, decode uses the run's translate.beam (recipe.yaml; default 4 as §6.1)
    rc = main(["translate", "decode", "--model", str(out), "--input", f["vsrc"], "--output", str(d / "h.txt"),
               "--threads", "1"])
    assert rc == 0 and json.loads(capsys.readouterr().out.strip().splitlines()[-1])["beam"] == 4
    # --bf16 on a CPU without native bf16: decoding warns as training does (simulated CPU flags)
    from bertforge.engine.train import precision
    monkeypatch.setattr(precision, "cpu_flags", lambda: ["avx2", "fma"])
    rc = main(["translate", "decode", "--model", str(out), "--input", f["vsrc"], "--beam", "1", "--bf16",
               "--threads", "1"])
    assert rc == 0 and "bf16 matmuls are ~100x slower" in capsys.readouterr().err


def test_recipe_file_equals_builtin_defaults():
    from bertforge.pipelines.translate import DEFAULT_RECIPE
    raw = yaml.safe_load((ROOT / "recipes" / "translate" / "small.yaml").read_text())
    assert raw == DEFAULT_RECIPE


def test_noam_factor_gives_paper_learning_rate():
    import argparse

    from bertforge.pipelines.translate import build_translate_recipe
    a = argparse.Namespace(recipe=None, overrides=["translate.noam_factor=1.0", "train.warmup_steps=4000",
                                                  "model.d_model=512"],
                           epochs=None, max_steps=None, lr=None, seed=None, batch_size=None, max_minutes=None,
                           max_tokens=None, bf16=False, no_progress=True, src="a", tgt="b", valid_src="c",
                           valid_tgt="d")
    r = build_translate_recipe(a)
    assert r.train.lr == pytest.approx(512 ** -0.5 * 4000 ** -0.5)
    from bertforge.engine.train.optim import lr_lambda
    f = lr_lambda("inverse_sqrt", 4000, 10**6)
    for step in (1, 100, 4000, 10000, 50000):  # lr(step) = d^-0.5 · min(step^-0.5, step · warmup^-1.5)
        want = 512 ** -0.5 * min(step ** -0.5, step * 4000 ** -1.5)
        assert r.train.lr * f(step - 1) == pytest.approx(want, rel=1e-9)


def test_user_errors_exit_2_with_one_line(toy, capsys, tmp_path):
    _, f = toy
    short = _write(tmp_path, "short.de", ["x"])
    rc = main(["translate", "train", "--src", f["src"], "--tgt", short, "--valid-src", f["vsrc"],
               "--valid-tgt", f["vtgt"], "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and "aligned line by line" in err and err.count("\n") == 1
    rc = main(["translate", "decode", "--model", str(tmp_path / "none"), "--input", f["vsrc"]])
    assert rc == 2 and "does not exist" in capsys.readouterr().err
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    rc = main(["translate", "decode", "--model", str(tmp_path / "bert"), "--input", f["vsrc"]])
    assert rc == 2 and "not a translation checkpoint" in capsys.readouterr().err
    (tmp_path / "bert" / "config.json").write_text("German text, not JSON")
    rc = main(["translate", "decode", "--model", str(tmp_path / "bert"), "--input", f["vsrc"]])
    err = capsys.readouterr().err
    assert rc == 2 and "config.json" in err and err.count("\n") == 1
    rc = main([*_train_args(f, tmp_path / "r2"), "translate.bogus=1"])
    assert rc == 2 and "translate.bogus" in capsys.readouterr().err


def test_max_minutes_budget_stops_training_and_saves(toy, capsys):
    d, f = toy
    out = d / "budget"
    rc = main([*_train_args(f, out), "--no-progress", "--max-steps", "500",
               "--max-minutes", "0.00001", "model.d_model=16", "model.ffn_dim=32", "model.encoder_layers=1",
               "model.decoder_layers=1", "model.num_heads=2", "translate.vocab_size=80",
               "translate.eval_bleu_sentences=5", "impl.dtype=float32", "impl.threads=1"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["step"] == 1  # the budget ran out after the first update: final eval and save happened
    assert "val_loss" in res and (out / "model.safetensors").is_file()


def test_decode_settings_come_from_the_run_recipe(tmp_path):
    """Unset decode flags take the run's translate.* values, else beam 4 / α 0.6 (Vaswani et al. §6.1);
    a flag wins; a broken value names the file and the flag."""
    import argparse

    from bertforge.pipelines.translate import decode_settings
    from bertforge.errors import ConfigError

    def settings(**flags):
        a = argparse.Namespace(model=str(tmp_path), beam=None, length_penalty=None, max_len_a=None,
                               max_len_b=None)
        for k, v in flags.items():
            setattr(a, k, v)
        decode_settings(a)
        return a.beam, a.length_penalty, a.max_len_a, a.max_len_b
    assert settings() == (4, 0.6, 1.5, 10)
    (tmp_path / "recipe.yaml").write_text("translate:\n  beam: 7\n  length_penalty: 1.0\n")
    assert settings() == (7, 1.0, 1.5, 10)
    assert settings(beam=2) == (2, 1.0, 1.5, 10)
    (tmp_path / "recipe.yaml").write_text("translate:\n  beam: many\n")
    with pytest.raises(ConfigError, match="translate.beam='many'.*--beam"):
        settings()
    for bad, flag in (("beam: 2.9", "--beam"), ("length_penalty: -1", "--length-penalty"),
                      ("max_len_b: 3.7", "--max-len-b")):  # named as the recipe's, never truncated
        (tmp_path / "recipe.yaml").write_text(f"translate:\n  {bad}\n")
        with pytest.raises(ConfigError, match=f"recipe.yaml: translate.{bad.split(':')[0]}=.*pass {flag}"):
            settings()
    (tmp_path / "recipe.yaml").write_text("translate:\n  beam: 3.0\n")
    assert settings()[0] == 3
