"""End to end through the CLI: `finetune` from the real MiniLM checkpoint, then `evaluate` / `predict`.

The SST-2 run is the one real end-to-end run of the spine (small: ~1k sentences); the STS-B and QNLI
runs take a few steps only, to show that regression and sentence pairs go through.
"""
import json

import numpy as np
import pytest
import torch
import transformers as T

from bertforge.cli import main


def _run(capsys, argv):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_sst2_finetune_evaluate_predict(tmp_path, capsys, minilm_dir, data_dir):
    sst = data_dir / "glue/SST-2"
    out = tmp_path / "sst2"
    rc, stdout, err = _run(capsys, [
        "finetune", "--model", "minilm", "--task", "sst2", "--train", str(sst / "train.tsv"),
        "--eval", str(sst / "dev.tsv"), "--out", str(out), "--epochs", "1", "--batch-size", "32",
        "--lr", "1e-4", "--max-seq-len", "48", "--max-train-samples", "1280", "--no-progress",
        "data.max_eval_samples=300", "model.pooling=pooler"])  # the [CLS] pooler: transformers' head (below)
    assert rc == 0, err
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["step"] == 40
    # 40 steps from a sentence-embedding checkpoint: clearly above the 50% majority baseline
    assert result["accuracy"] > 0.75
    for f in ("config.json", "model.safetensors", "tokenizer.json", "recipe.yaml", "metrics.jsonl"):
        assert (out / f).is_file(), f
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("loss" in r for r in logged) and any("eval" in r for r in logged)

    rc, stdout, err = _run(capsys, ["evaluate", "--model", str(out), "--data", str(sst / "dev.tsv"),
                                    "--max-samples", "300"])
    assert rc == 0, err
    metrics = json.loads(stdout)
    assert metrics["task"] == "sst2" and metrics["n"] == 300
    assert metrics["accuracy"] == pytest.approx(result["best"], abs=1e-9)

    # the saved dir is a transformers checkpoint: same logits from AutoModelForSequenceClassification
    ref = T.AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
    from bertforge.checkpoint import load_pretrained
    ours = load_pretrained(out).eval()
    ids = torch.tensor([[101, 2023, 3185, 2003, 2307, 102]])
    with torch.no_grad():
        assert (ours(ids).logits - ref(input_ids=ids).logits).abs().max() < 1e-5

    pred_file = tmp_path / "pred.jsonl"
    rc, stdout, err = _run(capsys, ["predict", "--model", str(out), "--data", str(sst / "test.tsv"),
                                    "--out", str(pred_file)])
    assert rc == 0, err
    preds = [json.loads(line) for line in pred_file.read_text().splitlines()]
    assert len(preds) == 1821 and {p["label"] for p in preds} <= {"0", "1"}
    # an existing --out is replaced only with --overwrite (here by the predictions on the first 20 rows)
    few = tmp_path / "few.tsv"
    few.write_text("".join((sst / "test.tsv").read_text().splitlines(keepends=True)[:21]))
    argv = ["predict", "--model", str(out), "--data", str(few), "--out", str(pred_file)]
    rc, _, err = _run(capsys, argv)
    assert rc == 2 and "--overwrite" in err and len(pred_file.read_text().splitlines()) == 1821
    rc, _, err = _run(capsys, argv + ["--overwrite"])
    assert rc == 0, err
    assert [json.loads(x)["label"] for x in pred_file.read_text().splitlines()] == [p["label"] for p in preds[:20]]


def test_stsb_regression_reports_pearson_spearman(tmp_path, capsys, minilm_dir, data_dir):
    sts = data_dir / "glue/STS-B"
    lines = (sts / "dev.tsv").read_text(encoding="utf-8").splitlines()
    (tmp_path / "dev200.tsv").write_text("\n".join(lines[:201]) + "\n", encoding="utf-8")
    out = tmp_path / "stsb"
    rc, stdout, err = _run(capsys, [
        "finetune", "--model", "minilm", "--task", "stsb", "--train", str(sts / "train.tsv"),
        "--eval", str(tmp_path / "dev200.tsv"), "--out", str(out), "--max-steps", "8",
        "--batch-size", "16", "--lr", "1e-4", "--max-seq-len", "64", "--no-progress"])
    assert rc == 0, err
    result = json.loads(stdout.strip().splitlines()[-1])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["problem_type"] == "regression" and len(cfg["id2label"]) == 1
    # the reported correlations equal Pearson / Spearman computed by hand from the predictions
    rc, stdout, err = _run(capsys, ["predict", "--model", str(out), "--data", str(tmp_path / "dev200.tsv"),
                                    "--out", str(tmp_path / "p.jsonl")])
    assert rc == 0, err
    pred = np.array([json.loads(x)["score"] for x in (tmp_path / "p.jsonl").read_text().splitlines()])
    gold = np.array([float(x.split("\t")[-1]) for x in lines[1:201]])
    pm, gm = pred - pred.mean(), gold - gold.mean()
    assert result["pearson"] == pytest.approx(pm @ gm / np.sqrt((pm @ pm) * (gm @ gm)), abs=1e-6)
    rank = lambda v: np.argsort(np.argsort(v, kind="stable"), kind="stable").astype(float)  # noqa: E731
    rp, rg = rank(pred) - rank(pred).mean(), rank(gold) - rank(gold).mean()
    # ties in the gold scores get average ranks in Spearman; compare loosely against ordinal ranks
    assert result["spearman"] == pytest.approx(rp @ rg / np.sqrt((rp @ rp) * (rg @ rg)), abs=0.02)


def test_qnli_sentence_pairs(tmp_path, capsys, minilm_dir, data_dir):
    # QNLI ships only dev here: train on its first rows, evaluate on later ones
    lines = (data_dir / "glue/QNLI/dev.tsv").read_text(encoding="utf-8").splitlines()
    (tmp_path / "train.tsv").write_text("\n".join(lines[:257]) + "\n", encoding="utf-8")
    (tmp_path / "eval.tsv").write_text("\n".join([lines[0]] + lines[4000:4200]) + "\n", encoding="utf-8")
    from bertforge.tasks import adapter_for, get_task
    from bertforge.tokenizer import load_tokenizer
    tok = load_tokenizer(minilm_dir)
    enc = adapter_for(get_task("qnli"), tok, 128).load(tmp_path / "train.tsv")
    first = enc[0]
    sep = tok.token_to_id("[SEP]")
    assert first["input_ids"].count(sep) == 2 and set(first["token_type_ids"]) == {0, 1}
    # segment B starts right after the first [SEP]
    assert first["token_type_ids"].index(1) == first["input_ids"].index(sep) + 1
    rc, stdout, err = _run(capsys, [
        "finetune", "--model", "minilm", "--task", "qnli", "--train", str(tmp_path / "train.tsv"),
        "--eval", str(tmp_path / "eval.tsv"), "--out", str(tmp_path / "qnli"), "--max-steps", "8",
        "--batch-size", "32", "--max-seq-len", "128", "--no-progress"])
    assert rc == 0, err
    assert 0.0 <= json.loads(stdout.strip().splitlines()[-1])["accuracy"] <= 1.0


def test_custom_task_model_evaluates_predicts_and_distills_without_its_column_flags(tmp_path, capsys):
    """A `--task custom` run keeps its columns and labels in config.json; evaluate, predict and a distilled
    student use them without the data.* flags. Truth: evaluate's accuracy equals the predictions scored by
    hand against the file's labels."""
    from helpers import make_tiny_checkpoint, sentences
    tiny = make_tiny_checkpoint(tmp_path / "tiny")
    rows = sentences(48, 2)
    data = tmp_path / "reviews.csv"
    data.write_text("label,review\n" + "".join(f"{'pos' if int(y) else 'neg'},{s}\n" for s, y in rows))
    flags = ["data.text_columns=[review]", "data.label_column=label", "data.labels=[neg,pos]"]
    out = tmp_path / "custom"
    rc, _, err = _run(capsys, ["finetune", "--model", str(tiny), "--task", "custom", "--train", str(data),
                               "--out", str(out), "--max-steps", "6", "--batch-size", "8", "--lr", "3e-3",
                               "--max-seq-len", "32", "--no-progress", *flags])
    assert rc == 0, err
    rc, stdout, err = _run(capsys, ["evaluate", "--model", str(out), "--data", str(data)])
    assert rc == 0, err
    metrics = json.loads(stdout.strip().splitlines()[-1])
    assert metrics["task"] == "custom" and metrics["n"] == 48
    preds = tmp_path / "preds.jsonl"
    rc, _, err = _run(capsys, ["predict", "--model", str(out), "--data", str(data), "--out", str(preds)])
    assert rc == 0, err
    got = [json.loads(line)["label"] for line in preds.read_text().splitlines()]
    gold = ["pos" if int(y) else "neg" for _, y in rows]
    assert metrics["accuracy"] == pytest.approx(np.mean([g == p for g, p in zip(gold, got)]))
    student = tmp_path / "student"
    rc, _, err = _run(capsys, ["distill", "--teacher", str(out), "--student", "layers:0", "--train", str(data),
                               "--out", str(student), "--max-steps", "2", "--batch-size", "8", "--no-progress"])
    assert rc == 0, err
    rc, stdout, err = _run(capsys, ["evaluate", "--model", str(student), "--data", str(data)])
    assert rc == 0, err
    assert json.loads(stdout.strip().splitlines()[-1])["task"] == "custom"
