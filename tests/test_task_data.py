"""Task registry and readers: the nine GLUE layouts as the GLUE distribution ships them, generic
CSV/TSV/JSONL/JSON (line separators inside a field are text), collation of labelled and unlabelled rows,
metrics against hand-computed values."""
import json

import numpy as np
import pytest

from bertforge.data.readers import read_examples
from bertforge.tasks import TASKS, get_task
from bertforge.errors import ConfigError, DataError
from bertforge.metrics.task import compute

from helpers import sentences, write_file

# one or two rows of each GLUE file, header and column order exactly as in the GLUE distribution
GLUE_FILES = {
    "cola": ("gj04\t1\t\tOur friends won't buy this analysis, let alone the next one we propose.\n"
             "gj04\t0\t*\tThey drank the pub.\n", ("Our friends won't buy this analysis, let alone the next one we propose.", None, 1)),
    "sst2": ("sentence\tlabel\nhide new secretions from the parental units \t0\n", ("hide new secretions from the parental units ", None, 0)),
    "mrpc": ("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
             "1\t702876\t702977\tAmrozi accused his brother .\tReferring to him as only \" the witness \" .\n",
             ("Amrozi accused his brother .", "Referring to him as only \" the witness \" .", 1)),
    "stsb": ("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
             "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane is taking off.\tAn air plane is taking off.\t5.000\n",
             ("A plane is taking off.", "An air plane is taking off.", 5.0)),
    "qqp": ("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
            "133273\t213221\t213222\tHow is the life of a math student?\tWhich level of prepration is enough?\t0\n",
            ("How is the life of a math student?", "Which level of prepration is enough?", 0)),
    "mnli": ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
             "sentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n"
             "0\t63735\t63735n\tslate\t( ( The ) )\t( ( The ) )\t(ROOT)\t(ROOT)\tThe new rights are nice enough\t"
             "Everyone really likes the newest benefits \tneutral\tentailment\tneutral\tneutral\tneutral\tneutral\n",
             ("The new rights are nice enough", "Everyone really likes the newest benefits ", 2)),
    "mnli-mm": ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
                "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n"
                "0\t75\t75c\tletters\t( x )\t( y )\t(ROOT)\t(ROOT)\tYour contribution helped.\tYou gave nothing.\t"
                "contradiction\tcontradiction\n", ("Your contribution helped.", "You gave nothing.", 0)),
    "qnli": ("index\tquestion\tsentence\tlabel\n0\tWhat came into force?\tThe treaty came into force.\tentailment\n",
             ("What came into force?", "The treaty came into force.", 0)),
    "rte": ("index\tsentence1\tsentence2\tlabel\n0\tDana Reeve died.\tChristopher Reeve had an accident.\tnot_entailment\n",
            ("Dana Reeve died.", "Christopher Reeve had an accident.", 1)),
    "wnli": ("index\tsentence1\tsentence2\tlabel\n0\tI stuck a pin through a carrot.\tThe carrot had a hole.\t1\n",
             ("I stuck a pin through a carrot.", "The carrot had a hole.", 1)),
}


@pytest.mark.parametrize("name", sorted(GLUE_FILES))
def test_glue_layouts(name, tmp_path):
    text, (a, b, label) = GLUE_FILES[name]
    f = tmp_path / f"{name}.tsv"
    f.write_text(text, encoding="utf-8")
    ex = read_examples(f, get_task(name))
    assert (ex[0].text_a, ex[0].text_b, ex[0].label) == (a, b, label)


def test_all_nine_glue_tasks_registered():
    assert {"cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "mnli-mm", "qnli", "rte", "wnli"} <= set(TASKS)
    assert get_task("SST-2").name == "sst2" and get_task("STS-B").kind == "regression"
    assert get_task("cola").metrics[0] == "mcc" and get_task("mrpc").metrics[0] == "f1"
    assert get_task("stsb").metrics == ("pearson", "spearman")


def test_real_glue_files(data_dir):
    sst = read_examples(data_dir / "glue/SST-2/dev.tsv", get_task("sst2"))
    assert len(sst) == 872 and {e.label for e in sst} == {0, 1}
    sts = read_examples(data_dir / "glue/STS-B/dev.tsv", get_task("stsb"))
    assert len(sts) == 1500 and all(0.0 <= e.label <= 5.0 for e in sts)
    qnli = read_examples(data_dir / "glue/QNLI/dev.tsv", get_task("qnli"))
    assert len(qnli) == 5463 and all(e.text_b for e in qnli)


def test_generic_csv_tsv_jsonl_named_and_positional(tmp_path):
    (tmp_path / "a.csv").write_text('text,label\n"Good, really",pos\nbad,neg\n')
    t = get_task("custom", text_columns=["text"], label_column="label", labels=["neg", "pos"])
    ex = read_examples(tmp_path / "a.csv", t)
    assert [(e.text_a, e.label) for e in ex] == [("Good, really", 1), ("bad", 0)]
    (tmp_path / "b.tsv").write_text("pos\tfirst\tsecond\nneg\tthird\tfourth\n")
    t2 = get_task("custom", text_columns=[1, 2], label_column=0, labels=["neg", "pos"], header=False)
    ex2 = read_examples(tmp_path / "b.tsv", t2)
    assert [(e.text_a, e.text_b, e.label) for e in ex2] == [("first", "second", 1), ("third", "fourth", 0)]
    (tmp_path / "c.jsonl").write_text(json.dumps({"s": "x y", "y": 2.5}) + "\n\n" + json.dumps({"s": "z", "y": 1}) + "\n")
    t3 = get_task("custom", text_columns=["s"], label_column="y")
    ex3 = read_examples(tmp_path / "c.jsonl", t3)
    assert [(e.text_a, e.label) for e in ex3] == [("x y", 2.5), ("z", 1.0)] and t3.kind == "regression"
    # a registered task read from CSV by column names
    (tmp_path / "d.csv").write_text("label,sentence\n1,fine film\n")
    assert read_examples(tmp_path / "d.csv", get_task("sst2"))[0].label == 1


@pytest.mark.parametrize("content,fragment", [
    ("", "is empty"),
    ("text\tlabel\nhello\t0\n", "has no column 'sentence'"),
    ("sentence\tlabel\nhello\t7\n", "not in task sst2's label set"),
])
def test_reader_errors_name_file_and_fix(tmp_path, content, fragment):
    f = tmp_path / "bad.tsv"
    f.write_text(content)
    with pytest.raises(DataError) as e:
        read_examples(f, get_task("sst2"))
    assert fragment in str(e.value) and str(f) in str(e.value) and "\n" not in str(e.value)


def test_non_utf8_and_missing_file(tmp_path):
    f = tmp_path / "latin.tsv"
    f.write_bytes("sentence\tlabel\ncaf\xe9\t1\n".encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8"):
        read_examples(f, get_task("sst2"))
    with pytest.raises(DataError, match="does not exist"):
        read_examples(tmp_path / "nope.tsv", get_task("sst2"))
    with pytest.raises(ConfigError, match="unknown task"):
        get_task("sst3")


def test_metrics_hand_computed():
    pred, ref = np.array([1, 0, 1, 1, 0, 1]), np.array([1, 0, 0, 1, 1, 1])
    m = compute(("accuracy", "f1", "mcc"), pred, ref)
    # TP=3 FP=1 FN=1 TN=1: acc 4/6, F1 = 2·3/(2·3+1+1) = 0.75, MCC = (3·1−1·1)/√(4·4·2·2) = 0.25
    assert m["accuracy"] == pytest.approx(4 / 6)
    assert m["f1"] == pytest.approx(0.75)
    assert m["mcc"] == pytest.approx(0.25)
    x, y = np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 3.0, 2.0, 5.0])
    c = compute(("pearson", "spearman"), x, y)
    # Spearman from ranks (1,2,3,4) vs (1,3,2,4): 1 − 6·Σd²/(n(n²−1)) = 1 − 6·2/60 = 0.8
    assert c["spearman"] == pytest.approx(0.8)
    xm, ym = x - x.mean(), y - y.mean()
    assert c["pearson"] == pytest.approx((xm @ ym) / np.sqrt((xm @ xm) * (ym @ ym)))


def test_hub_mnli_labels_follow_their_names(monkeypatch):
    """The hub's glue/mnli numbers its ClassLabel entailment, neutral, contradiction; the task (and the GLUE
    TSVs) contradiction, entailment, neutral. Hub ids are mapped by name, so one sentence pair gets the
    same label from either source (hub 'entailment' (0) is not read as the task's 'contradiction')."""
    datasets = pytest.importorskip("datasets")
    rows = {"premise": ["p0", "p1", "p2"], "hypothesis": ["h0", "h1", "h2"], "label": [0, 1, 2]}
    hub_names = ["entailment", "neutral", "contradiction"]

    def fake_load_dataset(name, config=None, split=None, **kw):
        assert (name, config) == ("glue", "mnli")
        feats = datasets.Features({"premise": datasets.Value("string"), "hypothesis": datasets.Value("string"),
                                   "label": datasets.ClassLabel(names=hub_names)})
        return datasets.Dataset.from_dict(rows, features=feats)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    task = get_task("mnli")
    got = [task.labels[e.label] for e in read_examples("glue:train", task)]
    assert got == hub_names
    # a hub set whose names are not the task's labels (SST-2: negative/positive for "0"/"1") keeps its ids
    sst2 = get_task("sst2")
    hub_names = ["negative", "positive"]
    rows = {"sentence": ["bad", "good"], "label": [0, 1]}

    def fake_sst2(name, config=None, split=None, **kw):
        feats = datasets.Features({"sentence": datasets.Value("string"), "label": datasets.ClassLabel(names=hub_names)})
        return datasets.Dataset.from_dict(rows, features=feats)
    monkeypatch.setattr(datasets, "load_dataset", fake_sst2)
    assert [e.label for e in read_examples("glue:train", sst2)] == [0, 1]


def test_non_finite_regression_labels_are_refused_and_nan_metrics_print_as_null(tmp_path, capsys):
    """An STS-B score 'nan' (or inf) is refused with its row named, rather than read as a label (training
    would then fail with "loss became nan … lower train.lr"); a non-finite metric prints as null, since
    `"pearson": NaN` is not JSON."""
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    row = "{i}\tm\tf\t2012\t{i}\tn\tn\tA man plays.\tA man is playing.\t{s}\n"
    for bad in ("nan", "inf", "-Infinity"):
        f = tmp_path / f"stsb_{bad}.tsv"
        f.write_text(head + row.format(i=0, s="2.5") + row.format(i=1, s=bad))
        with pytest.raises(DataError, match=rf"stsb_{bad}.tsv:3 label '{bad}' is not a finite number"):
            read_examples(f, get_task("stsb"))
    # STS-B's scale is 0–5 (Cer et al. 2017): 7.5 is a broken row, not a very similar pair
    f = tmp_path / "stsb_range.tsv"
    f.write_text(head + row.format(i=0, s="5.0") + row.format(i=1, s="0") + row.format(i=2, s="7.5"))
    with pytest.raises(DataError, match=r"stsb_range.tsv:4 score '7.5' is outside task stsb's scale \[0, 5\]"):
        read_examples(f, get_task("stsb"))
    # undefined correlations (1 pair, a constant side) are NaN, without SciPy's error or warning
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert all(np.isnan(v) for v in compute(("pearson", "spearman"), [1.0], [2.0]).values())
        assert all(np.isnan(v) for v in compute(("pearson", "spearman"), [1.0, 2.0], [3.0, 3.0]).values())
    from bertforge.cli.commands._common import print_json

    def strict(s):  # JSON as other languages read it: NaN / Infinity are errors
        return json.loads(s, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    print_json({"pearson": float("nan"), "spearman": np.float32("inf"), "n": 3, "l": [1.5, float("-inf")]})
    assert strict(capsys.readouterr().out) == {"pearson": None, "spearman": None, "n": 3, "l": [1.5, None]}


def test_line_separators_inside_a_field_are_text(tmp_path):
    """U+2028 inside a JSON string (valid JSON; json.dumps(ensure_ascii=False) writes it raw) and a form
    feed inside a TSV cell stay in the example's text instead of splitting the row."""
    task = get_task("sst2")
    row = json.dumps({"sentence": "good\u2028movie", "label": "1"}, ensure_ascii=False)
    assert "\u2028" in row
    ex = read_examples(write_file(tmp_path / "u.jsonl", row + "\n"), task)
    assert len(ex) == 1 and ex[0].text_a == "good\u2028movie"
    ex = read_examples(write_file(tmp_path / "ff.tsv", "sentence\tlabel\ngood\x0cmovie\t1\r\nbad one\t0\n"),
                       task)
    assert [(e.text_a, e.label) for e in ex] == [("good\x0cmovie", 1), ("bad one", 0)]
    from bertforge.data.conll import read_token_jsonl
    row = json.dumps({"tokens": ["a\u2028b", "c"], "tags": ["O", "O"]}, ensure_ascii=False)
    toks = read_token_jsonl(write_file(tmp_path / "t.jsonl", row + "\n"))
    assert toks[0].tokens == ["a\u2028b", "c"]


def test_a_json_array_of_positional_rows_reads(tmp_path):
    task = get_task("custom", text_columns=[0], label_column=1, labels=["0", "1"])
    ex = read_examples(write_file(tmp_path / "arr.json", '[["good movie", "1"], ["bad film", "0"]]'), task)
    assert [(e.text_a, e.label) for e in ex] == [("good movie", 1), ("bad film", 0)]


def test_a_batch_with_labels_on_some_rows_only_is_collated_without_labels():
    """predict on a JSONL file where some rows carry a label: no KeyError, the batch simply has no labels."""
    from bertforge.data.collate import PadCollator
    rows = [{"input_ids": [5, 6, 7], "labels": 1}, {"input_ids": [8, 9]}]
    batch = PadCollator(0)(rows)
    assert "labels" not in batch and batch["input_ids"].tolist() == [[5, 6, 7], [8, 9, 0]]
    assert PadCollator(0)([rows[0], {"input_ids": [8], "labels": 0}])["labels"].tolist() == [1, 0]


def test_f1_averaging_follows_the_task_not_the_sample(workspace, tmp_path, capsys):
    """Hand-computed: ref [0,1,1,0], pred [0,1,0,0]. 2 labels: F1 of class 1 = 2/3. 3 labels (class 2 in
    neither side): macro of the present classes 0.8 and 2/3 = 0.7333, and perfect predictions give 1. A
    3-label custom task with data.metric=f1 trains and evaluates on an eval file that holds 2 of the 3
    labels."""
    from bertforge.cli import main
    ref, pred = [0, 1, 1, 0], [0, 1, 0, 0]
    assert compute(["f1"], pred, ref, 2)["f1"] == pytest.approx(2 / 3)
    assert compute(["f1"], pred, ref, 3)["f1"] == pytest.approx((0.8 + 2 / 3) / 2)
    assert compute(["f1"], ref, ref, 3)["f1"] == 1.0
    assert compute(["f1"], [0, 2, 1], [0, 1, 1], 3)["f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)  # a false class 2
    data = write_file(tmp_path / "three.csv", "text,label\n" + "".join(f"{s},{'pos' if y else 'neg'}\n"
                                                                       for s, y in sentences(16, 3)))
    out = tmp_path / "f1run"
    assert main(["finetune", "--model", str(workspace.tiny), "--task", "custom", "--train", str(data), "--eval",
                 str(data), "--out", str(out), "--max-steps", "1", "--batch-size", "4", "--max-seq-len", "32",
                 "--no-progress", "data.text_columns=[text]", "data.label_column=label",
                 "data.labels=[neg,pos,neutral]", "data.metric=f1"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--model", str(out), "--data", str(data)]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.0 <= res["f1"] <= 1.0
