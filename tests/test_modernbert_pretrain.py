"""`bertforge pretrain --objective modernbert` end to end on a slice of real text: MLM alone at a 30% masking
rate, the ModernBERT optimizer constants, and a saved dir that transformers' ModernBertForMaskedLM loads with
the same logits. (That a longer run learns — loss −30%, held-out accuracy above the unigram baseline — is
benchmarks/pretrain_quality.py --objectives modernbert.)"""
import json
from pathlib import Path

import pytest
import torch
import transformers
import yaml

from bertforge.checkpoint import load_pretrained
from bertforge.cli import main

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def test_pretrain_modernbert_writes_a_transformers_masked_lm(tmp_path):
    src = DATA / "wikitext-2-raw" / "wiki.valid.raw"
    if not src.is_file():
        pytest.skip("shared/data not available")
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(src.read_text(encoding="utf-8").splitlines()[:600]) + "\n", encoding="utf-8")
    out = tmp_path / "mb"
    rc = main(["pretrain", "--objective", "modernbert", "--corpus", str(corpus), "--out", str(out), "--vocab-size",
               "600", "--max-seq-len", "48", "--max-steps", "3", "--batch-size", "8", "--no-progress",
               "--cache-dir", str(tmp_path / "cache"), "train.eval_every=3", "train.log_every=1",
               "model.hidden_size=32", "model.num_attention_heads=2", "model.intermediate_size=48",
               "model.num_hidden_layers=3", "model.local_attention=16"])
    assert rc == 0
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if "loss" in r]
    assert len(train) == 3 and "nsp_loss" not in train[-1]
    # 30% of the tokens are predicted: per 8 × 48 batch (rows up to 48 long, [CLS]/[SEP] never picked) far
    # more than BERT's 15% could give, and no more than 30%
    rate = sum(r["mlm_count"] for r in train) / (3 * 8 * 48)
    assert 0.2 < rate <= 0.31, rate
    recipe = yaml.safe_load((out / "recipe.yaml").read_text())
    assert recipe["pretrain"]["mlm_probability"] == 0.3
    assert (recipe["train"]["adam_betas"], recipe["train"]["adam_eps"]) == ([0.9, 0.98], 1e-6)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["ModernBertForMaskedLM"] and cfg["model_type"] == "modernbert"
    assert cfg["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention"]
    ref = transformers.ModernBertForMaskedLM.from_pretrained(out, attn_implementation="eager").eval()
    ours = load_pretrained(out)
    ids = torch.randint(5, 600, (2, 40))
    mask = torch.ones_like(ids)
    mask[1, 25:] = 0
    with torch.no_grad():
        a = ours(ids, mask).logits
        b = ref(input_ids=ids, attention_mask=mask).logits
    assert (a - b)[mask.bool()].abs().max() < 1e-4
