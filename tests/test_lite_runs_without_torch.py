"""bertforge_lite installs on its own (a fresh venv, `pip install ./lite` from PyPI with onnxruntime, numpy and
tokenizers) and answers a bundle without importing torch, transformers or bertforge (checked in sys.modules
of the child), with the same vectors bertforge's runner gives (FP32, ≤ 1e-5)."""
import json
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import pytest

from helpers import make_tiny_checkpoint

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys
import bertforge_lite
b = bertforge_lite.Bundle(sys.argv[1])
v = b.embed(["good movie", "a funny plot"]).tolist()
ok = bertforge_lite.verify(sys.argv[1])
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "bertforge"))
print(json.dumps({"vectors": v, "verify": ok, "forbidden": bad}))
"""


@pytest.fixture(scope="module")
def lite_venv(tmp_path_factory):
    d = tmp_path_factory.mktemp("lite-venv") / "v"
    venv.EnvBuilder(with_pip=False, clear=True).create(d)
    py = d / "bin" / "python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                        "-c", str(REPO / "constraints.txt"), str(REPO / "lite")],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0 and any(s in r.stderr for s in ("Could not find a version", "NewConnectionError",
                                                         "No matching distribution")):
        pytest.skip(f"PyPI is not reachable: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr[-2000:]
    return py


def test_lite_in_a_fresh_venv_has_no_torch_and_matches_bertforge(lite_venv, tmp_path):
    import bertforge
    from bertforge.runtime.embedder import load_embedder
    src = make_tiny_checkpoint(tmp_path / "emb")
    out = bertforge.bundle(src, tmp_path / "B").out
    r = subprocess.run([str(lite_venv), "-c", CHILD, str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["forbidden"] == []
    ref = load_embedder(src).embed(["good movie", "a funny plot"], max_seq_len=64)
    assert np.abs(np.asarray(got["vectors"]) - ref).max() <= 1e-5
    cli = subprocess.run([str(lite_venv), "-m", "bertforge_lite", str(out), "good movie"], capture_output=True,
                         text=True, timeout=120)
    assert cli.returncode == 0 and json.loads(cli.stdout)["text"] == "good movie"
    (out / "emb" / "tokenizer.json").write_text("{}")
    bad = subprocess.run([str(lite_venv), "-m", "bertforge_lite", "verify", str(out)], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "changed" in bad.stderr
