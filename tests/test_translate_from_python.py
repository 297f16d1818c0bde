"""``bertforge.translate_train`` and ``bertforge.translate`` called from Python: misspelt options are refused
before torch loads; a tiny training run returns a folder that loads as a translation checkpoint, and
translating a list gives what the decoder gives on that checkpoint, a file input the same lines.

Independent truths: ``sys.modules`` of a fresh interpreter; ``TransformerSeq2Seq.from_pretrained`` and
``translate_texts`` run on the folder directly."""
from __future__ import annotations

import json
import subprocess
import sys

_PROBE = """
import json, sys
import bertforge
from bertforge.errors import ConfigError
said = []
for call in (lambda: bertforge.translate_train("a.en", "a.de", "v.en", "v.de", "runs/mt", max_minute=1),
             lambda: bertforge.translate("runs/mt", ["a sentence"], beams=4)):
    try:
        call()
    except ConfigError as e:
        said.append(str(e))
print(json.dumps({"said": said, "torch": "torch" in sys.modules}))
"""

SRC = ["the cat sees a dog .", "a big dog runs .", "the child eats .", "a red ball ."] * 6
TGT = ["Eht Tac Sees A God .", "A Gib God Snur .", "Eht Dlihc Stae .", "A Der Llab ."] * 6


def test_unknown_options_are_refused_before_torch_loads():
    res = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(out["said"]) == 2
    assert "max_minute" in out["said"][0] and "TranslateTrainOptions" in out["said"][0]
    assert "beams" in out["said"][1] and "TranslateOptions" in out["said"][1]
    assert out["torch"] is False


def test_a_tiny_run_loads_and_translates_a_list_and_a_file_alike(tmp_path):
    import bertforge
    from bertforge.models.decoding import translate_texts
    from bertforge.models.seq2seq import TransformerSeq2Seq
    from bertforge.tokenizer import load_tokenizer
    files = {}
    for name, lines in (("src", SRC), ("tgt", TGT), ("valid_src", SRC[:4]), ("valid_tgt", TGT[:4])):
        files[name] = tmp_path / f"{name}.txt"
        files[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    r = bertforge.translate_train(files["src"], files["tgt"], files["valid_src"], files["valid_tgt"],
                                  tmp_path / "mt", max_steps=2, no_progress=True,
                                  overrides=["model.d_model=16", "model.ffn_dim=32", "model.encoder_layers=1",
                                             "model.decoder_layers=1", "model.num_heads=2",
                                             "translate.vocab_size=60", "translate.eval_bleu_sentences=2",
                                             "impl.dtype=float32", "impl.threads=1"])
    assert r.out == tmp_path / "mt" and r.metrics["step"] == 2 and "val_loss" in r.metrics
    model, tok = TransformerSeq2Seq.from_pretrained(r.out), load_tokenizer(r.out)
    want = translate_texts(model, tok, SRC[:4], beam=2, length_penalty=0.6, max_len_a=1.5, max_len_b=10)
    t = bertforge.translate(r.out, SRC[:4], beam=2, reference=TGT[:4])
    assert t.hypotheses == want and t.sentences == 4 and t.beam == 2
    assert t.bleu is not None and t.signature.startswith("nrefs:1")
    out = tmp_path / "hyp.txt"
    f = bertforge.translate(r.out, files["valid_src"], beam=2, output=out)
    assert f.hypotheses == want and out.read_text(encoding="utf-8").splitlines() == want and f.bleu is None
