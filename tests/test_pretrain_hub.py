"""``pretrain --corpus NAME[:CONFIG]`` streams a HF hub dataset (``datasets.load_dataset(…, streaming=True)``,
column ``text``, one row = one document). No network here: the hub is replaced by an in-memory dataset, and
the independent truth is the same text given as a local file (documents separated by blank lines), which must
give the same token count; offline, a name fails with one line and exit 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO, cli_env

DOCS = ["The cat sat on the mat. It was warm there.\nThe dog did not mind.",
        "Rain fell over the hills for three days. The river rose.",
        "A small house stood by the road. Nobody lived in it any more. The garden was wild."] * 20


@pytest.mark.parametrize("source,expected", [
    ("wikitext", ("wikitext", None)),
    ("wikitext:wikitext-2-raw-v1", ("wikitext", "wikitext-2-raw-v1")),
    ("Salesforce/wikitext:wikitext-103-raw-v1", ("Salesforce/wikitext", "wikitext-103-raw-v1")),
    ("wikimedia/wikipedia:20231101.en", ("wikimedia/wikipedia", "20231101.en")),
    ("corpus.txt", None), ("./wikitext", None), ("/data/wikitext", None), ("~/wikitext", None),
    ("a/b/c", None), ("tests/missing_corpus", None),  # tests/ exists here: a missing file, not a dataset
])
def test_hub_names_are_told_from_paths(source, expected):
    from bertforge.data.corpus import hub_dataset
    assert hub_dataset(source) == expected


def test_pretrain_on_a_hub_dataset_equals_the_same_text_as_a_file(tmp_path, monkeypatch, capsys):
    import datasets
    from bertforge.cli import main
    calls = []

    def fake_load_dataset(name, config=None, split=None, streaming=False, **kw):
        calls.append((name, config, split, streaming))
        if name != "someorg/tiny_corpus":
            raise FileNotFoundError(f"Dataset '{name}' doesn't exist on the Hub")
        return [{"text": d} for d in DOCS]
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    local = tmp_path / "same.txt"
    local.write_text("\n\n".join(DOCS) + "\n")
    tokens = {}
    for name, corpus in (("hub", "someorg/tiny_corpus:plain"), ("file", str(local))):
        rc = main(["pretrain", "--objective", "roberta", "--corpus", corpus, "--out", str(tmp_path / name),
                   "--max-steps", "2", "--batch-size", "4", "--max-seq-len", "32", "--vocab-size", "200",
                   "--cache-dir", str(tmp_path / f"cache-{name}"), "--doc-sep", "blank", "--no-progress",
                   "--tokenizer", "wordpiece", "model.hidden_size=32", "model.intermediate_size=64"])
        out = capsys.readouterr()
        assert rc == 0, out.err
        tokens[name] = json.loads(out.out.strip().splitlines()[-1])["corpus_tokens"]
    assert calls and all(c == ("someorg/tiny_corpus", "plain", "train", True) for c in calls)
    assert tokens["hub"] == tokens["file"] > 0


def test_an_unreachable_hub_name_is_one_line(tmp_path):
    env = cli_env(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", BERTFORGE_CACHE=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-m", "bertforge", "pretrain", "--objective", "bert", "--corpus",
                        "nosuchorg/nosuch_corpus", "--out", str(tmp_path / "o"), "--max-steps", "1"],
                       capture_output=True, text=True, env=env, cwd=str(REPO), timeout=300)
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "could not be streamed from the HF hub" in lines[0] and "nosuchorg" in lines[0]
    assert not (tmp_path / "o").exists()
