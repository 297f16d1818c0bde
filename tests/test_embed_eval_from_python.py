"""``bertforge.embed_eval`` called from Python: a misspelt option is refused before torch loads, and two tiny
models are scored in the order given, each with the Lee ρ and parameter count computed directly on it, the
``out`` file holding the same result.

Independent truths: ``sys.modules`` of a fresh interpreter; ``lee_spearman`` of the model's embedder and the
``numel`` of its weights."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import make_tiny_checkpoint

_PROBE = """
import json, sys
import bertforge
from bertforge.errors import ConfigError
try:
    bertforge.embed_eval({"teacher": "minilm"}, round=3)
    said = None
except ConfigError as e:
    said = str(e)
print(json.dumps({"said": said, "torch": "torch" in sys.modules}))
"""


def test_an_unknown_option_is_refused_before_torch_loads():
    res = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["said"] and "round" in out["said"] and "EmbedEvalOptions" in out["said"]
    assert out["torch"] is False


def test_two_tiny_models_are_scored_in_order_as_their_embedders_score(tmp_path):
    import bertforge
    from bertforge.errors import ConfigError
    from bertforge.runtime.embedder import lee_spearman, load_embedder
    a, b = make_tiny_checkpoint(tmp_path / "a", seed=1), make_tiny_checkpoint(tmp_path / "b", seed=2)
    out = tmp_path / "res.json"
    r = bertforge.embed_eval({"first": a, "second": b}, seq_len=32, rounds=1, iters=2, threads=1, out=out,
                             no_progress=True)
    assert [row["name"] for row in r.models] == ["first", "second"] and r.threads == 1
    for row, d in zip(r.models, (a, b)):
        e = load_embedder(d)
        assert row["lee_spearman"] == pytest.approx(lee_spearman(e), abs=1e-6)
        assert row["params"] == sum(p.numel() for p in e.runner.model.parameters())
        assert row["latency_ms"] > 0 and row["latency_seq_len"] == 32
    assert json.loads(out.read_text()) == r.record
    with pytest.raises(ConfigError, match="^reference 'third' is none of the models"):
        bertforge.embed_eval([f"first={a}"], seq_len=32, rounds=1, iters=1, reference="third", no_progress=True)
