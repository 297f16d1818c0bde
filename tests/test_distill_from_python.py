"""``bertforge.distill`` called from Python (the pipeline ``bertforge distill`` runs): option mistakes are refused
before torch loads, and a tiny run writes the same student the verb writes for the same options.

Independent truths: ``sys.modules`` of a fresh interpreter (torch absent after the refusal; present after the
control import); the student dir read back by ``load_pretrained`` and ``config.json``; the verb's own JSON line
and safetensors for the same options and seed.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

SENTS = ["a charming and affecting journey .", "the movie is dull and boring .", "good acting , great film .",
         "it is a terrible mess .", "funny and warm .", "nothing works in this film ."]

_PROBE = r"""
import json, sys
import bertforge
from bertforge.errors import ConfigError
out = sys.argv[1]
said = []
for opts in ({"max_stpes": 3}, {"dim": 64}):
    try:
        bertforge.distill("minilm", "layers:0", out, **opts)
    except ConfigError as e:
        said.append(str(e))
loaded = "torch" in sys.modules
import bertforge.distillation.distiller  # the control: a heavy module does load torch, and the probe sees it
print(json.dumps({"said": said, "loaded": loaded, "control": "torch" in sys.modules}))
"""


def test_unknown_and_misplaced_options_are_refused_before_torch_loads(tmp_path):
    out = tmp_path / "never"
    res = subprocess.run([sys.executable, "-c", _PROBE, str(out)], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"})
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(got["said"]) == 2
    assert "unknown option" in got["said"][0] and "max_stpes" in got["said"][0]
    assert "method static" in got["said"][1] and "--method" not in got["said"][1]  # dim belongs to the static table
    assert got["loaded"] is False and got["control"] is True
    assert not out.exists()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, minilm_dir):
    """A tiny sst2 teacher (4 layers, H 32) with MiniLM's vocabulary, a labelled file and a corpus."""
    import torch
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    root = tmp_path_factory.mktemp("distill-py")
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=64, num_labels=2,
                      problem_type="single_label_classification", id2label={0: "0", 1: "1"})
    m = TaskModel(cfg, head="sequence_classification")
    m.config.bertforge = {"task": "sst2", "max_seq_len": 32}
    m.save_pretrained(root / "teacher", tokenizer_dir=minilm_dir)
    rows = ["sentence\tlabel"] + [f"{s}\t{i % 2}" for i, s in enumerate(SENTS * 3)]
    (root / "train.tsv").write_text("\n".join(rows) + "\n")
    (root / "corpus.txt").write_text("\n\n".join(" ".join(SENTS[i:] + SENTS[:i]) for i in range(6)) + "\n")
    return root


def test_distill_from_python_writes_the_student_the_verb_writes(tiny, capsys, monkeypatch):
    import bertforge
    from bertforge.checkpoint.read import load_pretrained
    from bertforge.cli import main
    from safetensors.torch import load_file
    monkeypatch.setenv("BERTFORGE_NO_PROGRESS", "1")
    opts = {"train": tiny / "train.tsv", "eval": tiny / "train.tsv", "method": "kd", "max_steps": 3,
            "batch_size": 8, "temperature": 2.0, "seed": 3}
    r = bertforge.distill(tiny / "teacher", "layers:0,2", tiny / "py", **opts)
    assert r.out == tiny / "py"
    student = load_pretrained(r.out)
    assert student.config.num_hidden_layers == 2 and student.head is not None
    cfg = json.loads((r.out / "config.json").read_text())
    assert cfg["bertforge"]["task"] == "sst2"  # the teacher's task: not given, taken from its dir
    assert cfg["bertforge"]["distill"]["losses"][0]["temperature"] == 2.0
    assert r.metrics["step"] == 3 and r.metrics["stage"] == "task" and r.metrics["student"] == "layers:0,2"
    assert (r.out / "recipe.yaml").is_file() and "accuracy" in r.metrics
    capsys.readouterr()
    argv = ["distill", "--teacher", str(tiny / "teacher"), "--student", "layers:0,2", "--out", str(tiny / "cli")]
    for k, v in opts.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed.pop("out") == str(tiny / "cli")
    assert printed == json.loads(json.dumps(r.metrics))  # the same run: the verb calls this function
    a, b = load_file(r.out / "model.safetensors"), load_file(tiny / "cli" / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_general_stage_from_python_takes_one_corpus_path(tiny, monkeypatch):
    import bertforge
    monkeypatch.setenv("BERTFORGE_NO_PROGRESS", "1")
    r = bertforge.distill(str(tiny / "teacher"), "2L-16H-2A-32I", tiny / "general", corpus=tiny / "corpus.txt",
                          max_steps=2, batch_size=4, max_seq_len=16)
    assert r.metrics["stage"] == "general" and r.metrics["method"] == "tinybert" and r.metrics["step"] == 2
    cfg = json.loads((Path(r.out) / "config.json").read_text())
    assert cfg["hidden_size"] == 16 and cfg["num_hidden_layers"] == 2
