"""Before the first step, ``finetune`` and ``distill`` print one stderr line saying what
``--max-train-samples`` counted, how many training items that became and how many optimizer steps follow —
NER packs sentences into fewer windows (issue #27: 1,000 sentences gave 10 steps, unannounced).

Independent truth: files whose packing is worked out by hand (every word one subword), and the steps the run
actually logged in metrics.jsonl.
"""
from __future__ import annotations

import re

import pytest

from bertforge.cli import main
from helpers import read_metrics, sentences, write_tsv

WORDS5 = ["good", "film", "the", "plot", "was"]  # five words, each one WordPiece of the tiny vocabulary


def _plan_line(err: str, verb: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith(f"bertforge {verb}: ") and "optimizer step" in ln]
    assert len(lines) == 1, err
    return lines[0]


def _conll(path, docs: int, per_doc: int):
    """``docs`` documents of ``per_doc`` five-word sentences; tags B-PER on "film", O elsewhere."""
    out = []
    for _ in range(docs):
        out.append("-DOCSTART- O\n\n")
        for _ in range(per_doc):
            out.append("".join(f"{w} {'B-PER' if w == 'film' else 'O'}\n" for w in WORDS5) + "\n")
    path.write_text("".join(out), encoding="utf-8")
    return path


def test_ner_line_counts_sentences_then_packed_windows_and_steps(workspace, tmp_path, capsys):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(workspace.tiny / "tokenizer.json"))
    assert all(len(tok.encode(w, add_special_tokens=False).ids) == 1 for w in WORDS5)  # the premise
    train = _conll(tmp_path / "train.conll", docs=4, per_doc=10)
    # max_seq_len 32 → 30 subwords of room per window ([CLS], [SEP]) → 6 five-word sentences per window.
    # The first 25 sentences: documents 1 and 2 (10 sentences each → windows of 6 + 4) and 5 sentences of
    # document 3 (one window): 5 windows. Batch 2 → 5 // 2 = 2 steps per epoch (the odd window is dropped).
    capsys.readouterr()
    assert main(["finetune", "--model", str(workspace.tiny), "--task", "ner", "--train", str(train),
                 "--out", str(tmp_path / "run"), "--max-train-samples", "25", "--batch-size", "2",
                 "--epochs", "2", "--max-seq-len", "32", "--no-progress"]) == 0
    line = _plan_line(capsys.readouterr().err, "finetune")
    assert line == ("bertforge finetune: 25 sentences → 5 windows of ≤32 tokens; 4 optimizer steps "
                    "(batch 2, 2 epochs of 2 steps)"), line
    assert max(r["step"] for r in read_metrics(tmp_path / "run")) == 4  # what ran is what was announced


def test_classification_line_counts_rows_and_fractional_epochs(workspace, tmp_path, capsys):
    capsys.readouterr()
    assert main(["finetune", "--model", str(workspace.tiny), "--task", "sst2", "--train", str(workspace.train),
                 "--out", str(tmp_path / "run"), "--max-train-samples", "20", "--batch-size", "4",
                 "--max-steps", "3", "--max-seq-len", "32", "--no-progress"]) == 0
    line = _plan_line(capsys.readouterr().err, "finetune")
    # 20 rows of the 24 read; 20 // 4 = 5 steps per epoch; 3 steps = 0.6 epoch
    assert line == ("bertforge finetune: 20 examples of ≤32 tokens; 3 optimizer steps (batch 4, 0.6 epochs of "
                    "5 steps)"), line


def test_distill_task_stage_prints_its_line(workspace, tmp_path, capsys):
    train = write_tsv(tmp_path / "train.tsv", sentences(30, 5))
    capsys.readouterr()
    assert main(["distill", "--teacher", str(workspace.run), "--student", "layers:0", "--task", "sst2",
                 "--train", str(train), "--out", str(tmp_path / "student"), "--max-train-samples", "12",
                 "--batch-size", "4", "--epochs", "1", "--no-progress", "--no-cache"]) == 0
    line = _plan_line(capsys.readouterr().err, "distill")
    # the teacher was fine-tuned at max_seq_len 32, which distill takes over; 12 // 4 = 3 steps
    assert line == ("bertforge distill: 12 examples of ≤32 tokens; 3 optimizer steps (batch 4, 1 epoch of "
                    "3 steps)"), line


@pytest.mark.parametrize("verb", ["finetune", "distill"])
def test_help_says_what_max_train_samples_counts(verb, capsys):
    with pytest.raises(SystemExit) as e:
        main([verb, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    m = re.search(r"^  --max-train-samples N\s(.*?)^  -", out, re.S | re.M)  # up to the next option
    assert m, out
    said = " ".join(m.group(1).split())
    assert "sentences" in said and "windows" in said and "questions" in said, said
