"""GLUE files as the GLUE distribution ships them, through `predict`: every task's unlabelled test file (its
own header, an index, no label), an `id` on every prediction (the index / id column, else the line number),
`--format glue` (the GLUE server's `index<TAB>prediction` TSV), and rows with a stray field refused with
FILE:LINE (a tab or comma inside a text must not shift or cut it).

The models are tiny random BERTs whose classifier has zero weights and a chosen bias, so every prediction is
known by hand (label = argmax of the bias, prob = its softmax, score = the bias)."""
import json
import math
from pathlib import Path

import pytest

from bertforge.cli import main
from bertforge.data.readers import read_examples
from bertforge.errors import DataError
from bertforge.tasks import get_task

from helpers import make_tiny_checkpoint, sentences

# (labels, classifier bias): the label every input gets; regression: the score
KINDS = {"01": (("0", "1"), (0.0, 3.0)), "nli2": (("entailment", "not_entailment"), (3.0, 0.0)),
         "nli3": (("contradiction", "entailment", "neutral"), (0.0, 0.0, 3.0)), "score": (None, (2.5,))}
KIND_OF = {"cola": "01", "sst2": "01", "mrpc": "01", "qqp": "01", "wnli": "01", "qnli": "nli2", "rte": "nli2",
           "mnli": "nli3", "mnli-mm": "nli3", "stsb": "score"}
P_TOP = math.exp(3) / (math.exp(3) + 1)  # softmax of (0, 3) at 3
P_TOP3 = math.exp(3) / (math.exp(3) + 2)  # softmax of (0, 0, 3) at 3


def _classifier(path: Path, tok_dir: Path, labels, bias, random_head: bool = False) -> Path:
    import torch
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    from bertforge.tokenizer import load_tokenizer
    n = len(bias)
    cfg = ModelConfig(model_type="bert", vocab_size=load_tokenizer(tok_dir).get_vocab_size(), hidden_size=32,
                      num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                      max_position_embeddings=64, num_labels=n,
                      problem_type="regression" if labels is None else "single_label_classification",
                      id2label={i: lab for i, lab in enumerate(labels or ("score",))},
                      bertforge={"max_seq_len": 32})
    torch.manual_seed(0)
    m = TaskModel(cfg, head="sequence_classification")
    with torch.no_grad():
        if random_head:  # logits far apart, so each row's probability is its own
            m.head.classifier.weight.mul_(100.0)
        else:
            m.head.classifier.weight.zero_()
            m.head.classifier.bias.copy_(torch.tensor(bias))
    m.save_pretrained(path, tokenizer=load_tokenizer(tok_dir))
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("glue-models")
    tiny = make_tiny_checkpoint(d / "tiny")
    out = {k: _classifier(d / k, tiny, labels, bias) for k, (labels, bias) in KINDS.items()}
    out["random"] = _classifier(d / "random", tiny, ("0", "1"), (0.0, 0.0), random_head=True)
    return out


# one or two rows of each GLUE test file, header and columns exactly as in the GLUE distribution (indexes
# chosen out of order, to show they are read from the file)
GLUE_TEST_FILES = {
    "cola": "index\tsentence\n0\tBill whistled past the house.\n7\tThe car honked its way down the road.\n",
    "sst2": "index\tsentence\n0\tuneasy mishmash of styles and genres .\n"
            "1\tthis film 's relationship to actual tension is the same as what christmas-tree flocking is .\n",
    "mrpc": "index\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
            "0\t1089874\t1089925\tPCCW 's chief operating officer , Mike Butcher , will report to Mr So .\t"
            "Chief Operating Officer Mike Butcher will report to So .\n"
            "3\t3019446\t3019327\tThe world 's two largest automakers said their U.S. sales declined .\t"
            "Domestic sales at both GM and No. 2 Ford Motor Co. declined .\n",
    "stsb": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\n"
            "0\tmain-captions\tMSRvid\t2012test\t0024\tnone\tnone\tA girl is styling her hair.\t"
            "A girl is brushing her hair.\n"
            "1\tmain-captions\tMSRvid\t2012test\t0033\tnone\tnone\tA group of men play soccer on the beach.\t"
            "A group of boys are playing soccer on the beach.\n",
    "qqp": "id\tquestion1\tquestion2\n0\tWould the idea of Trump and Putin in bed together scare you?\t"
           "Do you think that if Donald Trump were elected President, he would scare you?\n"
           "12\tWhat are the top ten Consumer-to-Consumer E-commerce online?\tWhat are the top ten C2C sites?\n",
    "mnli": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
            "sentence2_parse\tsentence1\tsentence2\n"
            "0\t31493\t31493\ttravel\t( ( Hierbas ) )\t( ( Hierbas ) )\t(ROOT (S))\t(ROOT (S))\t"
            "Hierbas, ans seco, and ans dulce are the rage.\tHierbas is a name worth looking out for.\n",
    "mnli-mm": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
               "sentence2_parse\tsentence1\tsentence2\n"
               "5\t75\t75c\tletters\t( x )\t( y )\t(ROOT)\t(ROOT)\tYour contribution helped.\tYou gave nothing.\n",
    "qnli": "index\tquestion\tsentence\n0\tWhat organization is devoted to Jihad against Israel?\t"
            "For some decades prior to the First Palestine Intifada, the Muslim Brotherhood grew.\n",
    "rte": "index\tsentence1\tsentence2\n0\tMaude and Dora had seen the trains rushing across the prairie.\t"
           "Maude and Dora had seen trains.\n1\tDana Reeve died.\tChristopher Reeve had an accident.\n",
    "wnli": "index\tsentence1\tsentence2\n0\tMaude and Dora had seen the trains rushing across the prairie.\t"
            "Maude and Dora had seen trains.\n",
}

# what `--format glue` must write for each file, by hand: the index, then the label the bias picks
GLUE_EXPECTED = {
    "cola": "index\tprediction\n0\t1\n7\t1\n",
    "sst2": "index\tprediction\n0\t1\n1\t1\n",
    "mrpc": "index\tprediction\n0\t1\n3\t1\n",
    "stsb": "index\tprediction\n0\t2.5\n1\t2.5\n",
    "qqp": "index\tprediction\n0\t1\n12\t1\n",
    "mnli": "index\tprediction\n0\tneutral\n",
    "mnli-mm": "index\tprediction\n5\tneutral\n",
    "qnli": "index\tprediction\n0\tentailment\n",
    "rte": "index\tprediction\n0\tentailment\n1\tentailment\n",
    "wnli": "index\tprediction\n0\t1\n",
}


def _predict(capsys, *argv):
    capsys.readouterr()
    rc = main(["predict", *map(str, argv)])
    return rc, capsys.readouterr()


@pytest.mark.parametrize("name", sorted(GLUE_TEST_FILES))
def test_each_glue_test_file_predicts_with_its_index(name, models, tmp_path, capsys):
    data = tmp_path / "test.tsv"
    data.write_text(GLUE_TEST_FILES[name], encoding="utf-8")
    model = models[KIND_OF[name]]
    rc, cap = _predict(capsys, "--model", model, "--task", name, "--data", data, "--out", tmp_path / "p.jsonl")
    assert rc == 0, cap.err
    rows = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    index = [line.split("\t")[0] for line in GLUE_TEST_FILES[name].splitlines()[1:]]
    assert [r["id"] for r in rows] == index
    if name == "stsb":
        assert [list(r) for r in rows] == [["id", "score"]] * len(rows)
        assert all(r["score"] == 2.5 for r in rows)
    else:
        assert [list(r) for r in rows] == [["id", "label", "prob"]] * len(rows)
        assert all(r["prob"] == pytest.approx(P_TOP3 if KIND_OF[name] == "nli3" else P_TOP, abs=1e-6)
                   for r in rows)
    rc, cap = _predict(capsys, "--model", model, "--task", name, "--data", data, "--out", tmp_path / "p.tsv",
                       "--format", "glue")
    assert rc == 0, cap.err
    assert (tmp_path / "p.tsv").read_text() == GLUE_EXPECTED[name]


def test_glue_diagnostic_ax_with_an_mnli_model(models, tmp_path, capsys):
    """GLUE's diagnostic set (AX.tsv: index, sentence1, sentence2) is predicted by the MNLI model."""
    data = tmp_path / "AX.tsv"
    data.write_text("index\tsentence1\tsentence2\n0\tThe cat sat on the mat.\tThe cat did not sit on the mat.\n"
                    "1\tThe cat did not sit on the mat.\tThe cat sat on the mat.\n")
    rc, cap = _predict(capsys, "--model", models["nli3"], "--task", "mnli", "--data", data, "--out",
                       tmp_path / "out.tsv", "--format", "glue")
    assert rc == 0, cap.err
    assert (tmp_path / "out.tsv").read_text() == "index\tprediction\n0\tneutral\n1\tneutral\n"


def test_a_test_file_where_labels_are_needed_is_named_as_such(tmp_path):
    f = tmp_path / "test.tsv"
    f.write_text(GLUE_TEST_FILES["cola"])
    with pytest.raises(DataError) as e:
        read_examples(f, get_task("cola"))
    assert str(e.value) == (f"{f} is task cola's unlabelled test file (columns: index, sentence); pass a "
                            f"labelled train/dev file here (predict reads test files)")
    # CoLA's headerless train/dev layout is read as before
    (tmp_path / "train.tsv").write_text("gj04\t1\t\tOur friends won't buy this analysis.\ngj04\t0\t*\tThey drank the pub.\n")
    ex = read_examples(tmp_path / "train.tsv", get_task("cola"))
    assert [(e.text_a, e.label, e.id) for e in ex] == [("Our friends won't buy this analysis.", 1, 1),
                                                       ("They drank the pub.", 0, 2)]


def test_real_glue_test_files(models, data_dir, tmp_path, capsys):
    """SST-2's and STS-B's test.tsv from the GLUE distribution: one line per row, ids 0 … n−1 in file order."""
    for name, path, n in (("sst2", "glue/SST-2/test.tsv", 1821), ("stsb", "glue/STS-B/test.tsv", 1379)):
        out = tmp_path / f"{name}.tsv"
        rc, cap = _predict(capsys, "--model", models[KIND_OF[name]], "--task", name, "--data", data_dir / path,
                           "--out", out, "--format", "glue")
        assert rc == 0, cap.err
        lines = out.read_text().splitlines()
        assert lines[0] == "index\tprediction" and len(lines) == n + 1
        assert [x.split("\t")[0] for x in lines[1:]] == [str(i) for i in range(n)]


def test_ids_are_the_id_column_else_the_line_number(models, tmp_path, capsys):
    """No id column: the 1-based line number (a blank line counts, the header too); a column named id:
    its text; JSONL: the "id" field, else the line number. The predictions follow their rows: each line's
    prob equals the model run on that row alone."""
    import torch
    from bertforge.checkpoint import load_pretrained
    from bertforge.tokenizer import encode_texts, load_tokenizer
    rows = sentences(7, 3)
    f = tmp_path / "plain.tsv"
    f.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows[:3]) + "\n"
                 + "".join(f"{s}\t{y}\n" for s, y in rows[3:]))
    rc, cap = _predict(capsys, "--model", models["random"], "--task", "sst2", "--data", f, "--out",
                       tmp_path / "a.jsonl")
    assert rc == 0, cap.err
    got = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [g["id"] for g in got] == [2, 3, 4, 6, 7, 8, 9]
    model = load_pretrained(models["random"], head="sequence_classification").eval()
    tok = load_tokenizer(models["random"])
    for (s, _), g in zip(rows, got):
        ids = torch.tensor([encode_texts(tok, [s], None, 32)[0].ids])
        with torch.no_grad():
            p = torch.softmax(model(ids).logits[0].double(), -1)
        assert (g["label"], g["prob"]) == (str(int(p.argmax())), pytest.approx(float(p.max()), abs=1e-5))
    # a custom file with an id column (CSV), and JSONL with and without "id"
    c = tmp_path / "c.csv"
    c.write_text("id,text\nr-9,good film\nr-2,\"bad, dull plot\"\n")
    spec = get_task("custom", text_columns=["text"], label_column="label", labels=["0", "1"])
    assert [e.id for e in read_examples(c, spec, require_labels=False)] == ["r-9", "r-2"]
    j = tmp_path / "j.jsonl"
    j.write_text('{"sentence": "good film", "id": 41}\n\n{"sentence": "bad plot"}\n')
    assert [e.id for e in read_examples(j, get_task("sst2"), require_labels=False)] == [41, 3]


_TAB = "remove the stray tab (a tab inside a text splits it into fields)"


@pytest.mark.parametrize("task,text,message", [
    ("sst2", "sentence\tlabel\ngood film\t1\nnice\t1\textra\n", "{f}:3 has 3 fields where the header has 2; " + _TAB),
    ("sst2", "sentence\tlabel\nnice\textra\t1\ngood film\t1\n", "{f}:2 has 3 fields where the header has 2; " + _TAB),
    ("rte", "index\tsentence1\tsentence2\tlabel\n0\tA man\tsleeps.\tA man rests.\tentailment\n",
     "{f}:2 has 5 fields where the header has 4; " + _TAB),
    ("rte", "index\tsentence1\tsentence2\n0\tA man sleeps.\tA man\trests.\n",
     "{f}:2 has 4 fields where the header has 3; " + _TAB),
    ("rte", "index\tsentence1\tsentence2\n0\tA man sleeps.\tA man\nrests.\n",
     "{f}:3 has 1 field where the header has 3; fill in the missing fields (a line break inside a text cuts "
     "its row in two)"),
    ("sst2", "sentence\tlabel\ngood film\t1\n   \t0\n",
     "{f}:3 has an empty text in column 'sentence'; give the example's text or remove the row"),
    ("rte", "index\tsentence1\tsentence2\n0\tA man sleeps.\t\n",
     "{f}:2 has an empty text in column 'sentence2'; give the example's text or remove the row"),
], ids=["extra-field-after-label", "extra-field-inside", "pair-tab-inside-sentence", "test-file-tab-inside",
        "line-break-cuts-a-row", "blank-text", "empty-second-text"])
def test_rows_with_a_stray_field_are_refused(task, text, message, models, tmp_path, cli_error):
    f = tmp_path / "data.tsv"
    f.write_text(text)
    out = tmp_path / "p.jsonl"
    model = models[KIND_OF[task]]
    line = cli_error(["predict", "--model", model, "--task", task, "--data", f, "--out", out], model)
    assert line == "bertforge: error: " + message.format(f=f)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.tsv"]  # nothing written


def test_headerless_and_csv_rows_with_a_stray_field(tmp_path):
    spec = get_task("custom", text_columns=[0], label_column=1, labels=["0", "1"], header=False)
    f = tmp_path / "h.tsv"
    f.write_text("good film\t1\nnice\t1\textra\nbad plot\t0\n")
    with pytest.raises(DataError) as e:
        read_examples(f, spec)
    assert str(e.value) == (f"{f}:2 has 3 fields where the file's other rows have 2; remove the stray tab (a "
                            f"tab inside a text splits it into fields)")
    c = tmp_path / "s.csv"
    c.write_text('sentence,label\n"nice, really",1\nnice,1,extra\n')
    with pytest.raises(DataError) as e:
        read_examples(c, get_task("sst2"))
    assert str(e.value) == (f'{c}:3 has 3 fields where the header has 2; quote a text that holds a comma '
                            f'("a, b") or remove the stray comma')
    c.write_text('sentence,label\n"nice, really",1\n"a quoted\nline break",0\n')  # quoted: one field
    assert [(x.text_a, x.label, x.id) for x in read_examples(c, get_task("sst2"))] == \
        [("nice, really", 1, 2), ("a quoted\nline break", 0, 3)]
    # CoLA's headerless layout: the file's other rows have 4
    g = tmp_path / "cola.tsv"
    g.write_text("gj04\t1\t\tGood.\ngj04\t0\t*\tThey\tdrank the pub.\ngj04\t1\t\tFine.\n")
    with pytest.raises(DataError, match=r"cola\.tsv:2 has 5 fields where the file's other rows have 4"):
        read_examples(g, get_task("cola"))


def test_glue_output_keeps_the_overwrite_rules(models, tmp_path, capsys, cli_error):
    data = tmp_path / "test.tsv"
    data.write_text(GLUE_TEST_FILES["rte"])
    out = tmp_path / "RTE.tsv"
    out.write_text("earlier\n")
    argv = ["predict", "--model", models["nli2"], "--task", "rte", "--data", data, "--out", out, "--format", "glue"]
    line = cli_error(argv, models["nli2"])
    assert "--overwrite" in line and out.read_text() == "earlier\n"
    rc, cap = _predict(capsys, *argv[1:], "--overwrite")
    assert rc == 0, cap.err
    assert out.read_text() == GLUE_EXPECTED["rte"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["RTE.tsv", "test.tsv"]  # no temp file left
    # --format glue is for sequence tasks
    line = cli_error(["predict", "--model", models["nli2"], "--task", "conll2003", "--data", data, "--out",
                      tmp_path / "n.tsv", "--format", "glue"], models["nli2"])
    assert line == ("bertforge: error: --format glue writes sentence (pair) classification and regression "
                    "predictions; task conll2003 is token_classification: use --format jsonl")
