"""Behaviour fixes from the fifth fresh-user round (session 9).

Independent truths: the saved checkpoint's own weights (safetensors), and messages checked for what the
user must learn from them.
"""
from __future__ import annotations

import torch
from safetensors.torch import load_file

from resilience_util import make_tiny_checkpoint


def test_fewer_layers_than_the_checkpoint_keeps_the_first_ones_and_says_so(tmp_path, capsys):
    from bertforge.hf import load_pretrained
    ckpt = make_tiny_checkpoint(tmp_path / "m", layers=3)
    model = load_pretrained(ckpt, num_hidden_layers=1)
    err = capsys.readouterr().err
    assert "keeping the first 1 of the 3 encoder layers" in err and "model.num_hidden_layers=1" in err
    assert len(model.encoder.layers) == 1
    saved = load_file(str(ckpt / "model.safetensors"))
    w = saved["bert.encoder.layer.0.intermediate.dense.weight"]
    assert torch.equal(model.encoder.layers[0].ffn.intermediate.weight, w)
    load_pretrained(ckpt)  # the checkpoint's own depth: nothing to say
    assert "keeping" not in capsys.readouterr().err
