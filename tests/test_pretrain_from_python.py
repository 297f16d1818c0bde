"""``bertforge.pretrain`` called from Python: a misspelt option is refused before torch loads, and a tiny run
returns the run folder, which loads as a checkpoint of the objective asked for.

Independent truths: ``sys.modules`` of a fresh interpreter; the folder read back by ``load_pretrained`` and its
``recipe.yaml``."""
from __future__ import annotations

import json
import subprocess
import sys

import yaml

from helpers import sentences

_PROBE = """
import json, sys
import bertforge
from bertforge.errors import ConfigError
try:
    bertforge.pretrain("roberta", "corpus.txt", "runs/x", max_step=3)
    said = None
except ConfigError as e:
    said = str(e)
print(json.dumps({"said": said, "torch": "torch" in sys.modules}))
"""


def test_an_unknown_option_is_refused_before_torch_loads():
    res = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["said"] and "max_step" in out["said"] and "PretrainOptions" in out["said"]
    assert out["torch"] is False


def test_a_tiny_run_returns_its_folder_which_loads(tmp_path):
    import bertforge
    from bertforge.checkpoint.read import load_pretrained, read_config
    corpus = tmp_path / "corpus.txt"
    docs = [" ".join(s + "." for s, _ in sentences(6, seed)) for seed in range(30)]  # one paragraph a document
    corpus.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    r = bertforge.pretrain("roberta", corpus, tmp_path / "run", vocab_size=300, max_seq_len=32, max_steps=2,
                           batch_size=4, cache_dir=str(tmp_path / "cache"), no_progress=True,
                           overrides=["model.hidden_size=32", "model.num_attention_heads=2",
                                      "model.intermediate_size=64", "model.num_hidden_layers=2"])
    assert r.out == tmp_path / "run"
    assert r.metrics["objective"] == "roberta" and r.metrics["step"] == 2
    assert r.metrics["train_sequences"] > 0 and r.metrics["corpus_tokens"] > 0
    model = load_pretrained(r.out)
    cfg = read_config(r.out)
    assert cfg["model_type"] == "roberta" and cfg["bertforge"]["objective"] == "roberta"
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2
    recipe = yaml.safe_load((r.out / "recipe.yaml").read_text())
    assert recipe["pretrain"]["objective"] == "roberta" and recipe["data"]["corpus"] == [str(corpus.resolve())]
