"""`import bertforge` is light: torch and the rest load on first use of a name, not at import time.

Independent truth: ``sys.modules`` of a fresh interpreter.
"""
from __future__ import annotations

import subprocess
import sys


def test_import_bertforge_does_not_load_torch_until_used():
    code = ("import sys, bertforge; a = 'torch' in sys.modules; from bertforge import ModelConfig, load_pretrained; "
            "print(a, 'torch' in sys.modules, ModelConfig.__name__, callable(load_pretrained))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "ModelConfig", "True"]
