"""Pretraining heads against the reference implementation (``transformers``) on the same weights.

Each head is saved with ``save_pretrained`` and loaded into the matching ``transformers`` class; MLM
logits, NSP/SOP logits, RTD logits and MLM losses must agree. The sparse MLM head must equal the full
head at the masked positions. ELECTRA's corruption rule (sampled == original → original) and loss
(MLM + 50·RTD) are checked on hand-built cases.
"""
import pytest
import torch
import transformers

from bertforge.config import ModelConfig
from bertforge.checkpoint import load_pretrained
from bertforge.task_model import TaskModel
from bertforge.objectives.electra import ElectraPretrainModel
from bertforge.objectives.rtd import generator_config, replace_tokens

V = 97


def tiny(fam, **kw):
    base = dict(model_type=fam, vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=48, max_position_embeddings=40, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0, pad_token_id=1 if fam == "roberta" else 0,
                type_vocab_size=1 if fam == "roberta" else 2)
    if fam == "albert":
        base.update(embedding_size=16, layer_sharing="all", hidden_act="gelu_new")
    if fam == "electra":
        base.update(embedding_size=16, add_pooling_layer=False)
    base.update(kw)
    return ModelConfig(**base)


def _randomize(model):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)


def _batch(b=3, t=20, pad=1):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, V, (b, t), generator=g)
    am = torch.ones(b, t, dtype=torch.long)
    am[0, 15:] = 0
    ids[0, 15:] = pad
    tt = torch.zeros(b, t, dtype=torch.long)
    labels = torch.full((b, t), -100)
    sel = torch.rand(b, t, generator=g) < 0.3
    sel &= am.bool()
    labels[sel] = torch.randint(5, V, (int(sel.sum()),), generator=g)
    return ids, am, tt, labels


CASES = [("bert", "mlm_nsp", transformers.BertForPreTraining, {"add_pooling_layer": True}),
         ("bert", "mlm", transformers.BertForMaskedLM, {"add_pooling_layer": False}),
         ("roberta", "mlm", transformers.RobertaForMaskedLM, {"add_pooling_layer": False}),
         ("albert", "mlm_sop", transformers.AlbertForPreTraining, {"add_pooling_layer": True}),
         ("electra", "mlm", transformers.ElectraForMaskedLM, {}),
         ("electra", "electra_discriminator", transformers.ElectraForPreTraining, {})]


@pytest.mark.parametrize("fam,head,hf_cls,kw", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_head_matches_transformers(tmp_path, fam, head, hf_cls, kw):
    cfg = tiny(fam, **kw)
    ours = TaskModel(cfg, head=head).eval()
    _randomize(ours)
    ours.head.tie_weights(ours.encoder) if hasattr(ours.head, "tie_weights") else None
    ours.save_pretrained(tmp_path)
    theirs = hf_cls.from_pretrained(tmp_path).eval()
    ids, am, tt, labels = _batch(pad=cfg.pad_token_id)
    with torch.no_grad():
        o = ours(ids, am, tt)  # no labels: full logits
        r = theirs(input_ids=ids, attention_mask=am, token_type_ids=tt)
        real = am.bool()  # padded positions are not compared (their states are undefined)
        if head == "electra_discriminator":
            torch.testing.assert_close(o.logits[real], r.logits[real], atol=1e-4, rtol=1e-4)
            return
        ref_logits = r.prediction_logits if hasattr(r, "prediction_logits") else r.logits
        torch.testing.assert_close(o.logits[real], ref_logits[real], atol=1e-4, rtol=1e-4)
        # sparse head with labels == full logits at the masked positions; same MLM loss as HF
        o2 = ours(ids, am, tt, labels=labels)
        sel = labels != -100
        torch.testing.assert_close(o2.logits, ref_logits[sel], atol=1e-4, rtol=1e-4)
        ref_mlm = torch.nn.functional.cross_entropy(ref_logits[sel], labels[sel])
        torch.testing.assert_close(o2.terms["mlm_loss"], ref_mlm, atol=1e-5, rtol=1e-5)
        if head in ("mlm_nsp", "mlm_sop"):
            pair = torch.tensor([0, 1, 1])
            key = "next_sentence_label" if head == "mlm_nsp" else "sentence_order_label"
            o3 = ours(ids, am, tt, labels=labels, **{key: pair})
            r3 = theirs(input_ids=ids, attention_mask=am, token_type_ids=tt, labels=labels,
                        **{key: pair})
            ref_pair = r.seq_relationship_logits if head == "mlm_nsp" else r.sop_logits
            torch.testing.assert_close(o3.loss, r3.loss, atol=1e-5, rtol=1e-5)
            assert ref_pair.shape == (3, 2)
        if head == "mlm" and fam != "electra":
            r2 = theirs(input_ids=ids, attention_mask=am, token_type_ids=tt, labels=labels)
            torch.testing.assert_close(o2.loss, r2.loss, atol=1e-5, rtol=1e-5)
    # our own loader round-trips the head (tied decoder re-tied)
    back = load_pretrained(tmp_path).eval()
    assert back.head_name == head
    with torch.no_grad():
        torch.testing.assert_close(back(ids, am, tt).logits[real], o.logits[real])


def test_spanbert_dir_loads_in_transformers_and_ours(tmp_path):
    cfg = tiny("bert", add_pooling_layer=False)
    ours = TaskModel(cfg, head="mlm_sbo").eval()
    _randomize(ours)
    ours.save_pretrained(tmp_path)
    theirs = transformers.BertForMaskedLM.from_pretrained(tmp_path).eval()
    ids, am, tt, _ = _batch()
    real = am.bool()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, am, tt).logits[real], theirs(
            input_ids=ids, attention_mask=am, token_type_ids=tt).logits[real], atol=1e-4, rtol=1e-4)
    back = load_pretrained(tmp_path)
    assert back.head_name == "mlm_sbo"
    torch.testing.assert_close(back.head.sbo.dense1.weight, ours.head.sbo.dense1.weight)


def test_sbo_uses_outer_boundaries_and_relative_position():
    """SBO logits for token i depend only on x_{s-1}, x_{e+1} and i-s (Joshi et al. 2020 eq. 1–2)."""
    cfg = tiny("bert", add_pooling_layer=False)
    m = TaskModel(cfg, head="mlm_sbo").eval()
    h = torch.randn(1, 10, 32)
    labels = torch.full((1, 10), -100)
    labels[0, 3:6] = torch.tensor([7, 8, 9])  # span s=3..e=5
    left = torch.full((1, 10), -1)
    right = torch.full((1, 10), -1)
    pos = torch.full((1, 10), -1)
    left[0, 3:6], right[0, 3:6], pos[0, 3:6] = 2, 6, torch.arange(3)
    with torch.no_grad():
        logits, loss, _ = m.head.sbo(h, labels, left, right, pos)
        h2 = h.clone()
        h2[0, 3:6] += 5.0  # states inside the span do not matter
        logits2, _, _ = m.head.sbo(h2, labels, left, right, pos)
        sbo = m.head.sbo
        x = torch.cat([h[0, 2], h[0, 6], sbo.position_embeddings.weight[1]])
        y = sbo.norm2(sbo.act(sbo.dense2(sbo.norm1(sbo.act(sbo.dense1(x))))))
        ref = y @ m.encoder.embeddings.word_embeddings.weight.T + sbo.bias
    torch.testing.assert_close(logits, logits2)
    torch.testing.assert_close(logits[1], ref, atol=1e-5, rtol=1e-5)


def test_electra_replace_rule_and_loss():
    ids = torch.tensor([[2, 4, 4, 9, 3]])  # 4 = [MASK]
    labels = torch.tensor([[-100, 11, 12, -100, -100]])
    sampled = torch.tensor([11, 40])  # first equals the original → labelled original
    corrupted, rtd = replace_tokens(ids, labels, sampled)
    assert corrupted.tolist() == [[2, 11, 40, 9, 3]]
    assert rtd.tolist() == [[0, 0, 1, 0, 0]]

    cfg = tiny("electra", hidden_size=64, embedding_size=32)
    gcfg = generator_config(cfg)
    assert gcfg.hidden_size == 16 and gcfg.embedding_size == 32
    m = ElectraPretrainModel(cfg)
    g, d = m.generator.encoder.embeddings, m.discriminator.encoder.embeddings
    assert g.word_embeddings is d.word_embeddings and g.position_embeddings is d.position_embeddings
    assert m.generator.head.mlm.decoder_weight is d.word_embeddings.weight
    ids, am, tt, labels = _batch()
    torch.manual_seed(0)
    out = m(ids, am, tt, labels=labels)
    torch.testing.assert_close(out.loss.detach(), out.terms["mlm_loss"] + 50.0 * out.terms["rtd_loss"])
    out.loss.backward()
    assert d.word_embeddings.weight.grad is not None  # both losses reach the shared embeddings
    # a generator that always predicts the original token → nothing is "replaced"
    with torch.no_grad():
        m.generator.head.mlm.bias.zero_()
    sel = labels != -100
    big = torch.full((int(sel.sum()), V), -1e4)
    big[torch.arange(len(big)), labels[sel]] = 1e4
    corrupted, rtd = replace_tokens(ids, labels, torch.multinomial(torch.softmax(big, -1), 1).squeeze(-1))
    assert rtd.sum() == 0


def test_electra_saved_dirs_load_in_transformers(tmp_path):
    m = ElectraPretrainModel(tiny("electra", hidden_size=64, embedding_size=32)).eval()
    _randomize(m)
    m.share_embeddings()
    m.save_pretrained(tmp_path)
    disc = transformers.ElectraForPreTraining.from_pretrained(tmp_path).eval()
    gen = transformers.ElectraForMaskedLM.from_pretrained(tmp_path / "generator").eval()
    ids, am, tt, _ = _batch()
    real = am.bool()
    with torch.no_grad():
        torch.testing.assert_close(m.discriminator(ids, am, tt).logits[real],
                                   disc(input_ids=ids, attention_mask=am, token_type_ids=tt).logits[real],
                                   atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(m.generator(ids, am, tt).logits[real],
                                   gen(input_ids=ids, attention_mask=am, token_type_ids=tt).logits[real],
                                   atol=1e-4, rtol=1e-4)
    back = ElectraPretrainModel.from_pretrained(tmp_path)
    assert back.generator.encoder.embeddings.word_embeddings is back.discriminator.encoder.embeddings.word_embeddings
    torch.testing.assert_close(back.generator.head.mlm.dense.weight, m.generator.head.mlm.dense.weight)
