"""``bertforge.prune`` called from Python: a misspelt option is refused before torch loads, and a tiny run
returns the pruned folder, which loads with the heads the record says and fewer parameters.

Independent truths: ``sys.modules`` of a fresh interpreter; the folder read back by ``load_pretrained`` (its
attention modules' head counts, its parameters counted with ``numel``)."""
from __future__ import annotations

import json
import subprocess
import sys

from helpers import make_tiny_checkpoint, sentences

_PROBE = """
import json, sys
import bertforge
from bertforge.errors import ConfigError
try:
    bertforge.prune("runs/sst2", "runs/p", fracton=0.3)
    said = None
except ConfigError as e:
    said = str(e)
print(json.dumps({"said": said, "torch": "torch" in sys.modules}))
"""


def test_an_unknown_option_is_refused_before_torch_loads():
    res = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["said"] and "fracton" in out["said"] and "PruneOptions" in out["said"]
    assert out["torch"] is False


def test_a_tiny_run_returns_the_pruned_folder_which_loads(tmp_path):
    import bertforge
    from bertforge.checkpoint.read import load_pretrained
    tiny = make_tiny_checkpoint(tmp_path / "tiny")  # 2 layers × 2 heads, no task head
    text = tmp_path / "text.txt"
    text.write_text("\n".join(s for s, _ in sentences(24, 3)) + "\n", encoding="utf-8")
    r = bertforge.prune(tiny, tmp_path / "pruned", data=text, fraction=0.5, max_seq_len=32, batch_size=8)
    assert r.out == tmp_path / "pruned"
    before, after = load_pretrained(tiny), load_pretrained(r.out)
    heads = [lyr.attention.num_heads for lyr in after.encoder.layers]
    assert sum(heads) == 2 and heads == r.record["heads_per_layer"]  # half of the 4 heads, as recorded
    assert sum(p.numel() for p in after.parameters()) == r.record["parameters"] < \
        sum(p.numel() for p in before.parameters())
    assert r.record["metric"] == "hidden_drift" and len(r.record["history"]) == 2  # unpruned + one round
    assert json.loads((r.out / "prune.json").read_text())["heads_per_layer"] == heads
