"""Distillation losses vs hand-computed values; the T² gradient-scale property; layer maps."""
import math

import pytest
import torch

from bertforge.distillation import losses as L
from bertforge.distillation.mapping import pkd_last_map, pkd_skip_map, resolve_map, uniform_map
from bertforge.errors import ConfigError

KL_34_VS_HALF = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)  # KL([3/4,1/4] ‖ [1/2,1/2]) = 0.130812…


def test_kd_hand_value_t1():
    zs = torch.tensor([[0.0, 0.0]])
    zt = torch.tensor([[math.log(3.0), 0.0]])  # softmax → [3/4, 1/4]
    assert L.kd_loss(zs, zt, temperature=1.0).item() == pytest.approx(KL_34_VS_HALF, abs=1e-6)


def test_kd_hand_value_t2_and_alpha():
    zs = torch.tensor([[0.0, 0.0]])
    zt = torch.tensor([[math.log(3.0), 0.0]])
    r = math.sqrt(3.0)
    p = [r / (r + 1), 1 / (r + 1)]  # softmax(z_T / 2)
    kl = sum(pi * math.log(pi / 0.5) for pi in p)
    assert L.kd_loss(zs, zt, temperature=2.0).item() == pytest.approx(4 * kl, abs=1e-6)
    # α mixes in CE(z_S, y): uniform student → CE = ln 2
    v = L.kd_loss(zs, zt, temperature=2.0, labels=torch.tensor([0]), alpha=0.25).item()
    assert v == pytest.approx(0.25 * 4 * kl + 0.75 * math.log(2.0), abs=1e-6)
    with pytest.raises(ConfigError):
        L.kd_loss(zs, zt, alpha=0.5)  # no labels


def test_kd_regression_is_mse():
    assert L.kd_loss(torch.tensor([[1.0], [3.0]]), torch.tensor([[0.0], [1.0]])).item() == pytest.approx(2.5)


def test_soft_ce_hand_value():
    zs = torch.tensor([[0.0, 0.0]])
    zt = torch.tensor([[5.0, -1.0]])
    assert L.soft_ce_loss(zs, zt).item() == pytest.approx(math.log(2.0), abs=1e-6)
    zs = torch.tensor([[math.log(3.0), 0.0]])  # log p_S = [ln 3/4, ln 1/4]; p_T = [1/2, 1/2]
    zt = torch.tensor([[0.0, 0.0]])
    assert L.soft_ce_loss(zs, zt).item() == pytest.approx(-0.5 * (math.log(0.75) + math.log(0.25)), abs=1e-6)


def test_mlm_soft_only_masked_positions():
    zs = torch.tensor([[[9.0, -9.0], [0.0, 0.0]]])
    zt = torch.tensor([[[-9.0, 9.0], [math.log(3.0), 0.0]]])
    labels = torch.tensor([[-100, 7]])
    assert L.mlm_soft_loss(zs, zt, mlm_labels=labels).item() == pytest.approx(KL_34_VS_HALF, abs=1e-6)


def test_mlm_hard_loss_is_the_students_cross_entropy_at_masked_positions():
    """DistilBERT's L_mlm: CE of the student's logits at the masked positions only; the teacher is not read."""
    zs = torch.tensor([[[9.0, -9.0], [math.log(3.0), 0.0]]])
    labels = torch.tensor([[-100, 0]])
    assert L.mlm_loss(zs, None, mlm_labels=labels).item() == pytest.approx(-math.log(0.75), abs=1e-6)
    assert L.mlm_loss(zs, None, mlm_labels=torch.full_like(labels, -100)).item() == 0.0
    with pytest.raises(ConfigError, match="--mlm-prob"):
        L.mlm_loss(zs, None, mlm_labels=None)


def test_cosine_hand_value_and_mask():
    hs = torch.tensor([[[1.0, 0.0], [1.0, 1.0], [5.0, -3.0]]])
    ht = torch.tensor([[[0.0, 1.0], [2.0, 2.0], [1.0, 9.0]]])
    mask = torch.tensor([[1, 1, 0]])
    # cos = 0 and 1 on the two real tokens → mean(1 − cos) = 0.5; the padded token is ignored
    assert L.cosine_loss(hs, ht, mask).item() == pytest.approx(0.5, abs=1e-6)


def test_cosine_projects_a_narrower_student():
    """DistilBERT's L_cos with a 2-wide student and a 3-wide teacher goes through the learned W (the
    distiller inserts one when widths differ): W h = [1, 0, 1] against [1, 0, 1] → cos 1 → loss 0; against
    [0, 1, 0] → cos 0 → loss 1."""
    proj = torch.nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        proj.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    hs = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])
    ht = torch.tensor([[[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]])
    assert L.cosine_loss(hs, ht, torch.tensor([[1, 0]]), proj=proj).item() == pytest.approx(0.0, abs=1e-6)
    assert L.cosine_loss(hs, ht, torch.tensor([[0, 1]]), proj=proj).item() == pytest.approx(1.0, abs=1e-6)


def test_hidden_mse_with_projection():
    hs = torch.tensor([[[1.0, 2.0], [7.0, 7.0]]])
    ht = torch.zeros(1, 2, 3)
    proj = torch.nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        proj.weight.copy_(torch.tensor([[2.0, 0.0], [0.0, 2.0], [1.0, 1.0]]))
    # token 1: W h = [2, 4, 3] → (4 + 16 + 9) / 3; token 2 is padding
    v = L.hidden_mse_loss(hs, ht, torch.tensor([[1, 0]]), proj=proj).item()
    assert v == pytest.approx(29 / 3, abs=1e-5)
    assert L.embedding_mse_loss(hs[:, :1], torch.zeros(1, 1, 2)).item() == pytest.approx(2.5)


def test_pkd_normalised_cls():
    hs = torch.tensor([[[3.0, 4.0], [100.0, 0.0]]])
    ht = torch.tensor([[[2.0, 0.0], [0.0, 100.0]]])
    # [0.6, 0.8] − [1, 0] → 0.16 + 0.64 (only [CLS] counts)
    assert L.pkd_loss(hs, ht).item() == pytest.approx(0.8, abs=1e-6)


def test_attention_mse_unnormalised_scores_masked():
    s = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
    t = torch.zeros_like(s)
    assert L.attention_mse_loss(s, t).item() == pytest.approx(7.5)
    t2 = t.clone()
    t2[..., 1] = torch.finfo(torch.float32).min  # masked key as the encoder produces it
    s2 = s.clone()
    s2[..., 1] = torch.finfo(torch.float32).min
    assert L.attention_mse_loss(s2, t2, torch.tensor([[1, 0]])).item() == pytest.approx(1.0)


def test_attention_kl_hand_value():
    a_t = torch.tensor([[[[0.75, 0.25], [0.5, 0.5]]]])
    a_s = torch.tensor([[[[0.5, 0.5], [0.5, 0.5]]]])
    assert L.attention_kl_loss(a_s, a_t).item() == pytest.approx(KL_34_VS_HALF / 2, abs=1e-6)
    assert L.attention_kl_loss(a_s, a_t, torch.tensor([[1, 0]])).item() == pytest.approx(KL_34_VS_HALF, abs=1e-6)


def test_value_relation_hand_value_and_head_counts():
    vs = torch.tensor([[[[1.0], [0.0]]]])  # (B=1, heads=1, T=2, d=1): V Vᵀ = [[1, 0], [0, 0]]
    vt = torch.zeros(1, 1, 2, 1)  # teacher relation is uniform
    e = math.e
    q0 = [e / (e + 1), 1 / (e + 1)]
    row0 = sum(0.5 * math.log(0.5 / q) for q in q0)
    assert L.value_relation_kl_loss(vs, vt).item() == pytest.approx(row0 / 2, abs=1e-6)
    # different head counts: 2 heads × d 3 vs 3 heads × d 2, same concatenated values → 0
    v6 = torch.randn(2, 5, 6)
    s = v6.view(2, 5, 2, 3).transpose(1, 2)
    t = v6.view(2, 5, 3, 2).transpose(1, 2)
    assert L.value_relation_kl_loss(s, t, relation_heads=6).item() == pytest.approx(0.0, abs=1e-6)
    assert L.value_relation_kl_loss(s, t * 3, relation_heads=1).item() > 1e-3


def test_registry_names():
    assert {"kd", "soft_ce", "cosine", "hidden_mse", "embedding_mse", "attention_mse", "attention_kl", "pkd",
            "value_relation_kl", "mlm_soft", "mlm"} <= set(L.LOSSES)
    with pytest.raises(ConfigError):
        L.get_loss("nope")


def _kd_grad(zs, zt, t, scale=True):
    zs = zs.clone().requires_grad_(True)
    v = L.kd_loss(zs, zt, temperature=t)
    if not scale:
        v = v / (t * t)
    v.backward()
    return zs.grad


def test_t_squared_keeps_gradient_scale():
    """Hinton 2015 §2.1: ∂(T²·KL)/∂z_S → (z_S − z_T − mean)/(C·B) as T grows, independent of T; without
    T² the gradient shrinks as 1/T²."""
    g = torch.Generator().manual_seed(0)
    zs, zt = torch.randn(64, 5, generator=g), torch.randn(64, 5, generator=g)
    norms = {t: _kd_grad(zs, zt, t).norm().item() for t in (4.0, 8.0, 16.0, 32.0)}
    for t in (8.0, 16.0, 32.0):
        assert norms[t] / norms[4.0] == pytest.approx(1.0, abs=0.08)
    raw = {t: _kd_grad(zs, zt, t, scale=False).norm().item() for t in (4.0, 8.0)}
    assert raw[8.0] / raw[4.0] == pytest.approx(0.25, rel=0.08)
    # high-temperature limit (Hinton eq. 3–4 with zero-mean logits)
    d = (zs - zs.mean(1, keepdim=True)) - (zt - zt.mean(1, keepdim=True))
    limit = d / (5 * 64)
    g200 = _kd_grad(zs, zt, 200.0)
    assert ((g200 - limit).norm() / limit.norm()).item() < 0.02


def test_layer_maps():
    assert uniform_map(4, 12) == [(1, 3), (2, 6), (3, 9), (4, 12)]
    assert uniform_map(3, 6, with_embeddings=True) == [(0, 0), (1, 2), (2, 4), (3, 6)]
    assert uniform_map(4, 6)[-1] == (4, 6)
    assert pkd_skip_map(6, 12) == [(1, 2), (2, 4), (3, 6), (4, 8), (5, 10)]
    assert pkd_last_map(6, 12) == [(1, 7), (2, 8), (3, 9), (4, 10), (5, 11)]
    assert resolve_map("last", 3, 6) == [(3, 6)]
    assert resolve_map("1:2,3:6", 3, 6) == [(1, 2), (3, 6)]
    assert resolve_map([[0, 0], [2, 4]], 3, 6) == [(0, 0), (2, 4)]
    for bad in ("4:6", "1:7", "x:y", "nonsense"):
        with pytest.raises(ConfigError):
            resolve_map(bad, 3, 6)
    with pytest.raises(ConfigError):
        uniform_map(8, 6)


def test_shipped_recipes_build():
    """Every recipes/distill/*.yaml loads and its losses resolve (TextBrewer-style recipes as data)."""
    from pathlib import Path

    from bertforge.config import load_recipe
    from bertforge.distillation.distiller import build_terms
    paths = sorted((Path(__file__).resolve().parents[1] / "recipes" / "distill").glob("*.yaml"))
    assert len(paths) >= 5
    for p in paths:
        r = load_recipe(str(p), extra_sections=("distill",))
        d = r.extra["distill"]
        terms = build_terms(d["losses"], 6, 12)
        assert terms and all(t.weight > 0 for t in terms), p.name


def test_nested_verb_keys_can_be_overridden(tmp_path):
    """docs/distill.md names distill.augment.mlm / .swap_prob: as overrides they were 'unknown recipe keys
    distill.augment.swap_prob'. A dotted override sets the nested key and keeps the recipe's other ones."""
    import yaml
    from bertforge.config import load_recipe
    f = tmp_path / "r.yaml"
    f.write_text(yaml.safe_dump({"distill": {"augment": {"copies": 20, "prob": 0.4}}}))
    r = load_recipe(str(f), ["distill.augment.swap_prob=0.1", "distill.augment.copies=3"],
                    extra_sections=("distill",))
    assert r.extra["distill"]["augment"] == {"copies": 3, "prob": 0.4, "swap_prob": 0.1}
