"""`bertforge <verb> --recipe RUN/recipe.yaml --out NEW`, from another working directory and with no other
flag, repeats a run bit for bit (same machine, same seed): `finetune`, `distill` and `pretrain` runs started
with relative paths are re-run from a sibling directory and give the same metrics.jsonl (timings aside)
and the same weights. The truth is the original run. A recorded input that moved or changed is refused
in one line naming it; recipes without the `sources` section still load. Also (issue #27, item 8):
`--resume` prints no "initialised fresh" note, and continuing from a custom-task run needs no `--task`.
"""
import contextlib
import json
from pathlib import Path

import pytest
import yaml

from bertforge.cli import main

from helpers import load_weights, make_tiny_checkpoint, read_metrics, sentences, write_tsv

#: metrics.jsonl fields that measure speed, not results
TIMING = {"elapsed_s", "cpu_s", "examples_per_s", "tokens_per_s"}
PRETRAIN_TINY = ["model.hidden_size=32", "model.num_attention_heads=2", "model.intermediate_size=64",
                 "model.num_hidden_layers=2", "train.log_every=1", "train.eval_every=3", "pretrain.eval_fraction=0.2"]


def _results(run_dir: Path) -> list:
    return [{k: v for k, v in rec.items() if k not in TIMING} for rec in read_metrics(run_dir)]


def _same_weights(a: Path, b: Path) -> None:
    wa, wb = load_weights(a / "model.safetensors"), load_weights(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert wa[k].dtype == wb[k].dtype and bool((wa[k] == wb[k]).all()), k


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``a``: the folder the original runs were started in, with relative paths — ``tiny`` (a checkpoint),
    ``train.tsv``, ``dev.tsv``, ``corpus.txt`` and the runs ``ft`` (finetune), ``kd`` (distill of ``ft``)
    and ``pt`` (pretrain); ``b``: a sibling folder to re-run them from; ``cache``: the pretraining cache
    (``$BERTFORGE_CACHE`` of every run)."""
    root = tmp_path_factory.mktemp("rerun")
    a, b = root / "a", root / "b"
    a.mkdir()
    b.mkdir()
    make_tiny_checkpoint(a / "tiny")
    write_tsv(a / "train.tsv", sentences(24, 1))
    write_tsv(a / "dev.tsv", sentences(12, 2))
    docs = ["\n".join(s for s, _ in sentences(10, seed)) for seed in range(40)]  # 40 documents of 10 lines
    (a / "corpus.txt").write_text("\n\n".join(docs) + "\n")
    mp = pytest.MonkeyPatch()
    mp.setenv("BERTFORGE_CACHE", str(root / "cache"))
    with contextlib.chdir(a):
        assert main(["finetune", "--model", "tiny", "--task", "sst2", "--train", "train.tsv", "--eval", "dev.tsv",
                     "--out", "ft", "--max-steps", "4", "--batch-size", "8", "--max-seq-len", "32",
                     "train.log_every=1", "train.eval_every=2"]) == 0
        assert main(["distill", "--teacher", "ft", "--student", "layers:0", "--train", "train.tsv", "--eval",
                     "dev.tsv", "--out", "kd", "--max-steps", "4", "--batch-size", "8", "--temperature", "2",
                     "train.log_every=1", "train.eval_every=2"]) == 0
        assert main(["pretrain", "--objective", "roberta", "--corpus", "corpus.txt", "--out", "pt",
                     "--vocab-size", "300", "--max-seq-len", "24", "--max-steps", "3", "--batch-size", "4",
                     *PRETRAIN_TINY]) == 0
    yield root, a, b
    mp.undo()


def _rerun(verb: str, run: Path, out: Path) -> None:
    """Re-run ``run`` from its recipe alone in ``out``'s folder (another working directory)."""
    with contextlib.chdir(out.parent):
        assert main([verb, "--recipe", str(run / "recipe.yaml"), "--out", out.name]) == 0
    assert (out / "metrics.jsonl").is_file()


@pytest.mark.parametrize("verb, name", [("finetune", "ft"), ("distill", "kd"), ("pretrain", "pt")])
def test_recipe_alone_reruns_the_run_bit_for_bit_from_another_directory(runs, capsys, verb, name):
    root, a, b = runs
    run, again = a / name, b / name
    saved = yaml.safe_load((run / "recipe.yaml").read_text())
    # what the run read is recorded resolved, with fingerprints
    src = saved["sources"]
    first = {"finetune": "--model", "distill": "--teacher", "pretrain": "--corpus"}[verb]
    assert Path(src[first]["path"]).is_absolute() and len(src[first]["sha256"]) == 64
    if verb == "pretrain":
        assert saved["data"]["corpus"] == [str(a / "corpus.txt")]
        assert src["--corpus"]["bytes"] == (a / "corpus.txt").stat().st_size
    else:
        assert saved["data"]["train"] == str(a / "train.tsv") and saved["data"]["eval"] == str(a / "dev.tsv")
        assert src["--train"]["bytes"] == (a / "train.tsv").stat().st_size
    _rerun(verb, run, again)
    capsys.readouterr()
    assert _results(again) == _results(run)
    assert any("eval" in r for r in _results(run))  # the evaluations are compared too
    _same_weights(run, again)
    assert yaml.safe_load((again / "recipe.yaml").read_text()) == saved  # and it records the same run


def test_translate_train_reruns_from_its_recipe_alone(tmp_path, capsys, cli_error):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    pairs = [(s, " ".join(w[::-1] for w in s.split())) for s, _ in sentences(160, 5)]  # a toy "language"
    for name, rows in (("train", pairs[:140]), ("val", pairs[140:])):
        (a / f"{name}.en").write_text("".join(s + "\n" for s, _ in rows))
        (a / f"{name}.xx").write_text("".join(t + "\n" for _, t in rows))
    with contextlib.chdir(a):
        assert main(["translate", "train", "--src", "train.en", "--tgt", "train.xx", "--valid-src", "val.en",
                     "--valid-tgt", "val.xx", "--out", "mt", "--max-steps", "3", "--max-tokens", "300",
                     "model.d_model=32", "model.ffn_dim=64", "model.encoder_layers=1", "model.decoder_layers=1",
                     "model.num_heads=2", "translate.vocab_size=80", "train.eval_every=3", "train.log_every=1",
                     "translate.eval_bleu_sentences=5"]) == 0
    saved = yaml.safe_load((a / "mt" / "recipe.yaml").read_text())
    assert saved["translate"]["valid_tgt"] == str(a / "val.xx")
    assert saved["sources"]["--src"]["bytes"] == (a / "train.en").stat().st_size
    with contextlib.chdir(b):
        assert main(["translate", "train", "--recipe", str(a / "mt" / "recipe.yaml"), "--out", "mt"]) == 0
    capsys.readouterr()
    assert _results(b / "mt") == _results(a / "mt") and any("eval" in r for r in _results(a / "mt"))
    _same_weights(a / "mt", b / "mt")
    assert yaml.safe_load((b / "mt" / "recipe.yaml").read_text()) == saved
    with _moved(a / "val.xx"):
        line = cli_error(["translate", "train", "--recipe", a / "mt" / "recipe.yaml", "--out", b / "mt2"], a / "mt")
    assert f"--valid-tgt {a / 'val.xx'}" in line and "no longer exists" in line


@contextlib.contextmanager
def _moved(path: Path):
    away = path.with_name(path.name + ".away")
    path.rename(away)
    try:
        yield
    finally:
        away.rename(path)


@contextlib.contextmanager
def _changed(path: Path, data: bytes):
    before = path.read_bytes()
    path.write_bytes(data)
    try:
        yield
    finally:
        path.write_bytes(before)


def test_a_moved_or_changed_input_is_named_in_one_line(runs, cli_error):
    root, a, b = runs
    ft = a / "ft"
    argv = ["finetune", "--recipe", ft / "recipe.yaml", "--out", b / "refused"]
    with _moved(a / "train.tsv"):
        line = cli_error(argv, ft)
    assert f"--train {a / 'train.tsv'}" in line and "no longer exists" in line
    with _moved(a / "tiny"):
        line = cli_error(argv, ft)
    assert f"--model {a / 'tiny'}" in line and "no longer exists" in line
    dev = (a / "dev.tsv").read_bytes()
    with _changed(a / "dev.tsv", dev + b"one more row\t1\n"):
        line = cli_error(argv, ft)
    assert f"--eval {a / 'dev.tsv'} has changed" in line and f"{len(dev)} → {len(dev) + 15} bytes" in line
    with _changed(a / "dev.tsv", dev.replace(b"label", b"lAbel")):  # same size, other bytes
        line = cli_error(argv, ft)
    assert "--eval" in line and "same size" in line
    cfg = (a / "tiny" / "config.json").read_bytes()
    with _changed(a / "tiny" / "config.json", cfg.replace(b"0.1", b"0.2")):
        line = cli_error(argv, ft)
    assert f"--model {a / 'tiny'} has changed" in line
    with _moved(a / "ft"):  # distill: a moved teacher
        line = cli_error(["distill", "--recipe", a / "kd" / "recipe.yaml", "--out", b / "refused"], a / "kd")
    assert f"--teacher {a / 'ft'}" in line and "no longer exists" in line
    with _moved(a / "corpus.txt"):  # pretrain: a moved corpus file
        line = cli_error(["pretrain", "--recipe", a / "pt" / "recipe.yaml", "--out", b / "refused"], a / "pt")
    assert f"--corpus {a / 'corpus.txt'}" in line and "no longer exists" in line


def test_a_flag_given_with_the_recipe_is_used_without_the_check(runs, capsys):
    """``--eval FILE`` on the command line replaces the recipe's (moved) one: the user chose it."""
    root, a, b = runs
    other = write_tsv(b / "other-dev.tsv", sentences(6, 3))
    with _moved(a / "dev.tsv"):
        assert main(["finetune", "--recipe", str(a / "ft" / "recipe.yaml"), "--eval", str(other),
                     "--out", str(b / "ft-other-eval"), "--max-steps", "1"]) == 0
    capsys.readouterr()
    rec = yaml.safe_load((b / "ft-other-eval" / "recipe.yaml").read_text())
    assert rec["data"]["eval"] == str(other) and rec["sources"]["--eval"]["path"] == str(other)


def test_a_recipe_without_sources_still_loads(tmp_path):
    from bertforge.config import load_recipe
    old = tmp_path / "recipe.yaml"
    old.write_text("model: {}\ndata:\n  task: sst2\n  train: train.tsv\n  eval: dev300.tsv\ntrain:\n  lr: 3.0e-05\n")
    r = load_recipe(str(old))
    assert r.sources == {} and r.data.eval == "dev300.tsv" and "sources" not in r.to_dict()
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources:\n  --train: just-a-path.tsv\n")
    from bertforge.errors import ConfigError
    with pytest.raises(ConfigError, match="sources.--train must be a mapping"):
        load_recipe(str(bad))


def test_resume_says_nothing_is_initialised_fresh(runs, tmp_path, capsys):
    root, a, b = runs
    argv = ["finetune", "--model", str(a / "tiny"), "--task", "sst2", "--train", str(a / "train.tsv"),
            "--out", str(tmp_path / "r"), "--batch-size", "8", "--max-seq-len", "32", "train.save_every=1"]
    assert main([*argv, "--max-steps", "1"]) == 0
    assert "sequence_classification head weights not in" in capsys.readouterr().err  # a fresh head: said
    assert main([*argv, "--max-steps", "2", "--resume"]) == 0
    err = capsys.readouterr().err
    assert "fresh" not in err, err
    assert json.loads((tmp_path / "r" / "checkpoints" / "step-2" / "trainer_state.json").read_text())["step"] == 2


def test_continuing_a_custom_task_run_needs_no_task_flag(tmp_path, capsys):
    tiny = make_tiny_checkpoint(tmp_path / "tiny")
    data = tmp_path / "reviews.csv"
    data.write_text("review,stars\n" + "".join(f"{s},{'pos' if y else 'neg'}\n" for s, y in sentences(24, 4)))
    assert main(["finetune", "--model", str(tiny), "--task", "custom", "--train", str(data), "--out",
                 str(tmp_path / "custom"), "--max-steps", "1", "--batch-size", "8", "--max-seq-len", "32",
                 "train.save_every=1", "data.text_columns=[review]", "data.label_column=stars",
                 "data.labels=[neg,pos]"]) == 0
    # --resume without --task (or the column overrides): the run in --out records them
    assert main(["finetune", "--model", str(tiny), "--train", str(data), "--out", str(tmp_path / "custom"),
                 "--max-steps", "2", "--batch-size", "8", "--max-seq-len", "32", "--resume"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["step"] == 2
    # fine-tuning further from the finished run dir (--model RUN), again without --task
    assert main(["finetune", "--model", str(tmp_path / "custom"), "--train", str(data), "--out",
                 str(tmp_path / "more"), "--max-steps", "1", "--batch-size", "8", "--max-seq-len", "32"]) == 0
    err = capsys.readouterr().err
    assert "fresh" not in err, err  # the trained head is continued
    first = json.loads((tmp_path / "custom" / "config.json").read_text())["bertforge"]
    again = json.loads((tmp_path / "more" / "config.json").read_text())["bertforge"]
    assert again["task"] == "custom" and again["task_spec"] == first["task_spec"]
    assert first["task_spec"] == {"text_columns": ["review"], "label_column": "stars", "labels": ["neg", "pos"]}
