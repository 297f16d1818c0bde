"""`translate train` length limits and vocabulary size: a length limit that drops every pair says so and
names the key to raise (not "the training set is empty"); a vocab size below what the tokenizer needs is
refused with the minimum (for BPE and Unigram alike)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bertforge.cli import main
from bertforge.data.translation import min_vocab_size, train_joint_tokenizer
from bertforge.errors import ConfigError

WORDS = ["cat", "dog", "man", "runs", "sits", "red", "big", "park", "ball", "eats"]
TINY = ["model.d_model=16", "model.ffn_dim=32", "model.encoder_layers=1", "model.decoder_layers=1",
        "model.num_heads=2", "translate.eval_bleu_sentences=0", "impl.dtype=float32", "impl.threads=1"]


def _pairs(n, lo, hi, seed):
    rng = random.Random(seed)
    src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))) + "." for _ in range(n)]
    return src, [s.upper() for s in src]


def _files(d: Path, train=(40, 3, 6), valid=(8, 3, 6)) -> dict:
    out = {}
    for split, spec in (("train", train), ("val", valid)):
        s, t = _pairs(*spec, seed=len(split))
        for side, lines in (("en", s), ("de", t)):
            p = d / f"{split}.{side}"
            p.write_text("\n".join(lines) + "\n", encoding="utf-8")
            out[f"{split}.{side}"] = str(p)
    return out


def _train(f: dict, out: Path, *extra) -> int:
    return main(["translate", "train", "--src", f["train.en"], "--tgt", f["train.de"], "--valid-src",
                 f["val.en"], "--valid-tgt", f["val.de"], "--out", str(out), "--no-progress", *TINY, *extra])


@pytest.mark.parametrize("override,key", [("translate.max_len=2", "translate.max_len (now 2)"),
                                          ("model.max_positions=3", "model.max_positions (now 3")])
def test_every_pair_dropped_for_length_names_the_limit(tmp_path, capsys, override, key):
    f = _files(tmp_path)
    assert _train(f, tmp_path / "run", override) == 2
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert line.startswith("bertforge: error: all 40 sentence pairs of --src/--tgt are longer than 2 tokens")
    assert key in line and "empty" not in err
    assert not (tmp_path / "run").exists()  # nothing left behind


def test_validation_pairs_all_too_long_is_one_line(tmp_path, capsys):
    # training pairs fit in max_positions − 1 = 7 tokens, every validation pair is far longer: refused before
    # training instead of a division by zero at the first evaluation
    f = _files(tmp_path, train=(40, 1, 1), valid=(8, 20, 25))
    assert _train(f, tmp_path / "run", "model.max_positions=8", "--max-steps", "1") == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("bertforge: error: all 8 sentence pairs of --valid-src/--valid-tgt are longer "
                           "than 7 tokens") and "model.max_positions (now 8)" in line


def test_some_pairs_dropped_still_trains(tmp_path, capsys):
    f = _files(tmp_path, train=(40, 1, 12))
    assert _train(f, tmp_path / "run", "translate.max_len=8", "--max-steps", "1") == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["step"] == 1


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_vocab_size_below_the_tokenizer_minimum_is_refused(tmp_path, capsys, kind):
    f = _files(tmp_path)
    texts = [ln for p in (f["train.en"], f["train.de"]) for ln in Path(p).read_text().splitlines()]
    need = min_vocab_size(texts, kind)
    # the minimum is exact: it works, and one less is refused (a ConfigError for both kinds: not BPE quietly
    # returning `need` tokens, nor Unigram's bare "The vocabulary is not large enough to contain all chars")
    assert train_joint_tokenizer(texts, need, kind).get_vocab_size() <= need
    with pytest.raises(ConfigError, match=f"at least {need} "):
        train_joint_tokenizer(texts, need - 1, kind)
    assert _train(f, tmp_path / "run", "translate.vocab_size=10", f"translate.tokenizer={kind}") == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (f"bertforge: error: translate.vocab_size=10 is too small for these files: the {kind} "
                    f"tokenizer needs at least {need} (one token per distinct character + 4 special "
                    f"tokens); use translate.vocab_size={need} or more")
    assert not (tmp_path / "run").exists()
