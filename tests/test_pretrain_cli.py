"""`bertforge pretrain` end to end on a small slice of real text (WikiText-2 + Gutenberg).

Every objective runs a few steps through the one Trainer and writes an HF checkpoint dir that
``transformers`` loads with the right class (ELECTRA: discriminator + generator/); per-term losses and
accuracies land in metrics.jsonl. One short run must actually learn (loss falls, held-out masked-token
accuracy above the unigram baseline).
"""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
import yaml

from bertforge.cli import main

from helpers import sentences

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
HF = {"bert": ("BertForPreTraining", ["mlm_loss", "mlm_acc", "nsp_loss", "nsp_acc"]),
      "roberta": ("RobertaForMaskedLM", ["mlm_loss", "mlm_acc"]),
      "albert": ("AlbertForPreTraining", ["mlm_loss", "sop_loss", "sop_acc"]),
      "electra": ("ElectraForPreTraining", ["mlm_loss", "mlm_acc", "rtd_loss", "rtd_acc", "replaced"]),
      "spanbert": ("BertForMaskedLM", ["mlm_loss", "sbo_loss", "sbo_acc"])}
TINY = ["model.hidden_size=32", "model.num_attention_heads=2", "model.intermediate_size=64",
        "model.embedding_size=16", "train.log_every=1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    src = [DATA / "wikitext-2-raw" / "wiki.valid.raw", DATA / "gutenberg" / "austen-persuasion.txt"]
    if not all(p.is_file() for p in src):
        pytest.skip("shared/data not available")
    d = tmp_path_factory.mktemp("corpus")
    files = []
    for p, n in zip(src, (900, 1500)):
        lines = p.read_text(encoding="utf-8").splitlines()[:n]
        f = d / p.name
        f.write_text("\n".join(lines) + "\n", encoding="utf-8")
        files.append(str(f))
    return files, str(d / "cache")


def _run(args):
    return main(["pretrain", *args, "--no-progress"])


@pytest.mark.parametrize("objective", list(HF))
def test_each_objective_runs_and_saves_hf_dirs(corpus, tmp_path, objective):
    files, cache = corpus
    out = tmp_path / objective
    rc = _run(["--objective", objective, "--corpus", *files, "--out", str(out), "--vocab-size", "600",
               "--max-seq-len", "48", "--max-steps", "3", "--batch-size", "8", "--cache-dir", cache,
               *(["--dupe-factor", "2"] if objective == "bert" else []),  # static masking only
               "train.eval_every=3", *TINY])
    assert rc == 0
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if "loss" in r]
    assert len(train) == 3
    cls_name, terms = HF[objective]
    for k in terms:
        assert k in train[-1], k
    ev = [r["eval"] for r in recs if "eval" in r][-1]
    assert 0.0 <= ev["mlm_acc"] <= 1.0 and "unigram_acc" in ev
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == [cls_name]
    model = getattr(transformers, cls_name).from_pretrained(out)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    enc = tok("the house was quiet .", return_tensors="pt")
    with torch.no_grad():
        model(**enc)
    # each paper's optimizer constants (OBJECTIVE_TRAIN) reach the run's recipe and its optimizer;
    # RoBERTa's LayerNorm ε is fairseq's 1e-5
    want = {"bert": ([0.9, 0.999], 1e-6), "roberta": ([0.9, 0.98], 1e-6), "electra": ([0.9, 0.999], 1e-6),
            "albert": ([0.9, 0.999], 1e-8), "spanbert": ([0.9, 0.999], 1e-8)}[objective]
    saved_recipe = yaml.safe_load((out / "recipe.yaml").read_text())
    train_cfg = saved_recipe["train"]
    # the recorded recipe describes the model: E only where the family factorises it (ALBERT, ELECTRA)
    assert saved_recipe["model"].get("embedding_size") == (16 if objective in ("albert", "electra") else None)
    assert (list(train_cfg["adam_betas"]), train_cfg["adam_eps"]) == want
    step_dirs = sorted((out / "checkpoints").glob("step-*"))
    group = torch.load(step_dirs[-1] / "optimizer.pt", weights_only=True)["param_groups"][0]
    assert (list(group["betas"]), group["eps"]) == want
    assert model.config.layer_norm_eps == (1e-5 if objective == "roberta" else 1e-12)
    if objective == "electra":
        gen = transformers.ElectraForMaskedLM.from_pretrained(out / "generator")
        assert gen.config.hidden_size == max(16, model.config.hidden_size // 4)  # ¼ (at least 16)
        assert gen.config.embedding_size == model.config.embedding_size == 16


def test_short_run_learns(corpus, tmp_path):
    """A short real run: the training loss falls and the model beats chance on held-out text (the
    few-hundred-step criterion vs the unigram baseline is benchmarks/pretrain_quality.py)."""
    files, cache = corpus
    out = tmp_path / "roberta"
    rc = _run(["--objective", "roberta", "--corpus", *files, "--out", str(out), "--vocab-size", "600",
               "--max-seq-len", "32", "--max-steps", "40", "--batch-size", "8", "--lr", "3e-3",
               "--cache-dir", cache, "train.eval_every=40", "train.dropout_off=true", *TINY])
    assert rc == 0
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in recs if "loss" in r]
    first, last = sum(train[:5]) / 5, sum(train[-5:]) / 5
    assert last < 0.93 * first, (first, last)  # the loss falls (6.4 → 5.8 here; ≥30% needs more steps)
    ev = [r["eval"] for r in recs if "eval" in r][-1]
    assert ev["masked_tokens"] > 100
    assert ev["mlm_acc"] > 5 / 600  # far above chance (1/V)
    assert ev["mlm_loss"] < 0.95 * np.log(600)  # held-out loss below the uniform ln V


def test_errors_are_one_line(corpus, tmp_path, capsys):
    files, cache = corpus
    rc = _run(["--objective", "bert", "--corpus", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o"),
               "--cache-dir", cache])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.txt" in err[0]
    rc = _run(["--objective", "bert", "--corpus", *files, "--out", str(tmp_path / "o2"), "--cache-dir", cache,
               "pretrain.nonsense=1"])
    assert rc == 2
    assert "pretrain.nonsense" in capsys.readouterr().err
    # byte-level BPE below its 256 byte symbols + specials: refused before training, even when an earlier
    # version cached an oversized tokenizer under that size, and nothing is written
    out = tmp_path / "o3"
    rc = _run(["--objective", "roberta", "--corpus", *files, "--out", str(out), "--cache-dir", cache,
               "--vocab-size", "100"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["bertforge: error: --vocab-size 100 is too small for a bpe tokenizer; use at "
                               "least 261 (its 256 byte symbols + 5 special tokens)"]
    assert not out.exists()
    # a flag and an override of the same key must agree (the flag won silently)
    rc = _run(["--objective", "bert", "--corpus", *files, "--out", str(tmp_path / "o4"), "--cache-dir", cache,
               "--vocab-size", "500", "pretrain.vocab_size=600"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["bertforge: error: --vocab-size 500 conflicts with pretrain.vocab_size=600; pass "
                               "one of them"]


def test_an_empty_held_out_split_is_said(corpus, tmp_path, capsys):
    """With the small/base recipes' eval_fraction on a small corpus no document gives up a sentence: the run
    has no held-out evaluation ("best": null), and says so."""
    files, cache = corpus
    rc = _run(["--objective", "roberta", "--corpus", *files, "--out", str(tmp_path / "o"), "--cache-dir", cache,
               "--vocab-size", "600", "--max-steps", "1", "pretrain.eval_fraction=0.0001", *TINY])
    assert rc == 0
    assert "note: the run had no held-out evaluation: pretrain.eval_fraction 0.0001 holds out no sentence" in \
        capsys.readouterr().err


def test_objective_optimizer_constants_yield_to_recipe_and_flags(tmp_path):
    """OBJECTIVE_TRAIN sits between --size and the recipe: an override or a recipe file wins."""
    from bertforge.cli import build_parser
    from bertforge.pipelines.pretrain import build_pretrain_recipe

    def recipe(*extra):
        args = build_parser().parse_args(["pretrain", "--objective", "roberta", "--corpus", "x.txt",
                                          "--out", str(tmp_path / "o"), *extra])
        return build_pretrain_recipe(args).train
    assert (tuple(recipe().adam_betas), recipe().adam_eps) == ((0.9, 0.98), 1e-6)
    assert recipe("train.adam_eps=1e-8").adam_eps == 1e-8
    f = tmp_path / "r.yaml"
    f.write_text("train:\n  adam_betas: [0.9, 0.999]\n")
    got = recipe("--recipe", str(f))
    assert (tuple(got.adam_betas), got.adam_eps) == ((0.9, 0.999), 1e-6)


def test_a_corpus_file_given_twice_is_refused(tmp_path, cli_error):
    f = tmp_path / "c.txt"
    f.write_text("\n".join(s for s, _ in sentences(50)) + "\n")
    line = cli_error(["pretrain", "--objective", "bert", "--corpus", f, str(tmp_path / "." / "c.txt"),
                      "--out", tmp_path / "run", "--max-steps", 1], tmp_path / "run")
    assert "lists" in line and "twice" in line


def test_dynamic_masking_serves_each_sequence_once_per_epoch(tmp_path, capsys):
    """BERT's static masking copies the data (dupe_factor 10); with --masking dynamic the default is one
    copy, as for RoBERTa."""
    import shutil
    docs = tmp_path / "docs.txt"
    docs.write_text("\n\n".join(" ".join(s.capitalize() + "." for s, _ in sentences(4, i)) for i in range(6)) + "\n")
    sizes = {}
    for name, flags in (("static", ()), ("static-once", ("--dupe-factor", 1)), ("dynamic", ("--masking", "dynamic"))):
        out = tmp_path / f"pt-{name}"
        assert main([str(a) for a in ["pretrain", "--objective", "bert", "--corpus", docs, "--out", out, "--size",
                                      "tiny", "--max-steps", 1, "--vocab-size", 120, "--cache-dir", tmp_path / "cache",
                                      "--no-progress", *flags, "--doc-sep", "blank", "--batch-size", 1]]) == 0
        sizes[name] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["train_sequences"]
        shutil.rmtree(out)
    # the ten static copies draw their own pairs and lengths, so they hold about, not exactly, 10× as many
    assert sizes["dynamic"] == sizes["static-once"] > 0 and sizes["static"] > 5 * sizes["dynamic"]
