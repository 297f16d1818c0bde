"""Refused CLI input: every user mistake across the verbs exits 2 with exactly one clear stderr line
(``bertforge: error: …`` naming the flag, key, file or row and what to change), no traceback, no damaged
earlier output and no half-written ``--out``.

Each case runs ``bertforge.cli.main`` in-process (fast); a few run as real subprocesses to check the exit
status and stderr of a fresh interpreter. Independent truth: the earlier run directory's bytes, hashed
before and after every case (the ``cli_error`` fixture), and hand-built broken files.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import REPO, bertforge_cmd, make_tiny_checkpoint, run, sentences, write_file, write_tsv

pytestmark = pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")

CORES = os.cpu_count() or 1
CTX = "john lives in paris ."


@pytest.fixture(scope="module")
def w(exported_workspace):
    """The shared workspace (``tiny``, ``train``, the earlier ``run``, its ``onnx`` and ``int8`` exports, a
    ``text`` corpus) plus broken inputs: files that are empty, not UTF-8, missing a column, with a label
    outside the set, not JSON; model dirs of another family, without config, with a corrupt graph; a
    finished tiny pretraining run ``pt_run`` with a checkpoint; a dir of the user's own files."""
    from bertforge.cli import main
    ns = SimpleNamespace(**vars(exported_workspace))
    d = ns.d
    ns.empty = d / "empty.tsv"
    ns.empty.write_text("")
    ns.latin1 = d / "latin1.tsv"
    ns.latin1.write_bytes("sentence\tlabel\nun film tr\xe8s good\t1\n".encode("latin-1"))
    ns.nocol = d / "nocol.tsv"
    ns.nocol.write_text("text\tlabel\ngood film\t1\n")
    ns.badlabel = d / "badlabel.tsv"
    ns.badlabel.write_text("sentence\tlabel\ngood film\t1\nbad film\t7\n")
    ns.badjson = d / "bad.jsonl"
    ns.badjson.write_text('{"sentence": "good", "label": 1}\n{"sentence": "bad", label: 0}\n')
    ns.gpt2 = d / "gpt2"
    ns.gpt2.mkdir()
    (ns.gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 32}))
    shutil.copyfile(ns.tiny / "tokenizer.json", ns.gpt2 / "tokenizer.json")
    ns.noconfig = d / "noconfig"
    ns.noconfig.mkdir()
    (ns.noconfig / "model.safetensors").write_bytes(b"")
    ns.badyaml = d / "bad.yaml"
    ns.badyaml.write_text("train: {lr: [1, 2\n")
    ns.corpus_empty = d / "empty.txt"
    ns.corpus_empty.write_text("")
    ns.other_vocab = make_tiny_checkpoint(d / "other_vocab", vocab=80)
    ns.lines3 = d / "three.txt"
    ns.lines3.write_text("a small house\nthe dog runs\nit rains\n")
    ns.lines2 = d / "two.txt"
    ns.lines2.write_text("ein kleines haus\nder hund rennt\n")
    ns.afile = d / "afile"
    ns.afile.write_text("x")
    ns.listcfg = d / "listcfg"
    ns.listcfg.mkdir()
    (ns.listcfg / "config.json").write_text("[1, 2]")
    ns.badonnx = d / "badonnx"
    ns.badonnx.mkdir()
    shutil.copyfile(ns.tiny / "config.json", ns.badonnx / "config.json")
    (ns.badonnx / "model.onnx").write_bytes(bytes(range(256)) * 4)
    ns.squadlist = d / "list.json"
    ns.squadlist.write_text("[1, 2]")
    ns.csv_as_tsv = d / "commas.tsv"
    ns.csv_as_tsv.write_text("sentence,label\ngood film,1\n")
    ns.ner_str = d / "ner_str.jsonl"
    ns.ner_str.write_text(json.dumps({"tokens": "a b", "tags": ["O", "O"]}) + "\n")
    ns.ner_badtag = d / "ner_badtag.jsonl"
    ns.ner_badtag.write_text(json.dumps({"tokens": ["a", "b"], "tags": ["O", "PER"]}) + "\n")
    ns.pt_run = d / "pt_run"  # a finished tiny pretraining run with a checkpoint
    assert main([str(a) for a in _pt(ns, "roberta", "train.save_every=1", "--batch-size", 1, out=ns.pt_run)]) == 0
    ns.binary = d / "binary.txt"
    ns.binary.write_bytes(bytes(range(128, 256)) * 64)
    ns.blank = d / "blank.txt"
    ns.blank.write_text("\n\n   \n")
    ns.notarun = d / "notarun"
    ns.notarun.mkdir()
    (ns.notarun / "notes.txt").write_text("mine")
    ctx = "the cat sat on the mat near the door of the house"
    ns.squad = d / "squad.json"
    answer = {"text": "on the mat", "answer_start": ctx.index("on the mat")}
    qas = [{"id": "q1", "question": "where did the cat sit", "answers": [answer]}]
    ns.squad.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": ctx, "qas": qas}]}]}))
    return ns


def _ft(w, *extra, out=None, train=None, model=None):
    return ["finetune", "--model", model or w.tiny, "--task", "sst2", "--train", train or w.train,
            "--out", out or (w.d / "new"), "--max-steps", 1, "--batch-size", 8, "--max-seq-len", 32,
            "--no-progress", *extra]


def _pt(w, objective, *extra, corpus=None, out=None):
    return ["pretrain", "--objective", objective, "--corpus", corpus or w.lines3, "--out", out or w.d / "pt",
            "--size", "tiny", "--max-steps", 1, "--vocab-size", 300 if objective == "roberta" else 120,
            "--cache-dir", w.d / "cache", "--no-progress",
            *extra]


def _custom(w, *extra):
    csv = w.d / "custom.csv"
    csv.write_text("text,label\ngood film,pos\nbad film,neg\n")
    return ["finetune", "--model", w.tiny, "--task", "custom", "--train", csv, "--out", w.d / "new",
            "--max-seq-len", 32, "data.label_column=label", "data.labels=[neg,pos]", *extra]


def _tr(w, *extra, src=None, tgt=None):
    return ["translate", "train", "--src", src or w.lines3, "--tgt", tgt or w.lines3, "--valid-src", w.lines3,
            "--valid-tgt", w.lines3, "--out", w.d / "mt", "--no-progress", *extra]


def _bench(w, *extra, model=None):
    return ["bench", "--model", model or w.run, "--seq-len", 16, "--iters", 2, "--warmup", 0, *extra]


def _prune(w, *extra, model=None, data=True):
    return ["prune", "--model", model or w.run, "--out", w.d / "pr",
            *(["--data", w.train] if data else []), *extra]


def _tune(w, task, train, *extra):
    return ["finetune", "--model", w.tiny, "--task", task, "--train", train, "--out", w.d / "new",
            "--max-steps", 1, "--batch-size", 2, "--max-seq-len", 32, "--no-progress", *extra]


def _file(w, name, data):
    return write_file(w.d / name, data)


def _squad_row(**kw):
    row = {"id": "a", "question": "who lives there", "context": "john lives in paris .",
           "answers": [{"text": "john", "answer_start": 0}]}
    row.update(kw)
    return json.dumps(row) + "\n"


# (id, argv builder, substrings the one error line must contain)
CASES = [
    # ---- finetune: data files and task specs
    ("ft-train-missing", lambda w: _ft(w, train=w.d / "nope.tsv"), ["nope.tsv does not exist"]),
    ("ft-train-empty", lambda w: _ft(w, train=w.empty), ["empty.tsv is empty"]),
    ("ft-train-not-utf8", lambda w: _ft(w, train=w.latin1), ["not UTF-8", "line 2", "re-encode"]),
    ("ft-train-is-dir", lambda w: _ft(w, train=w.d), ["is a directory"]),
    ("ft-missing-column", lambda w: _ft(w, train=w.nocol), ["no column 'sentence'", "columns: text, label"]),
    ("ft-label-outside-set", lambda w: _ft(w, train=w.badlabel), ["badlabel.tsv:3", "label '7'",
                                                                     "label set"]),
    ("ft-bad-jsonl", lambda w: _ft(w, train=w.badjson), ["bad.jsonl:2 is not valid JSON"]),
    ("ft-unknown-task", lambda w: _ft(w, "--task", "sst3"), ["sst3"]),
    ("squad-train-is-a-list", lambda w: ["finetune", "--model", w.tiny, "--task", "squad", "--train", w.squadlist,
                                         "--out", w.d / "qa", "--max-steps", 1, "--max-seq-len", 64],
     ["item 1 is a JSON int", "SQuAD"]),
    ("ft-csv-named-tsv", lambda w: _ft(w, train=w.csv_as_tsv), ["no column 'sentence'", "comma-separated",
                                                                 ".csv"]),
    ("ner-tokens-not-a-list", lambda w: ["finetune", "--model", w.tiny, "--task", "conll2003", "--train",
                                         w.ner_str, "--out", w.d / "ner", "--max-seq-len", 32],
     ["ner_str.jsonl:1 field 'tokens' is a str, not a list"]),
    ("ner-bad-tag-names-the-file-once", lambda w: ["finetune", "--model", w.tiny, "--task", "conll2003", "--train",
                                                   w.ner_badtag, "--out", w.d / "ner", "--max-seq-len", 32],
     ["error: ner_badtag.jsonl:1 tag 'PER' is not IOB"]),
    ("qa-seq-len-too-short", lambda w: ["finetune", "--model", w.tiny, "--task", "squad", "--train", w.squad,
                                        "--out", w.d / "qa", "--max-seq-len", 3],
     ["max_seq_len=3", "raise --max-seq-len"]),
    ("ft-custom-misspelt-column", lambda w: _custom(w, "data.text_columns=[txt]"),
     ["has no column 'txt' (columns: text, label)"]),
    ("ner-jsonl-not-utf8", lambda w: _tune(w, "conll2003", _file(w, "n.jsonl", b'{"tokens":["Jo\xffhn"],"tags":["B-PER"]}\n')),
     ["n.jsonl is not UTF-8"]),
    ("ner-jsonl-no-tokens", lambda w: _tune(w, "conll2003", _file(w, "e.jsonl", '{"tokens":[],"tags":[]}\n')),
     ["e.jsonl:1 has no tokens"]),
    ("ner-jsonl-null-token", lambda w: _tune(w, "conll2003", _file(w, "z.jsonl", '{"tokens":["a",null],"tags":["O","O"]}\n')),
     ["z.jsonl:1 field 'tokens' holds null, not a string"]),
    ("jsonl-list-after-object", lambda w: _tune(w, "sst2", _file(w, "m.jsonl", '{"sentence":"good","label":"1"}\n["x"]\n')),
     ["m.jsonl:2 is a JSON list, not an object"]),
    ("jsonl-number-after-object", lambda w: _tune(w, "sst2", _file(w, "m5.jsonl", '{"sentence":"good","label":"1"}\n5\n')),
     ["m5.jsonl:2 is a JSON int, not an object"]),
    ("json-array-of-numbers", lambda w: _tune(w, "sst2", _file(w, "a.json", "[1, 2, 3]\n")),
     ["a.json:1 is a JSON int, not an object"]),
    ("json-rows-of-both-kinds", lambda w: _tune(w, "sst2", _file(w, "b.json", '[["good", "1"], {"sentence": "x"}]')),
     ["b.json:2 is a JSON dict, not a list (positional columns, as row 1)"]),
    ("jsonl-null-text", lambda w: _tune(w, "sst2", _file(w, "nt.jsonl", '{"sentence":null,"label":"1"}\n')),
     ["nt.jsonl:1 field 'sentence' is null, not text"]),
    ("qa-question-not-text", lambda w: _tune(w, "squad", _file(w, "q.jsonl", _squad_row(question=5))),
     ["row 1 has a int 'question'; it must be text"]),
    ("qa-context-null", lambda w: _tune(w, "squad", _file(w, "c.jsonl", _squad_row(context=None))),
     ["row 1 has a NoneType 'context'"]),
    ("qa-answers-not-objects", lambda w: _tune(w, "squad", _file(w, "s.jsonl", _squad_row(answers=["john"]))),
     ["row 1 has an answer 'john'", "answer_start"]),
    ("qa-jsonl-answer-offset", lambda w: _tune(w, "squad", _file(w, "o.jsonl", _squad_row(
        answers=[{"text": "rome", "answer_start": 3}]))), ["answer 'rome' is not at answer_start 3"]),
    ("qa-duplicate-ids", lambda w: _tune(w, "squad", _file(w, "d.jsonl", _squad_row() + _squad_row())),
     ["question id 'a' appears more than once"]),
    ("qa-json-question-not-text", lambda w: _tune(w, "squad", _file(w, "q.json", json.dumps({"data": [{
        "title": "t", "paragraphs": [{"context": CTX, "qas": [{"id": "x", "question": 7, "answers": [
            {"text": "john", "answer_start": 0}]}]}]}]}))), ["question x has a int 'question'"]),
    ("custom-three-text-columns", lambda w: _tune(w, "custom", _file(w, "c3.csv", "text,label\ngood,pos\nbad,neg\n"),
                                                "data.text_columns=[text,label,text]", "data.label_column=label",
                                                "data.labels=[neg,pos]"),
     ["data.text_columns=['text', 'label', 'text']: give one column"]),
    ("custom-repeated-label", lambda w: _tune(w, "custom", _file(w, "c4.csv", "text,label\ngood,pos\nbad,neg\n"),
                                            "data.text_columns=[text]", "data.label_column=label",
                                            "data.labels=[neg,neg,pos]"),
     ["lists 'neg' twice"]),
    ("custom-unknown-metric", lambda w: _tune(w, "custom", _file(w, "c5.csv", "text,label\ngood,pos\nbad,neg\n"),
                                            "data.text_columns=[text]", "data.label_column=label",
                                            "data.labels=[neg,pos]", "data.metric=bogus"),
     ["data.metric='bogus' is not a classification metric", "accuracy, f1, mcc"]),
    ("custom-regression-metric-for-labels", lambda w: _tune(w, "custom", _file(w, "c6.csv", "text,label\ngood,pos\n"),
                                                          "data.text_columns=[text]", "data.label_column=label",
                                                          "data.labels=[neg,pos]", "data.metric=pearson"),
     ["data.metric='pearson' is not a classification metric"]),
    ("stsb-classification-metric", lambda w: _tune(w, "stsb", w.train, "data.metric=accuracy"),
     ["data.metric='accuracy' is not a regression metric", "pearson, spearman"]),
    # ---- finetune: model dirs
    ("ft-model-missing", lambda w: _ft(w, model=w.d / "nomodel"), ["does not exist"]),
    ("ft-model-unknown-family", lambda w: _ft(w, model=w.gpt2),
     ["gpt2", "model_type='gpt2'", "bertforge loads bert"]),
    ("ft-model-no-config", lambda w: _ft(w, model=w.noconfig), ["no config.json"]),
    ("ft-model-is-file", lambda w: _ft(w, model=w.afile), ["is a file"]),
    ("ft-seq-longer-than-positions", lambda w: _ft(w, "--max-seq-len", 1000),
     ["--max-seq-len 1000 exceeds the model's 64 positions"]),
    ("ft-model-key-abc", lambda w: _ft(w, "model.hidden_dropout_prob=abc"),
     ["model.hidden_dropout_prob=abc: expected a number"]),
    # ---- recipes, overrides and flags (read the same way by every verb)
    ("ft-unknown-recipe-key", lambda w: _ft(w, "train.lrr=1e-3"), ["unknown recipe key 'train.lrr'"]),
    ("ft-unknown-recipe-section", lambda w: _ft(w, "optim.lr=1e-3"), ["unknown recipe section 'optim'"]),
    ("ft-malformed-override", lambda w: _ft(w, "train.lr"), ["section.key=value"]),
    ("ft-negative-lr", lambda w: _ft(w, "train.lr=-1"), ["train.lr must be a finite number > 0"]),
    ("ft-bad-dtype", lambda w: _ft(w, "impl.dtype=float16"), ["impl.dtype='float16'"]),
    ("ft-bad-parallel", lambda w: _ft(w, "impl.parallel=zero3"), ["impl.parallel='zero3'"]),
    ("ft-bad-schedule", lambda w: _ft(w, "train.schedule=triangle"), ["train.schedule='triangle'"]),
    ("ft-recipe-missing", lambda w: _ft(w, "--recipe", w.d / "nope.yaml"), ["nope.yaml does not exist"]),
    ("ft-recipe-bad-yaml", lambda w: _ft(w, "--recipe", w.badyaml), ["not valid YAML"]),
    ("ft-accum-zero", lambda w: _ft(w, "train.grad_accum_steps=0"), ["train.grad_accum_steps must be"]),
    ("ft-lr-nan", lambda w: _ft(w, "--lr", "nan"), ["train.lr must be a finite number > 0"]),
    ("config-json-is-a-list", lambda w: ["evaluate", "--model", w.listcfg, "--data", w.train],
     ["holds a JSON list"]),
    ("overrides-after-options-apply", lambda w: ["finetune", "--model", w.tiny, "--task", "sst2",
                                                 "train.lr=3e-5", "--train", w.train, "--out", w.d / "ov",
                                                 "impl.dtype=float16"],
     ["impl.dtype='float16'"]),
    ("ft-null-for-a-key-that-needs-a-value", lambda w: _ft(w, "impl.dtype="),
     ["impl.dtype=: a value is needed", "leave the key out"]),
    ("ft-flag-and-override-disagree", lambda w: _ft(w, "--lr", "1e-4", "train.lr=3e-5"),
     ["--lr 0.0001 conflicts with train.lr=3e-5", "pass one of them"]),
    ("ft-batch-larger-than-data", lambda w: _ft(w, "--batch-size", 64), ["train.batch_size 64 exceeds the 24"]),
    ("finetune-max-steps-zero", lambda w: ["finetune", "--model", w.run, "--task", "sst2", "--train", w.train,
                                           "--out", w.d / "ft0", "train.max_steps=0"], ["train.max_steps 0", "≥ 1"]),
    ("finetune-epochs-negative", lambda w: ["finetune", "--model", w.run, "--train", w.train, "--epochs", "-1",
                                            "--out", w.d / "ft"], ["--epochs"]),
    ("ft-bf16-conflicts-with-dtype-override", lambda w: _ft(w, "impl.dtype=float32", "--bf16"),
     ["--bf16 conflicts with impl.dtype=float32"]),
    ("override-given-twice", lambda w: _pt(w, "roberta", "train.lr=1e-3", "train.lr=5e-3"),
     ["train.lr is given twice", "train.lr=1e-3 and train.lr=5e-3"]),
    ("ft-lr-abc", lambda w: _ft(w, "train.lr=abc"), ["train.lr=abc: expected a number"]),
    ("ft-batch-size-abc", lambda w: _ft(w, "train.batch_size=abc"), ["train.batch_size=abc: expected an integer"]),
    ("ft-epochs-abc", lambda w: _ft(w, "train.epochs=abc"), ["train.epochs=abc: expected a number"]),
    ("ft-seed-abc", lambda w: _ft(w, "train.seed=abc"), ["train.seed=abc: expected an integer"]),
    ("ft-seed-float", lambda w: _ft(w, "train.seed=1.5"), ["train.seed=1.5: expected an integer"]),
    ("ft-warmup-ratio-abc", lambda w: _ft(w, "train.warmup_ratio=abc"), ["train.warmup_ratio=abc: expected a number"]),
    ("ft-max-seq-len-abc", lambda w: _ft(w, "data.max_seq_len=abc"), ["data.max_seq_len=abc: expected an integer"]),
    ("ft-load-best-maybe", lambda w: _ft(w, "train.load_best_at_end=maybe"),
     ["train.load_best_at_end=maybe: expected true/false"]),
    ("ft-max-steps-abc", lambda w: _ft(w, "train.max_steps=abc"), ["train.max_steps=abc: expected an integer"]),
    ("ft-adam-betas-scalar", lambda w: _ft(w, "train.adam_betas=0.9"), ["train.adam_betas=0.9: expected a list"]),
    ("recipe-is-a-directory", lambda w: _tune(w, "sst2", w.train, "--recipe", w.d), ["is a directory"]),
    # ---- finetune: output dir and --resume (the earlier run must stay intact)
    ("ft-out-holds-run", lambda w: _ft(w, out=w.run), ["already holds a run", "--resume", "--overwrite"]),
    ("ft-out-is-file", lambda w: _ft(w, out=w.afile), ["is a file"]),
    ("ft-out-unwritable", lambda w: _ft(w, out=Path("/sys/bertforge-run")), ["/sys/bertforge-run"]),
    ("ft-resume-no-checkpoints", lambda w: _ft(w, "--resume", out=w.d), ["has no checkpoints/"]),
    ("ft-resume-other-data", lambda w: _ft(w, "--resume", out=w.run,
                                           train=w.d / "train_more.tsv"),
     ["written with 24 training examples but this run has 30", "same training data"]),
    ("ft-resume-other-batch", lambda w: _ft(w, "--resume", "--batch-size", 4, out=w.run),
     ["written with 8 batch_size but this run has 4", "train.batch_size=8"]),
    ("ft-out-nonempty-not-a-run", lambda w: _ft(w, out=w.notarun), ["holds no run"]),
    ("ft-empty-out", lambda w: ["finetune", "--model", w.tiny, "--task", "sst2", "--train", w.train, "--out", ""],
     ["--out is empty"]),
    ("ft-resume-and-overwrite", lambda w: _ft(w, "--resume", "--overwrite", out=w.run), ["pass one of them"]),
    ("ft-overwrite-a-dir-that-is-not-a-run", lambda w: _ft(w, "--overwrite", out=w.notarun),
     ["not a bertforge run"]),
    # ---- evaluate / predict
    ("eval-no-task-recorded", lambda w: ["evaluate", "--model", w.tiny, "--data", w.train],
     ["does not record its task", "--task"]),
    ("eval-label-space-mismatch", lambda w: ["evaluate", "--model", w.run, "--task", "stsb", "--data", w.train],
     ["predicts 2 labels", "stsb"]),
    ("eval-other-task-same-label-count", lambda w: ["evaluate", "--model", w.run, "--task", "qnli", "--data", w.train],
     ["fine-tuned on task sst2", "labels 0, 1", "entailment", "--task sst2"]),
    ("eval-data-missing", lambda w: ["evaluate", "--model", w.run, "--data", w.d / "nope.tsv"],
     ["nope.tsv does not exist"]),
    ("predict-data-not-utf8", lambda w: ["predict", "--model", w.run, "--data", w.latin1, "--out",
                                         w.d / "p.jsonl"], ["not UTF-8"]),
    ("predict-out-unwritable", lambda w: ["predict", "--model", w.run, "--data", w.train, "--out",
                                          "/sys/preds.jsonl"], ["permission denied", "/sys/preds.jsonl"]),
    ("predict-out-inside-model", lambda w: ["predict", "--model", w.run, "--data", w.train, "--out",
                                            w.run / "config.json", "--overwrite"], ["inside the model directory"]),
    ("predict-out-exists", lambda w: ["predict", "--model", w.run, "--data", w.train, "--out", w.afile],
     ["--out", "exists", "--overwrite"]),
    ("predict-out-is-input", lambda w: ["predict", "--model", w.run, "--data", w.train, "--out", w.train,
                                        "--overwrite"], ["is the input file"]),
    ("eval-seq-len-negative", lambda w: ["evaluate", "--model", w.run, "--data", w.train, "--max-seq-len", -5],
     ["--max-seq-len -5 must be ≥ 2"]),
    ("eval-seq-len-one", lambda w: ["evaluate", "--model", w.run, "--data", w.train, "--max-seq-len", 1],
     ["--max-seq-len 1 must be ≥ 2"]),
    ("eval-seq-len-beyond-positions", lambda w: ["evaluate", "--model", w.run, "--data", w.train,
                                                 "--max-seq-len", 100000], ["--max-seq-len 100000 exceeds"]),
    ("eval-batch-zero", lambda w: ["evaluate", "--model", w.run, "--data", w.train, "--batch-size", 0],
     ["--batch-size 0 must be ≥ 1"]),
    ("predict-batch-negative", lambda w: ["predict", "--model", w.run, "--data", w.train, "--batch-size", -2,
                                          "--out", w.d / "p.jsonl"], ["--batch-size -2 must be ≥ 1"]),
    ("predict-out-is-the-model-dir", lambda w: ["predict", "--model", w.run, "--data", w.train, "--out", w.run],
     ["is a directory", "outside it"]),
    ("predict-out-into-another-run", lambda w: ["predict", "--model", w.run, "--data", w.train,
                                                "--out", w.pt_run / "model.safetensors", "--overwrite"],
     ["lies inside", "holds a bertforge run"]),
    ("evaluate-custom-on-a-glue-model", lambda w: ["evaluate", "--model", w.run, "--data", w.train, "--task",
                                                   "custom"], ["was not fine-tuned on a custom task"]),
    # ---- pretrain
    ("pretrain-corpus-blank-lines", lambda w: _pt(w, "bert", corpus=w.blank), ["only blank lines"]),
    ("pretrain-corpus-is-dir", lambda w: _pt(w, "bert", corpus=w.d), ["is a directory"]),
    ("pretrain-max-span-zero", lambda w: _pt(w, "spanbert", "pretrain.max_span=0"), ["pretrain.max_span=0"]),
    ("pretrain-geometric-p-nan", lambda w: _pt(w, "spanbert", "pretrain.geometric_p=.nan"),
     ["pretrain.geometric_p=nan", "(0.0, 1.0]"]),
    ("pretrain-dupe-factor-zero", lambda w: _pt(w, "bert", "--dupe-factor", 0), ["pretrain.dupe_factor=0"]),
    ("pretrain-generator-size-zero", lambda w: _pt(w, "electra", "pretrain.generator_size=0"),
     ["pretrain.generator_size=0"]),
    ("pretrain-short-seq-prob-two", lambda w: _pt(w, "bert", "pretrain.short_seq_prob=2"),
     ["pretrain.short_seq_prob=2"]),
    ("pretrain-seq-len-too-short", lambda w: _pt(w, "bert", "--max-seq-len", 2),
     ["--max-seq-len / data.max_seq_len 2 must be ≥ 8"]),
    ("pretrain-resume-other-seed", lambda w: _pt(w, "roberta", "--resume", "--seed", 7, "--batch-size", 1,
                                                 out=w.pt_run),
     ["written with 42 seed but this run has 7", "train.seed=42"]),
    ("pretrain-resume-other-objective-named",
     lambda w: _pt(w, "electra", "--resume", "--batch-size", 1, out=w.pt_run),
     ["with other options", "objective 'roberta' → 'electra'"]),
    ("pretrain-resume-other-length-named", lambda w: _pt(w, "roberta", "--resume", "--batch-size", 1,
                                                         "--max-seq-len", 16, out=w.pt_run),
     ["data.max_seq_len"]),
    ("pretrain-corpus-missing", lambda w: ["pretrain", "--objective", "bert", "--corpus", w.d / "nope.txt",
                                           "--out", w.d / "pt", "--no-progress"], ["nope.txt does not exist"]),
    ("pretrain-corpus-empty", lambda w: ["pretrain", "--objective", "roberta", "--corpus", w.corpus_empty,
                                         "--out", w.d / "pt", "--no-progress", "--cache-dir", w.d / "cache"],
     ["empty.txt is empty"]),
    ("pretrain-unknown-key", lambda w: ["pretrain", "--objective", "bert", "--corpus", w.train, "--out",
                                        w.d / "pt", "pretrain.mlm_prob=0.2"], ["mlm_prob"]),
    ("pretrain-max-steps-negative", lambda w: ["pretrain", "--objective", "roberta", "--corpus", w.train, "--out",
                                               w.d / "pt", "--max-steps", -3, "--vocab-size", 300, "--cache-dir",
                                               w.d / "cache", "--no-progress"], ["train.max_steps -3", "≥ 1"]),
    ("pretrain-out-holds-run", lambda w: ["pretrain", "--objective", "roberta", "--corpus", w.train, "--out", w.run,
                                          "--vocab-size", 300, "--cache-dir", w.d / "cache"],
     ["already holds a run"]),
    ("pretrain-bf16-conflicts-with-auto", lambda w: _pt(w, "bert", "impl.dtype=auto", "--bf16"),
     ["--bf16 conflicts with impl.dtype=auto"]),
    ("pretrain-out-inside-a-run", lambda w: _pt(w, "roberta", out=w.run / "child"), ["is inside", "holds a bertforge run"]),
    ("pretrain-out-inside-a-checkpoint", lambda w: _pt(w, "roberta", "--overwrite",
                                                       out=w.pt_run / "checkpoints" / "step-1"), ["is inside"]),
    ("pretrain-heads-zero", lambda w: _pt(w, "roberta", "model.num_attention_heads=0"),
     ["model.num_attention_heads=0", "≥ 1"]),
    ("pretrain-hidden-negative", lambda w: _pt(w, "roberta", "model.hidden_size=-8"), ["model.hidden_size=-8"]),
    ("pretrain-hidden-text", lambda w: _pt(w, "roberta", "model.hidden_size=big"), ["model.hidden_size=big"]),
    ("pretrain-dropout-above-one", lambda w: _pt(w, "roberta", "model.hidden_dropout_prob=1.5"),
     ["model.hidden_dropout_prob=1.5", "probability"]),
    ("pretrain-threads-negative", lambda w: _pt(w, "roberta", "impl.threads=-1"), ["impl.threads -1"]),
    ("pretrain-log-every-zero", lambda w: _pt(w, "roberta", "train.log_every=0"), ["train.log_every 0"]),
    ("pretrain-warmup-ratio-two", lambda w: _pt(w, "roberta", "train.warmup_ratio=2"), ["train.warmup_ratio=2"]),
    ("pretrain-override-after-corpus-applies", lambda w: ["pretrain", "--objective", "bert", "--corpus", w.lines3,
                                                         "pretrain.max_span=0", "--out", w.d / "pt"],
     ["pretrain.max_span=0"]),
    ("pretrain-corpus-binary", lambda w: _pt(w, "bert", corpus=w.binary), ["not UTF-8"]),
    ("pretrain-vocab-size-with-reused-tokenizer",
     lambda w: ["pretrain", "--objective", "bert", "--corpus", w.lines3, "--out", w.d / "pt", "--tokenizer", w.tiny,
                "--vocab-size", 500, "--max-steps", 1],
     ["--vocab-size 500", "drop --vocab-size"]),
    ("pretrain-tokenizer-unknown", lambda w: _pt(w, "bert", "--tokenizer", "nosuch"),
     ["neither a kind", "wordpiece"]),
    ("pretrain-dupe-factor-with-dynamic-masking", lambda w: _pt(w, "roberta", "--dupe-factor", 3),
     ["--dupe-factor / pretrain.dupe_factor=3", "--masking static"]),
    ("pretrain-size-disagrees-with-recipe", lambda w: _pt(w, "roberta", "--size", "small", "--recipe",
                                                          REPO / "recipes" / "pretrain" / "tiny.yaml"),
     ["--size small sets model.hidden_size=256", "drop --size"]),
    ("pretrain-mlm-probability-zero", lambda w: _pt(w, "roberta", "pretrain.mlm_probability=0"),
     ["pretrain.mlm_probability=0"]),
    ("pretrain-resume-a-finetune-run", lambda w: _pt(w, "roberta", "--resume", out=w.run),
     ["is a `bertforge finetune` run, not a `bertforge pretrain` one"]),
    ("pretrain-cache-dir-is-a-file", lambda w: _pt(w, "bert", "--cache-dir", w.lines3), ["is a file"]),
    ("pretrain-cache-dir-inside-out", lambda w: _pt(w, "bert", "--cache-dir", w.d / "ptc" / "cache",
                                                    out=w.d / "ptc"), ["overlaps --out"]),
    ("pretrain-cache-dir-is-a-run", lambda w: _pt(w, "bert", "--cache-dir", w.run), ["holds a bertforge run"]),
    ("pretrain-cache-dir-inside-a-run", lambda w: _pt(w, "bert", "--cache-dir", w.run / "cache"),
     ["holds a bertforge run"]),
    # ---- distill
    ("distill-student-zero-heads", lambda w: ["distill", "--teacher", w.run, "--student", "2L-16H-0A", "--train",
                                              w.train, "--out", w.d / "dst"], ["every size must be ≥ 1"]),
    ("distill-student-layers-reversed", lambda w: ["distill", "--teacher", w.run, "--student", "layers:1,0",
                                                   "--train", w.train, "--out", w.d / "dst"], ["increasing order"]),
    ("distill-temperature-inf", lambda w: ["distill", "--teacher", w.run, "--student", "1L-16H-2A-32I", "--train",
                                           w.train, "--temperature", "inf", "--out", w.d / "dst"],
     ["--temperature inf must be a finite number"]),
    ("distill-teacher-without-task-head", lambda w: ["distill", "--teacher", w.tiny, "--student", "1L-16H-2A-32I",
                                                     "--task", "sst2", "--train", w.train, "--out", w.d / "dst"],
     ["has no task head", "needs sequence_classification", "fine-tune the teacher"]),
    ("distill-vocab-mismatch", lambda w: ["distill", "--teacher", w.run, "--student", w.other_vocab, "--train",
                                          w.train, "--out", w.d / "dst"], ["different vocabulary", "teacher", "--student"]),
    ("distill-teachers-vocab-mismatch", lambda w: ["distill", "--teacher", w.run, "--teacher", w.other_vocab,
                                                   "--student", "1L-16H-2A-32I", "--train", w.train, "--out",
                                                   w.d / "dst"],
     ["teacher", "different vocabulary", "teachers that share one tokenizer"]),
    ("distill-cache-dir-is-a-file", lambda w: ["distill", "--teacher", w.run, "--student", "1L-16H-2A-32I",
                                               "--train", w.train, "--out", w.d / "dst", "--cache-dir", w.train],
     ["--cache-dir", "is a file"]),
    ("distill-cache-dir-inside-the-teacher", lambda w: ["distill", "--teacher", w.run, "--student", "1L-16H-2A-32I",
                                                        "--train", w.train, "--out", w.d / "dst", "--cache-dir",
                                                        w.run / "tc"], ["--cache-dir", "overlaps the input"]),
    ("distill-cache-dir-of-other-files", lambda w: ["distill", "--teacher", w.run, "--student", "1L-16H-2A-32I",
                                                    "--train", w.train, "--out", w.d / "dst", "--cache-dir",
                                                    w.notarun], ["not a teacher cache"]),
    ("distill-cache-dir-and-no-cache", lambda w: ["distill", "--teacher", w.run, "--student", "1L-16H-2A-32I",
                                                  "--train", w.train, "--out", w.d / "dst", "--cache-dir",
                                                  w.d / "tc", "--no-cache"], ["pass one of them"]),
    ("distill-alpha-without-a-kd-term", lambda w: ["distill", "--teacher", w.run, "--student", "1L-16H-2A-32I",
                                                   "--method", "tinybert", "--alpha", 0.1, "--train", w.train,
                                                   "--out", w.d / "dst"], ["--alpha", "drop --alpha", "soft_ce"]),
    ("distill-layer-map-without-a-layer-term", lambda w: ["distill", "--teacher", w.run, "--student",
                                                          "1L-16H-2A-32I", "--method", "kd", "--layer-map",
                                                          "uniform", "--train", w.train, "--out", w.d / "dst"],
     ["--layer-map", "drop --layer-map"]),
    ("distill-mlm-prob-in-the-task-stage", lambda w: ["distill", "--teacher", w.run, "--student", "1L-16H-2A-32I",
                                                      "--method", "kd", "--mlm-prob", 0.5, "--train", w.train,
                                                      "--out", w.d / "dst"], ["--mlm-prob", "--stage task"]),
    ("distill-teacher-missing", lambda w: ["distill", "--teacher", w.d / "noteacher", "--student", "1L-16H-2A-32I",
                                           "--train", w.train, "--out", w.d / "dst"], ["does not exist"]),
    ("distill-bad-student-spec", lambda w: ["distill", "--teacher", w.run, "--student", "four-layers",
                                            "--train", w.train, "--out", w.d / "dst"], ["four-layers"]),
    ("distill-student-dir-missing", lambda w: ["distill", "--teacher", w.run, "--student", w.d / "no-such-pruned",
                                               "--train", w.train, "--out", w.d / "dst"],
     ["no such checkpoint dir", "no-such-pruned"]),
    ("distill-temperature-zero", lambda w: ["distill", "--teacher", w.run, "--student", "1L-16H-2A-32I", "--train",
                                            w.train, "--temperature", "0", "--out", w.d / "dst"], ["--temperature"]),
    ("distill-alpha-out-of-range", lambda w: ["distill", "--teacher", w.run, "--student", "1L-16H-2A-32I",
                                              "--train", w.train, "--alpha", "2", "--out", w.d / "dst"], ["--alpha"]),
    ("distill-student-is-a-file", lambda w: ["distill", "--teacher", w.run, "--student", w.train, "--train",
                                             w.train, "--out", w.d / "dst"], ["is a file"]),
    ("distill-max-steps-zero", lambda w: ["distill", "--teacher", w.run, "--student", "1L-16H-2A-32I", "--train",
                                          w.train, "--max-steps", "0", "--out", w.d / "dst"], ["--max-steps"]),
    ("distill-seq-len-beyond-positions", lambda w: ["distill", "--teacher", w.run, "--student", "1L-16H-2A-32I",
                                                    "--train", w.train, "--max-seq-len", "100000", "--out",
                                                    w.d / "dst"], ["exceeds"]),
    ("distill-out-is-teacher", lambda w: ["distill", "--teacher", w.run, "--student", "1L-16H-2A-32I",
                                          "--task", "sst2", "--train", w.train, "--out", w.run, "--overwrite"],
     ["would replace the input"]),
    ("distill-mlm-prob-two", lambda w: ["distill", "--stage", "general", "--teacher", w.tiny, "--student",
                                        "1L-16H-2A-32I", "--corpus", w.lines3, "--mlm-prob", 2, "--out", w.d / "dg"],
     ["--mlm-prob / distill.mlm_probability=2.0"]),
    ("distill-temperature-abc", lambda w: ["distill", "--teacher", w.run, "--student", "1L-16H-2A-32I",
                                           "--train", w.train, "--out", w.d / "dst", "distill.temperature=abc"],
     ["distill.temperature=abc: expected a number"]),
    # ---- prune
    ("prune-fraction-out-of-range", lambda w: ["prune", "--model", w.run, "--out", w.d / "pr", "--fraction", 1.5,
                                               "--data", w.train], ["fraction"]),
    ("prune-unknown-family", lambda w: ["prune", "--model", w.gpt2, "--out", w.d / "pr", "--fraction", 0.5],
     ["gpt2", "model_type='gpt2'", "bertforge loads bert"]),
    ("prune-out-is-model-even-with-overwrite", lambda w: ["prune", "--model", w.run, "--out", w.run, "--fraction",
                                                          0.5, "--data", w.train, "--overwrite"],
     ["would replace the input"]),
    ("prune-batch-size-zero", lambda w: _prune(w, "--fraction", 0.5, "--batch-size", 0), ["--batch-size 0"]),
    ("prune-batch-size-negative", lambda w: _prune(w, "--fraction", 0.5, "--batch-size", -1),
     ["--batch-size -1", "≥ 1"]),
    ("prune-max-samples-zero", lambda w: _prune(w, "--fraction", 0.5, "--max-samples", 0),
     ["--max-samples 0", "≥ 1"]),
    ("prune-max-samples-negative", lambda w: _prune(w, "--fraction", 0.5, "--max-samples", -5),
     ["--max-samples -5"]),
    ("prune-max-eval-samples-zero", lambda w: _prune(w, "--fraction", 0.5, "--eval", w.train,
                                                      "--max-eval-samples", 0), ["--max-eval-samples 0"]),
    ("prune-steps-zero", lambda w: _prune(w, "--fraction", 0.5, "--steps", 0), ["--steps 0", "≥ 1"]),
    ("prune-min-heads-negative", lambda w: _prune(w, "--fraction", 0.5, "--min-heads-per-layer", -1),
     ["--min-heads-per-layer -1", "≥ 0"]),
    ("prune-max-seq-len-one", lambda w: _prune(w, "--fraction", 0.5, "--max-seq-len", 1),
     ["--max-seq-len 1", "≥ 2"]),
    ("prune-max-seq-len-beyond-positions", lambda w: _prune(w, "--fraction", 0.5, "--max-seq-len", 1000),
     ["--max-seq-len 1000 exceeds the model's 64 positions"]),
    ("prune-fraction-negative", lambda w: _prune(w, "--fraction", -0.1), ["--fraction -0.1", "[0, 1)"]),
    ("prune-ffn-fraction-one", lambda w: _prune(w, "--ffn-fraction", 1), ["--ffn-fraction 1", "[0, 1)"]),
    ("prune-magnitude-out-of-range", lambda w: _prune(w, "--magnitude", 2, data=False),
     ["--magnitude 2", "(0, 1)"]),
    ("prune-magnitude-zero", lambda w: _prune(w, "--magnitude", 0, data=False), ["--magnitude 0", "(0, 1)"]),
    ("prune-nothing", lambda w: _prune(w, "--fraction", 0), ["nothing to prune with --fraction 0",
                                                             "share above 0"]),
    ("prune-magnitude-with-fraction", lambda w: _prune(w, "--magnitude", 0.5, "--fraction", 0.3, data=False),
     ["--magnitude", "--fraction", "cannot be combined"]),
    ("prune-magnitude-with-importance-data", lambda w: _prune(w, "--magnitude", 0.5),
     ["--data belongs to head/FFN importance pruning", "drop --data"]),
    ("prune-magnitude-with-steps", lambda w: _prune(w, "--magnitude", 0.5, "--steps", 3, data=False),
     ["--steps belongs to head/FFN importance pruning"]),
    ("prune-magnitude-with-ffn-fraction", lambda w: _prune(w, "--magnitude", 0.5, "--ffn-fraction", 0.3,
                                                            data=False), ["--magnitude", "--ffn-fraction"]),
    ("prune-loss-mlm-on-classifier", lambda w: _prune(w, "--fraction", 0.5, "--loss", "mlm"),
     ["--loss mlm needs a model with an MLM head", "--loss task", "fisher"]),
    ("prune-min-heads-13", lambda w: _prune(w, "--fraction", 0.3, "--min-heads-per-layer", 13),
     ["--min-heads-per-layer 13", "2 heads per layer", "removes none"]),
    ("prune-min-heads-all", lambda w: _prune(w, "--fraction", 0.3, "--min-heads-per-layer", 2),
     ["--min-heads-per-layer 2", "below 2"]),
    # ---- quantize / export
    ("quantize-eval-seq-len-beyond-positions", lambda w: ["quantize", "--model", w.run, "--out", w.d / "q9",
                                                          "--eval", w.train, "--max-seq-len", 100000],
     ["exceeds"]),
    ("quantize-model-missing", lambda w: ["quantize", "--model", w.d / "nomodel", "--out", w.d / "q"],
     ["does not exist"]),
    ("export-no-config", lambda w: ["export", "--model", w.noconfig, "--out", w.d / "onnx"], ["no config.json"]),
    ("export-out-holds-run", lambda w: ["export", "--model", w.run, "--out", w.run], ["would replace the input"]),
    ("quantize-out-is-model-even-with-overwrite", lambda w: ["quantize", "--model", w.run, "--out", w.run,
                                                             "--overwrite"], ["would replace the input"]),
    ("export-out-is-a-file", lambda w: ["export", "--model", w.run, "--out", w.train, "--overwrite"],
     ["is a file"]),
    ("quantize-eval-checked-before-writing", lambda w: ["quantize", "--model", w.run, "--out", w.d / "q8",
                                                        "--eval", w.d / "no-dev.tsv"], ["no-dev.tsv"]),
    ("quantize-out-inside-model", lambda w: ["quantize", "--model", w.run, "--out", w.run / "int8"],
     ["is inside the input"]),
    ("quantize-reduce-range-torch", lambda w: ["quantize", "--model", w.run, "--out", w.d / "qr",
                                               "--backend", "torch", "--reduce-range"], ["--reduce-range applies to the onnxruntime backend"]),
    ("quantize-fusions-torch", lambda w: ["quantize", "--model", w.run, "--out", w.d / "qf", "--backend", "torch",
                                          "--fusions", "all"], ["--fusions applies to the onnxruntime backend"]),
    ("quantize-no-fused-torch", lambda w: ["quantize", "--model", w.run, "--out", w.d / "qn", "--backend",
                                           "torch", "--no-fused"], ["--no-fused applies to the onnxruntime"]),
    ("export-per-tensor-without-int8", lambda w: ["export", "--model", w.run, "--out", w.d / "ep",
                                                  "--per-tensor"], ["--per-tensor", "add --int8"]),
    ("export-reduce-range-without-int8", lambda w: ["export", "--model", w.run, "--out", w.d / "er",
                                                    "--reduce-range"], ["add --int8"]),
    ("quantize-torch-no-fused", lambda w: ["quantize", "--model", w.run, "--out", w.d / "q", "--backend", "torch",
                                           "--no-fused"], ["--no-fused applies to the onnxruntime backend",
                                                           "shapes the exported ONNX graph"]),
    ("quantize-task-without-eval", lambda w: ["quantize", "--model", w.run, "--out", w.d / "q", "--task", "stsb"],
     ["--task sets up the accuracy check of --eval"]),
    ("export-fusions-without-optimizer", lambda w: ["export", "--model", w.run, "--out", w.d / "x", "--no-optimize",
                                                    "--fusions", "all"], ["--no-optimize", "pass one of them"]),
    # ---- bench / embed-eval
    ("bench-corrupt-onnx", lambda w: ["bench", "--model", w.badonnx, "--seq-len", 16],
     ["ONNX Runtime cannot load", "model.onnx"]),
    ("bench-model-missing", lambda w: ["bench", "--model", w.d / "nomodel"], ["nomodel"]),
    ("embed-eval-model-missing", lambda w: ["embed-eval", "--model", w.d / "nomodel"], ["nomodel does not exist"]),
    ("bench-iters-zero", lambda w: _bench(w, "--iters", 0), ["--iters 0", "≥ 1"]),
    ("bench-warmup-negative", lambda w: _bench(w, "--warmup", -1), ["--warmup -1", "≥ 0"]),
    ("bench-min-seconds-negative", lambda w: _bench(w, "--min-seconds", -2), ["--min-seconds -2", "≥ 0"]),
    ("bench-threads-negative", lambda w: _bench(w, "--threads", -3),
     ["--threads -3", f"choose 1–{4 * CORES}", f"has {CORES} core"]),
    ("bench-threads-zero", lambda w: _bench(w, "--threads", 0), ["--threads 0", f"choose 1–{4 * CORES}"]),
    ("bench-threads-huge", lambda w: _bench(w, "--threads", 100000),
     ["--threads 100000", f"choose 1–{4 * CORES}", f"this machine has {CORES} core"]),
    ("bench-int8-on-fp32-onnx", lambda w: _bench(w, "--int8", model=w.onnx),
     ["--int8", "FP32 ONNX graph", "bertforge quantize", "drop --int8"]),
    ("bench-transformers-on-onnx", lambda w: _bench(w, "--backend", "transformers", model=w.onnx),
     ["ONNX graph (model.onnx)", "no model.safetensors", "--backend onnxruntime"]),
    ("bench-transformers-int8", lambda w: _bench(w, "--backend", "transformers", "--int8", model=w.run),
     ["--int8 is for bertforge models"]),
    ("bench-transformers-on-int8", lambda w: _bench(w, "--backend", "transformers", model=w.int8),
     ["PyTorch INT8 model (model.int8.safetensors)", "no model.safetensors", "--backend torch"]),
    # ---- translate / qa-split
    ("translate-misaligned", lambda w: _tr(w, tgt=w.lines2), ["has 3 lines but", "has 2", "aligned"]),
    ("translate-src-missing", lambda w: _tr(w, src=w.d / "nope.txt"), ["nope.txt does not exist"]),
    ("translate-unknown-key", lambda w: _tr(w, "translate.beem=4"), ["translate.beem"]),
    ("translate-lr-negative", lambda w: _tr(w, "--lr", -1), ["train.lr must be a finite number > 0"]),
    ("translate-d-model-zero", lambda w: _tr(w, "model.d_model=0"), ["model.d_model=0 must be a whole number"]),
    ("translate-d-model-text", lambda w: _tr(w, "model.d_model=abc"), ["model.d_model='abc'"]),
    ("translate-dropout-above-one", lambda w: _tr(w, "model.dropout=1.5"), ["model.dropout=1.5", "[0, 1)"]),
    ("translate-max-steps-negative", lambda w: _tr(w, "--max-steps", -1), ["train.max_steps -1", "≥ 1"]),
    ("translate-max-minutes-negative", lambda w: _tr(w, "--max-minutes", -1), ["--max-minutes", "> 0"]),
    ("translate-vocab-zero", lambda w: _tr(w, "translate.vocab_size=0"), ["translate.vocab_size=0", "≥ 5"]),
    ("translate-decode-bert-dir", lambda w: ["translate", "decode", "--model", w.run, "--input", w.lines3],
     ["model_type 'bert'", "translate train"]),
    ("qa-split-not-json", lambda w: ["qa-split", "--data", w.train, "--out-dir", w.d / "qa"], ["not valid JSON"]),
    ("decode-output-into-a-run", lambda w: ["translate", "decode", "--model", w.pt_run, "--input", w.lines3,
                                            "--output", w.run / "config.json"], ["lies inside"]),
    ("decode-output-exists", lambda w: ["translate", "decode", "--model", w.pt_run, "--input", w.lines3,
                                        "--output", w.lines2], ["--output", "exists", "--overwrite"]),
    ("decode-config-not-json", lambda w: ["translate", "decode", "--model", w.listcfg, "--input", w.lines3],
     ["config.json"]),
    ("decode-negative-length-penalty", lambda w: ["translate", "decode", "--model", w.pt_run, "--input", w.lines3,
                                                  "--length-penalty", -5], ["--length-penalty=-5"]),
    ("decode-no-output-length", lambda w: ["translate", "decode", "--model", w.pt_run, "--input", w.lines3,
                                           "--max-len-a", 0, "--max-len-b", 0], ["allows no output tokens"]),
    ("decode-threads-negative", lambda w: ["translate", "decode", "--model", w.run, "--input", w.train,
                                           "--threads", -1], ["--threads=-1 must be a whole number ≥ 1"]),
    ("decode-batch-tokens-zero", lambda w: ["translate", "decode", "--model", w.run, "--input", w.train,
                                            "--batch-tokens", 0], ["--batch-tokens=0 must be"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_cli_input_is_one_error_line(case, w, cli_error):
    from bertforge.cli import build_parser
    name, argv, needles = case
    argv = [str(a) for a in argv(w)]
    if argv[0] not in build_parser()._subparsers._group_actions[0].choices:
        pytest.skip(f"verb {argv[0]} not in this build")
    if name == "ft-resume-other-data":
        write_tsv(w.d / "train_more.tsv", sentences(30, 1))
    line = cli_error(argv, untouched=w.run)
    for n in needles:
        assert n in line, (n, line)
    strays = [p.name for p in w.run.parent.iterdir() if ".staging" in p.name or p.name.endswith(".tmp")]
    assert not strays, strays


@pytest.mark.parametrize("argv,needle", [
    (lambda w: _ft(w, train=w.d / "nope.tsv"), "does not exist"),
    (lambda w: _ft(w, model=w.gpt2), "model_type='gpt2'"),
    (lambda w: ["finetune", "--model", w.tiny, "--task", "sst2", "--out", w.d / "x"], "--train"),
    (lambda w: ["finetune", "--task", "sst2"], "--out"),  # argparse usage error (--model may come from --recipe)
    (lambda w: ["finetune", "--task", "sst2", "--train", w.train, "--out", w.d / "x"], "no model given"),
    (lambda w: [], "no verb given"),
], ids=["missing-file", "unknown-family", "no-train-file", "usage", "no-model", "no-verb"])
def test_bad_cli_input_in_a_fresh_process_is_one_error_line(w, argv, needle):
    r = run(bertforge_cmd(*argv(w)), timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr, r.stderr


def test_refused_cache_dir_writes_nothing(w, cli_error):
    """The --cache-dir checks run before the tokenizer is trained: neither the cache nor --out appear."""
    cli_error([str(a) for a in _pt(w, "bert", "--cache-dir", w.d / "ptd" / "cache", out=w.d / "ptd")],
              untouched=w.run)
    cli_error([str(a) for a in _pt(w, "bert", "--cache-dir", w.run / "cache2")], untouched=w.run)
    assert not (w.d / "ptd").exists() and not (w.run / "cache2").exists()


def test_resume_message_compares_paths_resolved_and_names_each_change_once(w, cli_error):
    """A relative and an absolute path to the same corpus file are the same value; the real difference
    (the batch size) is named, and only once."""
    rel = os.path.relpath(w.lines3)
    line = cli_error([str(a) for a in _pt(w, "roberta", "--resume", "--batch-size", 2, corpus=rel,
                                          out=w.pt_run)], untouched=w.run)
    assert "batch_size" in line and "data.corpus" not in line, line
    line = cli_error([str(a) for a in _pt(w, "roberta", "--resume", "--batch-size", 1,
                                          "model.hidden_size=64", out=w.pt_run)], untouched=w.run)
    assert line.count("model.hidden_size") == 1, line


def test_evaluate_on_an_interrupted_run_says_to_resume(w, cli_error):
    stopped = w.d / "stopped"
    for step in (2, 10):
        (stopped / "checkpoints" / f"step-{step}").mkdir(parents=True)
    line = cli_error(["evaluate", "--model", stopped, "--data", w.train], untouched=w.run)
    assert "holds checkpoints but no final model" in line and "--resume" in line
    assert line.rstrip().endswith("step-10")  # the newest by number, not by name


def test_embedded_corpus_names_the_empty_part_and_creates_nothing(tmp_path, cli_error):
    out = tmp_path / "corpus"
    line = cli_error(["embedded-corpus", "--out", out, "--max-documents", 1], untouched=tmp_path)
    assert "part came out empty" in line and "--max-documents" in line and "max_documents" not in line
    assert not out.exists()
