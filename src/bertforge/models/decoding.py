"""Greedy and beam-search decoding for :class:`~bertforge.models.seq2seq.TransformerSeq2Seq`.

Both are batched and use incremental decoding (cached self-attention keys/values of the target prefix,
cross-attention keys/values computed once per source).

* Greedy: at each step the arg-max token.
* Beam search (Vaswani et al. 2017 §6.1: beam 4, length penalty α = 0.6): each source keeps ``beam``
  live hypotheses; at each step the best ``2·beam`` extensions are scored, extensions that end in
  ``</s>`` among the first ``beam`` are finished and scored with the GNMT length penalty
  ``score / ((5 + |Y|) / 6)^α`` (Wu et al. 2016, eq. 14; |Y| counts ``</s>``), and the best ``beam``
  others stay alive. A source is done once it has ``beam`` finished hypotheses (the fairseq rule).
  With ``beam = 1`` this is exactly greedy decoding.

Output length: at most ``max_len = min(max_len_a · |src| + max_len_b, max_positions − 1)`` tokens before
``</s>`` (|src| counts source tokens including ``</s>``); at step ``max_len`` only ``</s>`` is allowed.
"""
from __future__ import annotations

import torch

from ..data.translation import encode_source


def _limits(model, attention_mask: torch.Tensor, max_len_a: float, max_len_b: int) -> torch.Tensor:
    src_len = attention_mask.sum(dim=1).float()
    lim = (max_len_a * src_len + max_len_b).floor().long()
    return lim.clamp(min=1, max=model.config.max_positions - 1)


def _mask_logprobs(model, lp: torch.Tensor, force_eos: torch.Tensor) -> torch.Tensor:
    """Forbid <pad>/<s>; rows in ``force_eos`` may only emit </s>."""
    cfg = model.config
    lp[:, cfg.pad_token_id] = float("-inf")
    lp[:, cfg.bos_token_id] = float("-inf")
    if bool(force_eos.any()):
        eos_col = lp[force_eos, cfg.eos_token_id].clone()
        lp[force_eos] = float("-inf")
        lp[force_eos, cfg.eos_token_id] = eos_col
    return lp


@torch.no_grad()
def greedy_decode(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                  max_len_a: float = 1.5, max_len_b: int = 10) -> list:
    """Arg-max decoding. ``input_ids``/``attention_mask`` (B, S) → B lists of target ids (no <s>/</s>)."""
    cfg = model.config
    if attention_mask is None:
        attention_mask = (input_ids != cfg.pad_token_id).long()
    memory, bias = model.encode(input_ids, attention_mask)
    limits = _limits(model, attention_mask, max_len_a, max_len_b)
    b = input_ids.shape[0]
    caches = model.init_cache(memory)
    last = torch.full((b, 1), cfg.bos_token_id, dtype=torch.long, device=input_ids.device)
    done = torch.zeros(b, dtype=torch.bool, device=input_ids.device)
    out = [[] for _ in range(b)]
    for t in range(int(limits.max()) + 1):
        lp = torch.log_softmax(model.decode_step(last, caches, bias, offset=t)[:, -1].float(), dim=-1)
        lp = _mask_logprobs(model, lp, limits <= t)
        nxt = lp.argmax(dim=-1)
        for i in torch.nonzero(~done).flatten().tolist():
            if int(nxt[i]) == cfg.eos_token_id:
                done[i] = True
            else:
                out[i].append(int(nxt[i]))
        if bool(done.all()):
            break
        last = nxt[:, None]
    return out


@torch.no_grad()
def beam_search(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                beam: int = 4, length_penalty: float = 0.6, max_len_a: float = 1.5,
                max_len_b: int = 10, return_scores: bool = False):
    """Batched beam search. ``input_ids``/``attention_mask`` (B, S) → B lists of target ids (no <s>/</s>),
    and with ``return_scores`` also the B length-normalised log-probabilities (nats).

    Raises:
        ValueError: ``beam < 1``.
    """
    if beam < 1:
        raise ValueError("beam must be ≥ 1")
    cfg = model.config
    dev = input_ids.device
    if attention_mask is None:
        attention_mask = (input_ids != cfg.pad_token_id).long()
    k = beam
    memory, bias = model.encode(input_ids, attention_mask)
    n_src = input_ids.shape[0]
    limits = _limits(model, attention_mask, max_len_a, max_len_b)
    rows = torch.arange(n_src, device=dev).repeat_interleave(k)
    memory = memory.index_select(0, rows)
    bias = bias.index_select(0, rows) if bias is not None else None
    caches = model.init_cache(memory)
    active = torch.arange(n_src, device=dev)  # source ids still decoding, in row-block order
    scores = torch.full((n_src, k), float("-inf"), device=dev)
    scores[:, 0] = 0.0
    tokens = torch.full((n_src * k, 1), cfg.bos_token_id, dtype=torch.long, device=dev)
    finished: list = [[] for _ in range(n_src)]
    t = 0
    while active.numel():
        nb = active.numel()
        logits = model.decode_step(tokens[:, -1:], caches, bias, offset=t)[:, -1].float()
        lp = torch.log_softmax(logits, dim=-1)
        lim = limits[active].repeat_interleave(k)
        lp = _mask_logprobs(model, lp, lim <= t)
        v = lp.shape[-1]
        cand = (scores.view(-1, 1) + lp).view(nb, k * v)
        top_s, top_i = cand.topk(2 * k, dim=1)
        src_beam, tok = top_i // v, top_i % v
        is_eos = tok == cfg.eos_token_id
        # finish </s> extensions ranked among the first k candidates
        fin = is_eos[:, :k] & torch.isfinite(top_s[:, :k])
        if bool(fin.any()):
            lp_norm = ((5.0 + t + 1) / 6.0) ** length_penalty
            for bi, ci in torch.nonzero(fin).tolist():
                s = int(active[bi])
                if len(finished[s]) < k:
                    row = bi * k + int(src_beam[bi, ci])
                    finished[s].append((float(top_s[bi, ci]) / lp_norm, tokens[row, 1:].tolist()))
        # the best k non-</s> extensions stay alive
        alive_s = top_s.masked_fill(is_eos, float("-inf"))
        new_s, pick = alive_s.topk(k, dim=1)
        new_beam = src_beam.gather(1, pick)
        new_tok = tok.gather(1, pick)
        still = torch.tensor([len(finished[int(s)]) < k for s in active], device=dev)
        still &= torch.isfinite(new_s).any(dim=1)
        reorder = (torch.arange(nb, device=dev)[:, None] * k + new_beam)  # (nb, k) rows of the old batch
        keep_blocks = torch.nonzero(still).flatten()
        if keep_blocks.numel() == 0:
            break
        sel = reorder.index_select(0, keep_blocks).flatten()
        tokens = torch.cat([tokens.index_select(0, sel), new_tok.index_select(0, keep_blocks).reshape(-1, 1)],
                           dim=1)
        caches = model.reorder_cache(caches, sel)
        if bias is not None:
            bias = bias.index_select(0, sel)
        scores = new_s.index_select(0, keep_blocks)
        active = active.index_select(0, keep_blocks)
        t += 1
    out, best_scores = [], []
    for s in range(n_src):
        if finished[s]:
            sc, toks = max(finished[s], key=lambda x: x[0])
        else:  # cannot happen (</s> is forced at the length limit); keep the contract anyway
            sc, toks = float("-inf"), []
        out.append(toks)
        best_scores.append(sc)
    return (out, best_scores) if return_scores else out


@torch.no_grad()
def translate_texts(model, tokenizer, sentences: list, beam: int = 1, length_penalty: float = 0.6,
                    max_len_a: float = 1.5, max_len_b: int = 10, batch_tokens: int = 4000,
                    device: torch.device | None = None, dtype: str = "float32") -> list:
    """Translate raw sentences and return detokenized strings (same order).

    Sources are encoded with ``tokenizer`` (a ``tokenizers.Tokenizer``) plus ``</s>``, sorted by length
    and decoded in batches of about ``batch_tokens`` source tokens (× beam). ``beam == 1`` is greedy.
    """
    import contextlib
    cfg = model.config
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    ids = encode_source(tokenizer, sentences, cfg.eos_token_id, cfg.max_positions)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    hyps: list = [None] * len(ids)
    budget = max(1, batch_tokens // max(1, beam))
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if dtype == "bfloat16" \
        else contextlib.nullcontext()
    i = 0
    while i < len(order):
        j = i
        while j < len(order) and (j - i + 1) * len(ids[order[j]]) <= budget:
            j += 1
        j = max(j, i + 1)
        chunk = order[i:j]
        width = max(len(ids[c]) for c in chunk)
        x = torch.full((len(chunk), width), cfg.pad_token_id, dtype=torch.long)
        for r, c in enumerate(chunk):
            x[r, :len(ids[c])] = torch.tensor(ids[c])
        x = x.to(device)
        mask = (x != cfg.pad_token_id).long()
        with autocast:
            if beam == 1:
                res = greedy_decode(model, x, mask, max_len_a, max_len_b)
            else:
                res = beam_search(model, x, mask, beam, length_penalty, max_len_a, max_len_b)
        for c, toks in zip(chunk, res):
            hyps[c] = tokenizer.decode(toks, skip_special_tokens=True)
        i = j
    model.train(was_training)
    return hyps


__all__ = ["beam_search", "greedy_decode", "translate_texts"]
