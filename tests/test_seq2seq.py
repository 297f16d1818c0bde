"""The translation Transformer (Vaswani et al. 2017): PE formula, causal decoder, cached decoding, beam
search = greedy at beam 1, label-smoothed loss by hand, checkpoints, token batching, tokenizer."""
from __future__ import annotations

import math

import pytest
import torch

from bertforge.data.translation import (
    TokenBatchDataset,
    collate_pairs,
    encode_pairs,
    token_batches,
    train_joint_tokenizer,
)
from bertforge.errors import CheckpointError, ConfigError
from bertforge.models.decoding import beam_search, greedy_decode
from bertforge.models.embeddings import sinusoidal_positions
from bertforge.models.seq2seq import (
    TransformerConfig,
    TransformerSeq2Seq,
    _smoothed_loss_masked,
    label_smoothed_cross_entropy,
)

V = 50


def tiny(share=True, tie=True, seed=0, **kw) -> TransformerSeq2Seq:
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, num_heads=4,
                            ffn_dim=64, max_positions=64, share_embeddings=share, tie_output=tie, **kw)
    return TransformerSeq2Seq(cfg).eval()


def src_batch(b=3, s=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(4, V, (b, s), generator=g)
    x[:, -1] = 3
    x[0, 4:] = 0  # padding in the first row
    x[0, 3] = 3
    return x, (x != 0).long()


# ------------------------------------------------------------------------------------ PE formula
def test_sinusoidal_pe_equals_paper_formula():
    d, n = 16, 50
    pe = sinusoidal_positions(n, d)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / (10000 ** (2 * i / d))
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_embedding_is_scaled_token_plus_pe():
    m = tiny()
    ids = torch.tensor([[5, 9, 3]])
    got = m.tgt_embed(ids)
    want = m.tgt_embed.embedding.weight[ids] * math.sqrt(32) + sinusoidal_positions(64, 32)[:3]
    torch.testing.assert_close(got, want)


# ---------------------------------------------------------------------------------- causality
@pytest.mark.parametrize("explicit", [False, True])
def test_future_target_tokens_never_change_earlier_outputs(explicit):
    m = tiny()
    m.explicit_attention = explicit
    x, mask = src_batch()
    g = torch.Generator().manual_seed(3)
    dec = torch.randint(4, V, (3, 9), generator=g)
    base = m(x, mask, decoder_input_ids=dec).logits
    for t in range(1, 9):
        dec2 = dec.clone()
        dec2[:, t:] = torch.randint(4, V, (3, 9 - t), generator=g)
        out = m(x, mask, decoder_input_ids=dec2).logits
        torch.testing.assert_close(out[:, :t], base[:, :t], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(out[:, t:], base[:, t:])  # later positions do see the change


def test_source_padding_is_ignored():
    m = tiny()
    x, mask = src_batch()
    dec = torch.randint(4, V, (3, 5))
    a = m(x, mask, decoder_input_ids=dec).logits[0]
    x2 = x.clone()
    x2[0, 4:] = 17  # garbage under the padding mask
    b = m(x2, mask, decoder_input_ids=dec).logits[0]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_explicit_and_sdpa_attention_agree():
    m = tiny()
    x, mask = src_batch()
    dec = torch.randint(4, V, (3, 6))
    a = m(x, mask, decoder_input_ids=dec).logits
    m.explicit_attention = True
    b = m(x, mask, decoder_input_ids=dec).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_incremental_decoding_equals_full_forward():
    m = tiny(share=False, tie=False)
    x, mask = src_batch()
    dec = torch.randint(4, V, (3, 8))
    full = m(x, mask, decoder_input_ids=dec).logits
    memory, bias = m.encode(x, mask)
    caches = m.init_cache(memory)
    steps = [m.decode_step(dec[:, t:t + 1], caches, bias, offset=t) for t in range(3)]
    steps.append(m.decode_step(dec[:, 3:], caches, bias, offset=3))  # several positions at once
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------- decoding
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_beam_size_one_equals_greedy(seed):
    m = tiny(seed=seed, tie=False)
    x, mask = src_batch(b=6, s=7, seed=seed + 10)
    with torch.no_grad():  # vary </s>'s prior so hypotheses stop at different lengths
        m.output_projection.weight[3] *= 0
    greedy = greedy_decode(m, x, mask, max_len_a=1.0, max_len_b=4)
    beam1 = beam_search(m, x, mask, beam=1, max_len_a=1.0, max_len_b=4)
    assert greedy == beam1
    # and greedy is the arg-max chain of the full (uncached) model
    for r, hyp in enumerate(greedy):
        dec = torch.tensor([[2] + hyp])
        logits = m(x[r:r + 1, :int(mask[r].sum())], None, decoder_input_ids=dec).logits[0]
        logits[:, [0, 2]] = float("-inf")
        assert logits[:len(hyp)].argmax(-1).tolist() == hyp


def test_beam_search_finds_higher_scoring_hypotheses_than_greedy():
    m = tiny(seed=5, tie=False)
    x, mask = src_batch(b=8, s=6, seed=7)

    def logprob(r, hyp):
        dec = torch.tensor([[2] + hyp])
        with torch.no_grad():
            lp = torch.log_softmax(m(x[r:r + 1], mask[r:r + 1], decoder_input_ids=dec).logits[0], -1)
        return float(sum(lp[t, tok] for t, tok in enumerate(hyp + [3])))

    g = greedy_decode(m, x, mask, max_len_a=0.0, max_len_b=5)
    b, scores = beam_search(m, x, mask, beam=4, length_penalty=0.0, max_len_a=0.0, max_len_b=5,
                            return_scores=True)
    for r in range(8):
        assert len(b[r]) <= 5
        assert scores[r] == pytest.approx(logprob(r, b[r]), abs=1e-4)  # α = 0: the plain log-probability
        assert scores[r] >= logprob(r, g[r]) - 1e-4


def test_max_length_is_respected():
    m = tiny(seed=4)
    x, mask = src_batch()
    with torch.no_grad():  # </s> never favoured: the length limit is what stops decoding
        m.tgt_embed.embedding.weight[3] -= 5.0
    for hyp in greedy_decode(m, x, mask, max_len_a=0.0, max_len_b=3):
        assert len(hyp) <= 3
    for hyp in beam_search(m, x, mask, beam=3, max_len_a=0.0, max_len_b=3):
        assert len(hyp) <= 3


# --------------------------------------------------------------------------------------------- loss
def test_label_smoothed_loss_equals_hand_computed_value():
    # logits = log([1, 2, 1]) → p = [0.25, 0.5, 0.25]; target class 1; V = 3; ε = 0.1
    # q = 0.9·onehot + 0.1/3 → loss = −(0.9 + 0.1/3)·ln 0.5 − 2·(0.1/3)·ln 0.25
    #   = 0.9333…·0.693147 + 0.0666…·1.386294 = 0.646937 + 0.092420 = 0.739357
    logits = torch.log(torch.tensor([[1.0, 2.0, 1.0]]))
    loss, nll = label_smoothed_cross_entropy(logits, torch.tensor([1]), 0.1)
    assert loss.item() == pytest.approx(0.739357, abs=1e-5)
    assert nll.item() == pytest.approx(math.log(2), abs=1e-6)
    # ignored positions do not count; ε = 0 is plain cross-entropy
    logits2 = torch.cat([logits, torch.tensor([[9.0, 0.0, 0.0]])])
    loss2, _ = label_smoothed_cross_entropy(logits2, torch.tensor([1, -100]), 0.1)
    assert loss2.item() == pytest.approx(0.739357, abs=1e-5)
    assert label_smoothed_cross_entropy(logits, torch.tensor([1]), 0.0)[0].item() == \
        pytest.approx(math.log(2), abs=1e-6)


def test_model_loss_matches_reference_formula_and_torch():
    m = tiny()
    x, mask = src_batch()
    labels = torch.randint(4, V, (3, 6))
    labels[1, 4:] = -100
    out = m(x, mask, labels=labels)
    ref, nll = label_smoothed_cross_entropy(out.logits, labels, 0.1)
    torch.testing.assert_close(out.loss, ref)
    torch.testing.assert_close(out.terms["nll"], nll)
    tl = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V), labels.reshape(-1), label_smoothing=0.1)
    torch.testing.assert_close(out.loss, tl)
    a, _, _ = _smoothed_loss_masked(out.logits, labels, 0.1)
    torch.testing.assert_close(a, ref)


def test_shift_right_builds_teacher_forcing_inputs():
    m = tiny()
    labels = torch.tensor([[7, 8, 3, -100]])
    assert m.shift_right(labels).tolist() == [[2, 7, 8, 3]]


# ------------------------------------------------------------------------------------- weights, i/o
def test_shared_and_tied_embeddings_are_one_matrix():
    m = tiny(share=True, tie=True)
    assert m.src_embed.embedding.weight is m.tgt_embed.embedding.weight
    assert m.output_projection is None
    n_sep = tiny(share=False, tie=False).num_parameters()
    assert n_sep - m.num_parameters() == 2 * V * 32


def test_save_load_roundtrip(tmp_path):
    m = tiny()
    x, mask = src_batch()
    dec = torch.randint(4, V, (3, 5))
    m.save_pretrained(tmp_path / "ck")
    cfg = (tmp_path / "ck" / "config.json").read_text()
    assert '"model_type": "bertforge-transformer"' in cfg
    m2 = TransformerSeq2Seq.from_pretrained(tmp_path / "ck").eval()
    assert m2.src_embed.embedding.weight is m2.tgt_embed.embedding.weight
    torch.testing.assert_close(m2(x, mask, decoder_input_ids=dec).logits, m(x, mask, decoder_input_ids=dec).logits)
    with pytest.raises(CheckpointError):
        TransformerSeq2Seq.from_pretrained(tmp_path / "missing")


def test_config_errors():
    with pytest.raises(ConfigError):
        TransformerConfig(d_model=30, num_heads=4)
    with pytest.raises(ConfigError):
        TransformerConfig(vocab_size=10, src_vocab_size=12, share_embeddings=True)
    with pytest.raises(ConfigError):
        TransformerConfig.from_dict({"dmodel": 3})


# ------------------------------------------------------------------------------ data / tokenizer
def test_token_batches_respect_budget_and_cover_every_pair():
    g = torch.Generator().manual_seed(0)
    src = [[5] * int(n) for n in torch.randint(1, 30, (300,), generator=g)]
    tgt = [[6] * int(n) for n in torch.randint(1, 30, (300,), generator=g)]
    batches = token_batches(src, tgt, 200)
    seen = sorted(i for b in batches for i in b)
    assert seen == list(range(300))
    for b in batches:
        assert len(b) * max(max(len(src[i]), len(tgt[i])) for i in b) <= 200
    ds = TokenBatchDataset(src, tgt, 200)
    b0 = ds[0]
    assert b0["input_ids"].shape[0] == b0["labels"].shape[0]


def test_collate_pairs_layout():
    b = collate_pairs([[5, 6, 3], [7, 3]], [[8, 3], [9, 10, 11, 3]])
    assert b["input_ids"].tolist() == [[5, 6, 3], [7, 3, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert b["labels"].tolist() == [[8, 3, -100, -100], [9, 10, 11, 3]]
    assert b["decoder_input_ids"].tolist() == [[2, 8, 0, 0], [2, 9, 10, 11]]


def test_joint_tokenizer_roundtrips_text_and_shares_vocabulary():
    en = ["A man in an orange hat, starring at something.", "Two dogs run on the grass."] * 20
    de = ["Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
          "Zwei Hunde laufen über das Gras."] * 20
    tok = train_joint_tokenizer(en + de, vocab_size=300)
    assert [tok.id_to_token(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    for s in (en[0], de[0], de[1]):
        assert tok.decode(tok.encode(s, add_special_tokens=False).ids) == s
    s_ids, t_ids, dropped = encode_pairs(tok, en, de, max_len=100)
    assert dropped == 0 and s_ids[0][-1] == 3 and t_ids[0][-1] == 3


# ------------------------------------------------------------- independent reference: torch.nn.Transformer
def test_matches_torch_nn_transformer_on_same_weights():
    """Our encoder-decoder (post-LN, ReLU) equals torch.nn.TransformerEncoder/Decoder with the same
    weights (no final stack norms, as in the paper's Fig. 1)."""
    from torch import nn
    m = tiny(share=False, tie=False)
    d, h = 32, 4
    enc_layer = nn.TransformerEncoderLayer(d, h, 64, dropout=0.0, batch_first=True, layer_norm_eps=1e-5)
    dec_layer = nn.TransformerDecoderLayer(d, h, 64, dropout=0.0, batch_first=True, layer_norm_eps=1e-5)
    enc = nn.TransformerEncoder(enc_layer, 2, enable_nested_tensor=False).eval()
    dec = nn.TransformerDecoder(dec_layer, 2).eval()
    with torch.no_grad():
        for ours, ref in zip(m.encoder_layers, enc.layers):
            ref.self_attn.in_proj_weight.copy_(ours.attention.qkv.weight)
            ref.self_attn.in_proj_bias.copy_(ours.attention.qkv.bias)
            ref.self_attn.out_proj.weight.copy_(ours.attention.out.weight)
            ref.self_attn.out_proj.bias.copy_(ours.attention.out.bias)
            for a, b in ((ref.linear1, ours.ffn.intermediate), (ref.linear2, ours.ffn.output),
                         (ref.norm1, ours.attention_norm), (ref.norm2, ours.ffn_norm)):
                a.weight.copy_(b.weight)
                a.bias.copy_(b.bias)
        for ours, ref in zip(m.decoder_layers, dec.layers):
            sa, ca = ours.self_attention, ours.cross_attention
            ref.self_attn.in_proj_weight.copy_(sa.qkv.weight)
            ref.self_attn.in_proj_bias.copy_(sa.qkv.bias)
            ref.self_attn.out_proj.weight.copy_(sa.out.weight)
            ref.self_attn.out_proj.bias.copy_(sa.out.bias)
            ref.multihead_attn.in_proj_weight.copy_(torch.cat([ca.q.weight, ca.kv.weight]))
            ref.multihead_attn.in_proj_bias.copy_(torch.cat([ca.q.bias, ca.kv.bias]))
            ref.multihead_attn.out_proj.weight.copy_(ca.out.weight)
            ref.multihead_attn.out_proj.bias.copy_(ca.out.bias)
            for a, b in ((ref.linear1, ours.ffn.intermediate), (ref.linear2, ours.ffn.output),
                         (ref.norm1, ours.self_attention_norm), (ref.norm2, ours.cross_attention_norm),
                         (ref.norm3, ours.ffn_norm)):
                a.weight.copy_(b.weight)
                a.bias.copy_(b.bias)
    x, mask = src_batch()
    y = torch.randint(4, V, (3, 6))
    with torch.no_grad():
        src_e = m.src_embed.embedding(x) * math.sqrt(d) + sinusoidal_positions(64, d)[:7]
        tgt_e = m.tgt_embed.embedding(y) * math.sqrt(d) + sinusoidal_positions(64, d)[:6]
        mem = enc(src_e, src_key_padding_mask=mask == 0)
        causal = nn.Transformer.generate_square_subsequent_mask(6)
        out = dec(tgt_e, mem, tgt_mask=causal, memory_key_padding_mask=mask == 0)
        want = m.output_projection(out)
        got = m(x, mask, decoder_input_ids=y).logits
    torch.testing.assert_close(got[1:], want[1:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[0], want[0], atol=1e-4, rtol=1e-4)
