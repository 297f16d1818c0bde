"""The worked examples of docs/extending.md, run as the doc writes them: a distillation loss added as one
function + one LOSSES entry, and a pretraining objective added as one Objective + one OBJECTIVES entry,
each trained for a step (the objective through `bertforge pretrain`)."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

from bertforge.cli import main
from bertforge.config import ModelConfig
from bertforge.distillation.distiller import Distiller, build_terms
from bertforge.distillation.losses import LOSSES, LossSpec
from bertforge.models.output import Features
from bertforge.objectives.collate import PretrainCollator
from bertforge.objectives.pretrain import OBJECTIVES, resolve_options
from bertforge.objectives.spec import Objective
from bertforge.task_model import TaskModel

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


# ------------------------------------------------------------------ docs/extending.md, part 1: a loss
def hidden_l1_loss(hidden_S: torch.Tensor, hidden_T: torch.Tensor, mask=None, proj=None, **_) -> torch.Tensor:
    """Mean absolute difference of student (projected to the teacher's width) and teacher hidden states
    (B, T, H) over the real tokens of ``mask`` (B, T)."""
    if proj is not None:
        hidden_S = proj(hidden_S)
    m = mask[..., None].float() if mask is not None else torch.ones_like(hidden_S[..., :1])
    diff = (hidden_S.float() - hidden_T.float()).abs() * m
    return diff.sum() / (m.sum() * hidden_S.shape[-1]).clamp(min=1)


HIDDEN_L1 = LossSpec("hidden_l1", hidden_l1_loss, "hidden", layerwise=True, projects=True)


# -------------------------------------------------------------- docs/extending.md, part 2: an objective
#: Wettig et al. 2023 ("Should You Mask 15% in Masked Language Modeling?", §3): RoBERTa's setup, 40% masked
MLM40 = Objective(name="mlm40", family="roberta", head="mlm", mode="full", masking="dynamic", scheme="token",
                  options={"mlm_probability": 0.4}, train={"adam_betas": [0.9, 0.98], "adam_eps": 1.0e-6},
                  tokenizer="bpe", source="Wettig et al. 2023 §3")


def _tiny(layers: int, hidden: int) -> ModelConfig:
    return ModelConfig(model_type="bert", vocab_size=50, hidden_size=hidden, num_hidden_layers=layers,
                       num_attention_heads=2, intermediate_size=2 * hidden, max_position_embeddings=16,
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def test_a_loss_added_as_one_function_and_one_table_entry_trains_a_student(monkeypatch):
    monkeypatch.setitem(LOSSES, HIDDEN_L1.name, HIDDEN_L1)
    torch.manual_seed(0)
    teacher = TaskModel(_tiny(4, 32)).eval()
    student = TaskModel(_tiny(2, 16))
    terms = build_terms([{"loss": "hidden_l1", "weight": 1.0, "layers": "uniform"}], m=2, n=4)
    assert [(t.loss, t.pairs) for t in terms] == [("hidden_l1", [(1, 2), (2, 4)])]  # TinyBERT's g(m) = m·N/M
    distiller = Distiller(student, [teacher], terms)
    ids = torch.randint(5, 50, (3, 10))
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}

    out = distiller(**batch)
    # independent value: F.l1_loss over the real tokens of each mapped pair, through the learned projection
    with torch.no_grad():
        hs = student(ids, mask, features=Features(hidden_states=True)).hidden_states
        ht = teacher(ids, mask, features=Features(hidden_states=True)).hidden_states
        keep = mask.bool()
        want = sum(F.l1_loss(distiller.proj["hidden_l1"](hs[s])[keep], ht[t][keep]) for s, t in [(1, 2), (2, 4)])
    assert out.loss.item() == pytest.approx(want.item(), rel=1e-5)
    assert out.terms["hidden_l1"].item() == pytest.approx(want.item(), rel=1e-5)

    opt = torch.optim.SGD(distiller.parameters(), lr=0.05)
    before = [p.detach().clone() for p in student.parameters()]
    out.loss.backward()
    opt.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, student.parameters()))
    assert all(p.grad is None for p in teacher.parameters())  # the teacher stays frozen
    assert distiller(**batch).loss.item() < out.loss.item()


def test_an_objective_added_as_one_objective_and_one_table_entry_sets_its_masking(monkeypatch):
    monkeypatch.setitem(OBJECTIVES, MLM40.name, MLM40)
    opts = resolve_options("mlm40", {})
    assert (opts["family"], opts["head"], opts["mode"], opts["mlm_probability"]) == ("roberta", "mlm", "full", 0.4)
    assert resolve_options("mlm40", {"mlm_probability": 0.3})["mlm_probability"] == 0.3  # a recipe still wins
    collate = PretrainCollator(pad_id=0, mask_id=4, special_ids=[0, 1, 2, 3, 4], vocab_size=100,
                               scheme=opts["scheme"], mlm_probability=opts["mlm_probability"])
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    batch = collate([{"input_ids": [1, *rng.integers(5, 100, 254).tolist(), 2]} for _ in range(32)])
    selected = (batch["labels"] != -100).float().sum() / (32 * 254)
    assert abs(selected.item() - 0.4) < 0.02  # 8,128 candidate tokens: 5 standard deviations ≈ 0.027


def test_an_added_objective_pretrains_through_the_cli(monkeypatch, tmp_path):
    src = DATA / "wikitext-2-raw" / "wiki.valid.raw"
    if not src.is_file():
        pytest.skip("shared/data not available")
    monkeypatch.setitem(OBJECTIVES, MLM40.name, MLM40)
    corpus = tmp_path / "wiki.txt"
    corpus.write_text("\n".join(src.read_text(encoding="utf-8").splitlines()[:600]) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    rc = main(["pretrain", "--objective", "mlm40", "--corpus", str(corpus), "--out", str(out), "--vocab-size",
               "400", "--max-seq-len", "32", "--max-steps", "1", "--batch-size", "4", "--cache-dir",
               str(tmp_path / "cache"), "--no-progress", "model.hidden_size=32", "model.num_attention_heads=2",
               "model.intermediate_size=64", "train.log_every=1", "train.eval_every=1"])
    assert rc == 0
    train = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert len(train) == 1 and np.isfinite(train[0]["mlm_loss"])
    recipe = yaml.safe_load((out / "recipe.yaml").read_text())
    assert recipe["pretrain"]["objective"] == "mlm40" and recipe["pretrain"]["mlm_probability"] == 0.4
    assert recipe["train"]["adam_betas"] == [0.9, 0.98]  # the objective's optimizer constants
    assert json.loads((out / "config.json").read_text())["architectures"] == ["RobertaForMaskedLM"]
    assert json.loads((out / "tokenizer.json").read_text())["model"]["type"] == "BPE"  # the objective's tokenizer
