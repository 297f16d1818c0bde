"""``bertforge.embed_corpus`` called from Python: a misspelt option is refused before torch loads, and a tiny
corpus lands in shards whose vectors are the ones ``bertforge.embed`` gives the same texts in memory.

Independent truths: ``sys.modules`` of a fresh interpreter; ``bertforge.embed`` (all texts at once, other
batches) and the lines of the input file (the ids)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from helpers import make_tiny_checkpoint, sentences

_PROBE = """
import json, sys
import bertforge
from bertforge.errors import ConfigError
try:
    bertforge.embed_corpus("minilm", ["corpus.txt"], "runs/vecs", shard_sise=10)
    said = None
except ConfigError as e:
    said = str(e)
print(json.dumps({"said": said, "torch": "torch" in sys.modules}))
"""


def test_an_unknown_option_is_refused_before_torch_loads():
    res = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["said"] and "shard_sise" in out["said"] and "EmbedCorpusOptions" in out["said"]
    assert out["torch"] is False


def test_a_tiny_corpus_lands_in_shards_of_the_models_vectors(tmp_path):
    import bertforge
    from bertforge.pipelines.embed_corpus import read_shards
    model = make_tiny_checkpoint(tmp_path / "tiny")
    texts = [s for s, _ in sentences(45, 5)]
    txt = tmp_path / "corpus.txt"
    txt.write_text("\n".join(texts) + "\n", encoding="utf-8")
    r = bertforge.embed_corpus(model, txt, tmp_path / "vecs", shard_size=20, batch_size=8, max_seq_len=32,
                               threads=1)
    assert r.out == tmp_path / "vecs"
    assert r.record["complete"] and r.record["shards"] == 3 and r.record["computed"] == [0, 1, 2]
    vecs, ids = read_shards(r.out)
    assert ids == list(range(1, len(texts) + 1))  # .txt: the line numbers
    np.testing.assert_allclose(vecs, bertforge.embed(model, texts, max_seq_len=32, batch_size=5), atol=1e-5)
    again = bertforge.embed_corpus(model, [txt], tmp_path / "vecs", shard_size=20, batch_size=8, max_seq_len=32,
                                   threads=1)
    assert again.record["computed"] == [] and again.record["kept"] == [0, 1, 2]  # resumed: nothing redone
