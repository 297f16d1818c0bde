"""What a dir declares about how it embeds travels whole through every step that writes a dir from it: a
Matryoshka model saved to serve 16 of its 32 dimensions, mean-pooled, normalised, 24 tokens long, with
prompts, still declares (and serves) exactly that after export, INT8 quantization (ONNX Runtime and PyTorch)."""
import json

import numpy as np
import pytest

from helpers import make_tiny_checkpoint

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "stocks fell sharply today"]


@pytest.fixture(scope="module")
def matryoshka(tmp_path_factory):
    from bertforge.checkpoint.layout import write_pooling, write_truncate_dim
    d = make_tiny_checkpoint(tmp_path_factory.mktemp("decl") / "m")
    write_pooling(d, "mean", normalize=True, max_seq_length=24)
    write_truncate_dim(d, 16)
    st = json.loads((d / "config_sentence_transformers.json").read_text())
    st["prompts"] = {"query": "query: ", "passage": "passage: "}
    (d / "config_sentence_transformers.json").write_text(json.dumps(st))
    return d


def steps(src, work):
    """Every step that writes a dir from ``src``: name → the dir it wrote."""
    import bertforge
    out = {"export": work / "export", "quantize-onnx": work / "q-onnx", "quantize-torch": work / "q-torch"}
    bertforge.export(src, out["export"])
    bertforge.quantize(src, out["quantize-onnx"], max_drop=100.0, calib=TEXTS)
    bertforge.quantize(src, out["quantize-torch"], backend="torch")
    return out


def test_every_step_keeps_every_declaration_and_serves_the_declared_dimension(matryoshka, tmp_path):
    from bertforge.checkpoint.modeldir import ModelDir
    from bertforge.runtime.embedder import load_embedder
    src = ModelDir.open(matryoshka)
    declared = (src.pooling, src.truncate_dim, src.max_seq_len)
    assert declared[1:] == (16, 24) and src.pooling.mode == "mean" and src.pooling.normalize
    ref = load_embedder(matryoshka).embed(TEXTS)
    assert ref.shape == (3, 16)
    prompts = json.loads((matryoshka / "config_sentence_transformers.json").read_text())["prompts"]
    for step, out in steps(matryoshka, tmp_path).items():
        md = ModelDir.open(out)
        assert (md.pooling, md.truncate_dim, md.max_seq_len) == declared, step
        assert json.loads((out / "config_sentence_transformers.json").read_text())["prompts"] == prompts, step
        v = load_embedder(out).embed(TEXTS)
        assert v.shape == (3, 16), step
        cos = (v * ref).sum(1) / np.linalg.norm(v, axis=1) / np.linalg.norm(ref, axis=1)
        assert cos.min() > 0.9, (step, cos)  # the same model (INT8 within its rounding), not another one
