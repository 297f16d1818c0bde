"""Fixes from the seventh fresh-user round (session 14): malformed rows of JSONL/QA/NER files, task specs
that would train silently wrong (3+ text columns, a repeated label, a metric of the other kind), embed-eval
on a model of another shape, decode options, messages for a recipe dir and an interrupted run — each one
error line, exit 2 — and line separators inside a field (U+2028, form feed) that are now read as text.

Independent truths: the contract of ``cli_error_line`` (exit 2, one stderr line, nothing modified), the
files' own text (what a field holds), and hand-built files.
"""
from __future__ import annotations

import json

import pytest
import torch

from resilience_util import cli_error_line, sentences, tiny_workspace


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    return tiny_workspace(tmp_path_factory.mktemp("round7"))


def _file(w, name, data):
    p = w.d / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return p


def _ft(w, task, train, *extra):
    return ["finetune", "--model", w.tiny, "--task", task, "--train", train, "--out", w.d / "new",
            "--max-steps", 1, "--batch-size", 2, "--max-seq-len", 32, "--no-progress", *extra]


def _squad_row(**kw):
    row = {"id": "a", "question": "who lives there", "context": "john lives in paris .",
           "answers": [{"text": "john", "answer_start": 0}]}
    row.update(kw)
    return json.dumps(row) + "\n"


CTX = "john lives in paris ."
CASES = [
    ("ner-jsonl-not-utf8", lambda w: _ft(w, "conll2003", _file(w, "n.jsonl", b'{"tokens":["Jo\xffhn"],"tags":["B-PER"]}\n')),
     ["n.jsonl is not UTF-8"]),
    ("ner-jsonl-no-tokens", lambda w: _ft(w, "conll2003", _file(w, "e.jsonl", '{"tokens":[],"tags":[]}\n')),
     ["e.jsonl:1 has no tokens"]),
    ("ner-jsonl-null-token", lambda w: _ft(w, "conll2003", _file(w, "z.jsonl", '{"tokens":["a",null],"tags":["O","O"]}\n')),
     ["z.jsonl:1 field 'tokens' holds null, not a string"]),
    ("jsonl-list-after-object", lambda w: _ft(w, "sst2", _file(w, "m.jsonl", '{"sentence":"good","label":"1"}\n["x"]\n')),
     ["m.jsonl:2 is a JSON list, not an object"]),
    ("jsonl-number-after-object", lambda w: _ft(w, "sst2", _file(w, "m5.jsonl", '{"sentence":"good","label":"1"}\n5\n')),
     ["m5.jsonl:2 is a JSON int, not an object"]),
    ("json-array-of-numbers", lambda w: _ft(w, "sst2", _file(w, "a.json", "[1, 2, 3]\n")),
     ["a.json:1 is a JSON int, not an object"]),
    ("json-rows-of-both-kinds", lambda w: _ft(w, "sst2", _file(w, "b.json", '[["good", "1"], {"sentence": "x"}]')),
     ["b.json:2 is a JSON dict, not a list (positional columns, as row 1)"]),
    ("jsonl-null-text", lambda w: _ft(w, "sst2", _file(w, "nt.jsonl", '{"sentence":null,"label":"1"}\n')),
     ["nt.jsonl:1 field 'sentence' is null, not text"]),
    ("qa-question-not-text", lambda w: _ft(w, "squad", _file(w, "q.jsonl", _squad_row(question=5))),
     ["row 1 has a int 'question'; it must be text"]),
    ("qa-context-null", lambda w: _ft(w, "squad", _file(w, "c.jsonl", _squad_row(context=None))),
     ["row 1 has a NoneType 'context'"]),
    ("qa-answers-not-objects", lambda w: _ft(w, "squad", _file(w, "s.jsonl", _squad_row(answers=["john"]))),
     ["row 1 has an answer 'john'", "answer_start"]),
    ("qa-jsonl-answer-offset", lambda w: _ft(w, "squad", _file(w, "o.jsonl", _squad_row(
        answers=[{"text": "rome", "answer_start": 3}]))), ["answer 'rome' is not at answer_start 3"]),
    ("qa-duplicate-ids", lambda w: _ft(w, "squad", _file(w, "d.jsonl", _squad_row() + _squad_row())),
     ["question id 'a' appears more than once"]),
    ("qa-json-question-not-text", lambda w: _ft(w, "squad", _file(w, "q.json", json.dumps({"data": [{
        "title": "t", "paragraphs": [{"context": CTX, "qas": [{"id": "x", "question": 7, "answers": [
            {"text": "john", "answer_start": 0}]}]}]}]}))), ["question x has a int 'question'"]),
    ("custom-three-text-columns", lambda w: _ft(w, "custom", _file(w, "c3.csv", "text,label\ngood,pos\nbad,neg\n"),
                                                "data.text_columns=[text,label,text]", "data.label_column=label",
                                                "data.labels=[neg,pos]"),
     ["data.text_columns=['text', 'label', 'text']: give one column"]),
    ("custom-repeated-label", lambda w: _ft(w, "custom", _file(w, "c4.csv", "text,label\ngood,pos\nbad,neg\n"),
                                            "data.text_columns=[text]", "data.label_column=label",
                                            "data.labels=[neg,neg,pos]"),
     ["lists 'neg' twice"]),
    ("custom-unknown-metric", lambda w: _ft(w, "custom", _file(w, "c5.csv", "text,label\ngood,pos\nbad,neg\n"),
                                            "data.text_columns=[text]", "data.label_column=label",
                                            "data.labels=[neg,pos]", "data.metric=bogus"),
     ["data.metric='bogus' is not a classification metric", "accuracy, f1, mcc"]),
    ("custom-regression-metric-for-labels", lambda w: _ft(w, "custom", _file(w, "c6.csv", "text,label\ngood,pos\n"),
                                                          "data.text_columns=[text]", "data.label_column=label",
                                                          "data.labels=[neg,pos]", "data.metric=pearson"),
     ["data.metric='pearson' is not a classification metric"]),
    ("stsb-classification-metric", lambda w: _ft(w, "stsb", w.train, "data.metric=accuracy"),
     ["data.metric='accuracy' is not a regression metric", "pearson, spearman"]),
    ("decode-threads-negative", lambda w: ["translate", "decode", "--model", w.run, "--input", w.train,
                                           "--threads", -1], ["--threads=-1 must be a whole number ≥ 1"]),
    ("decode-batch-tokens-zero", lambda w: ["translate", "decode", "--model", w.run, "--input", w.train,
                                            "--batch-tokens", 0], ["--batch-tokens=0 must be"]),
    ("recipe-is-a-directory", lambda w: _ft(w, "sst2", w.train, "--recipe", w.d), ["is a directory"]),
    ("evaluate-custom-on-a-glue-model", lambda w: ["evaluate", "--model", w.run, "--data", w.train, "--task",
                                                   "custom"], ["was not fine-tuned on a custom task"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_one_line_error(case, w, capsys):
    name, argv, needles = case
    line = cli_error_line(argv(w), capsys, untouched=w.run)
    for n in needles:
        assert n in line, (n, line)


def test_evaluate_on_an_interrupted_run_says_to_resume(w, capsys):
    run = w.d / "stopped"
    for step in (2, 10):
        (run / "checkpoints" / f"step-{step}").mkdir(parents=True)
    line = cli_error_line(["evaluate", "--model", run, "--data", w.train], capsys, untouched=w.run)
    assert "holds checkpoints but no final model" in line and "--resume" in line
    assert line.rstrip().endswith("step-10")  # the newest by number, not by name


@pytest.mark.parametrize("head,labels", [("token_classification", 9), ("question_answering", 2),
                                         ("sequence_classification", 2)])
def test_embed_eval_task_needs_a_classifier_of_the_task(w, capsys, head, labels):
    """A tagger or QA model (one output per token) or a 2-label model on STS-B (1 output) is refused; each
    was scored before (a crash in np.stack, or Pearson of argmax labels)."""
    from bertforge.hf import load_pretrained
    from bertforge.models.heads import TaskModel
    base = load_pretrained(w.tiny)
    base.config.num_labels = labels
    torch.manual_seed(0)
    d = w.d / f"m-{head}"
    TaskModel(base.config, head=head).save_pretrained(d, tokenizer_dir=w.tiny)
    stsb = _file(w, "stsb.tsv", "sentence1\tsentence2\tscore\na good film\ta fine film\t4.0\n"
                                "a bad film\ta dull film\t1.0\n")
    task, data = ("stsb", stsb) if head == "sequence_classification" else ("sst2", w.train)
    line = cli_error_line(["embed-eval", "--model", f"m={d}", "--rounds", 1, "--iters", 1, "--seq-len", 32,
                           "--lee-max-seq-len", 32, "--max-seq-len", 32, "--task", task,
                           "--data", data, "--no-progress"], capsys, untouched=w.run)
    want = "predicts 2 labels but task stsb has 1" if task == "stsb" else "is not a sequence classifier"
    assert want in line, line


def test_line_separators_inside_a_field_are_text(w):
    """U+2028 inside a JSON string (valid JSON; json.dumps(ensure_ascii=False) writes it raw) and a form
    feed inside a TSV cell stay in the example's text instead of splitting the row."""
    from bertforge.data.readers import read_examples
    from bertforge.data.tasks import get_task
    task = get_task("sst2")
    row = json.dumps({"sentence": "good\u2028movie", "label": "1"}, ensure_ascii=False)
    assert "\u2028" in row
    ex = read_examples(_file(w, "u.jsonl", row + "\n"), task)
    assert len(ex) == 1 and ex[0].text_a == "good\u2028movie"
    ex = read_examples(_file(w, "ff.tsv", "sentence\tlabel\ngood\x0cmovie\t1\r\nbad one\t0\n"), task)
    assert [(e.text_a, e.label) for e in ex] == [("good\x0cmovie", 1), ("bad one", 0)]
    from bertforge.data.conll import read_token_jsonl
    toks = read_token_jsonl(_file(w, "t.jsonl", json.dumps({"tokens": ["a\u2028b", "c"], "tags": ["O", "O"]},
                                                           ensure_ascii=False) + "\n"))
    assert toks[0].tokens == ["a\u2028b", "c"]


def test_embedded_corpus_names_the_empty_part_and_creates_nothing(tmp_path, capsys):
    out = tmp_path / "corpus"
    line = cli_error_line(["embedded-corpus", "--out", out, "--max-documents", 1], capsys, untouched=tmp_path)
    assert "part came out empty" in line and "--max-documents" in line and "max_documents" not in line
    assert not out.exists()


def test_f1_averaging_follows_the_task_not_the_sample(w, capsys):
    """Hand-computed: ref [0,1,1,0], pred [0,1,0,0]. 2 labels: F1 of class 1 = 2/3. 3 labels (class 2 in
    neither side): macro of the present classes 0.8 and 2/3 = 0.7333, and perfect predictions give 1. A
    3-label custom task with data.metric=f1 trains and evaluates (it crashed in sklearn when the eval file
    held 2 of the 3 labels)."""
    from bertforge.cli import main
    from bertforge.evaluate.metrics import compute
    ref, pred = [0, 1, 1, 0], [0, 1, 0, 0]
    assert compute(["f1"], pred, ref, 2)["f1"] == pytest.approx(2 / 3)
    assert compute(["f1"], pred, ref, 3)["f1"] == pytest.approx((0.8 + 2 / 3) / 2)
    assert compute(["f1"], ref, ref, 3)["f1"] == 1.0
    assert compute(["f1"], [0, 2, 1], [0, 1, 1], 3)["f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)  # a false class 2
    data = _file(w, "three.csv", "text,label\n" + "".join(f"{s},{'pos' if y else 'neg'}\n"
                                                          for s, y in sentences(16, 3)))
    out = w.d / "f1run"
    assert main(["finetune", "--model", str(w.tiny), "--task", "custom", "--train", str(data), "--eval",
                 str(data), "--out", str(out), "--max-steps", "1", "--batch-size", "4", "--max-seq-len", "32",
                 "--no-progress", "data.text_columns=[text]", "data.label_column=label",
                 "data.labels=[neg,pos,neutral]", "data.metric=f1"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--model", str(out), "--data", str(data)]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.0 <= res["f1"] <= 1.0


def test_a_sharded_transformers_checkpoint_loads(w, tmp_path):
    """transformers' save_pretrained(max_shard_size=…) writes an index and shards: bertforge reads them
    and gives transformers' logits on the same weights; a missing shard is a CheckpointError."""
    import shutil

    import transformers

    from bertforge.errors import CheckpointError
    from bertforge.hf import load_pretrained
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=load_pretrained(w.tiny).config.vocab_size, hidden_size=32,
                                  num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=64)
    hf = transformers.BertForSequenceClassification(cfg).eval()
    d = tmp_path / "sharded"
    hf.save_pretrained(d, max_shard_size="40KB")
    index = d / "model.safetensors.index.json"
    assert index.is_file() and len(set(json.loads(index.read_text())["weight_map"].values())) > 1
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(w.tiny / f, d / f)
    ids = torch.randint(5, cfg.vocab_size, (2, 9))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        ours = load_pretrained(d).eval()(ids, mask).logits
        ref = hf(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(ours, ref, atol=1e-5), (ours - ref).abs().max()
    from bertforge.evaluate.embedded import load_embedder
    shards = sorted(d.glob("model-*.safetensors"))
    assert load_embedder(d).size_mb == pytest.approx(sum(f.stat().st_size for f in shards) / 1e6)
    next(p for p in d.iterdir() if p.name.startswith("model-")).unlink()
    with pytest.raises(CheckpointError, match="not a file beside it"):
        load_pretrained(d)


def test_save_pretrained_checks_its_tokenizer_arguments_first(w, tmp_path):
    from bertforge.errors import ConfigError
    from bertforge.hf import load_pretrained
    m = load_pretrained(w.tiny)
    for kw, msg in (({"tokenizer_dir": tmp_path / "nope"}, "holds no tokenizer file"),
                    ({"tokenizer_dir": tmp_path}, "holds no tokenizer file"),
                    ({"tokenizer": "x"}, "pass a tokenizers.Tokenizer")):
        with pytest.raises(ConfigError, match=msg):
            m.save_pretrained(tmp_path / "out", **kw)
        assert not (tmp_path / "out").exists()  # nothing written
    m.save_pretrained(tmp_path / "ok", tokenizer_dir=w.tiny)
    assert (tmp_path / "ok" / "tokenizer.json").is_file()


def test_strict_head_and_a_config_that_disagrees_with_the_weights(w, tmp_path, capsys):
    """strict_head=True refuses a head that would start fresh; a config whose hidden size disagrees with
    the weights is named as such, without a false note about the head's label count."""
    import shutil

    from bertforge.errors import CheckpointError
    from bertforge.hf import load_pretrained
    with pytest.raises(CheckpointError, match="sequence_classification head weights not in"):
        load_pretrained(w.tiny, head="sequence_classification", strict_head=True)
    assert load_pretrained(w.run, strict_head=True).head is not None  # a trained head loads
    bad = tmp_path / "bad"
    shutil.copytree(w.run, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg.update(hidden_size=64, intermediate_size=64)
    cfg.pop("embedding_size", None)
    (bad / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    with pytest.raises(CheckpointError, match="config.json and the weights disagree"):
        load_pretrained(bad)
    assert "output(s)" not in capsys.readouterr().err


def test_a_mistyped_local_path_is_not_tried_on_the_hub(w, tmp_path, monkeypatch, capsys):
    from bertforge.hf import resolve_model_dir
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert resolve_model_dir("runs/qa") == tmp_path.joinpath("runs/qa").relative_to(tmp_path)
    assert resolve_model_dir("a/b/c") == type(tmp_path)("a/b/c")  # not of the owner/name form
    line = cli_error_line(["evaluate", "--model", "runs/qa", "--data", w.train], capsys, untouched=w.run)
    assert "runs/qa does not exist" in line and "hub" not in line


def test_forward_names_bad_ids_and_segments(w):
    from bertforge.hf import load_pretrained
    m = load_pretrained(w.tiny)
    v = m.config.vocab_size
    ok = torch.tensor([[2, 5, 3]])
    for kwargs, msg in (({"input_ids": torch.tensor([[2, v, 3]])}, f"id {v}, outside the vocabulary"),
                        ({"input_ids": torch.tensor([[2, -1, 3]])}, "id -1, outside the vocabulary"),
                        ({"input_ids": ok, "token_type_ids": torch.tensor([[0, 2, 0]])}, "segment ids 0…1"),
                        ({"input_ids": ok, "token_type_ids": torch.zeros(1, 4, dtype=torch.long)},
                         r"token_type_ids has shape \(1, 4\)"),
                        ({"input_ids": torch.zeros(1, 0, dtype=torch.long)}, "hold no token")):
        with pytest.raises(ValueError, match=msg):
            m(**kwargs)
    assert m(ok, token_type_ids=torch.tensor([[0, 1, 1]])).last_hidden_state.shape == (1, 3, 32)
    assert m(torch.zeros((0, 5), dtype=torch.long)).last_hidden_state.shape == (0, 5, 32)  # an empty batch


def test_a_json_array_of_positional_rows_still_reads(w):
    from bertforge.data.readers import read_examples
    from bertforge.data.tasks import get_task
    task = get_task("custom", text_columns=[0], label_column=1, labels=["0", "1"])
    ex = read_examples(_file(w, "arr.json", '[["good movie", "1"], ["bad film", "0"]]'), task)
    assert [(e.text_a, e.label) for e in ex] == [("good movie", 1), ("bad film", 0)]


def test_resume_ignores_settings_only_one_version_records():
    """A run started before pretrain.max_ngram existed (or whose recipe recorded model.embedding_size for
    an E = H family) still resumes; a recorded value that changed is still named."""
    from bertforge.commands._resume_policy import _recipe_changes
    old = {"model": {"hidden_size": 32, "embedding_size": 64}, "pretrain": {"scheme": "token"}}
    assert _recipe_changes(old, {"model": {"hidden_size": 32}, "pretrain": {"scheme": "token", "max_ngram": 3}}) == ""
    assert "pretrain.scheme 'token' → 'ngram'" in _recipe_changes(old, {"model": {"hidden_size": 32},
                                                                         "pretrain": {"scheme": "ngram"}})
