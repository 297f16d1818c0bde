"""Unpadding: a padded (B, T) batch run on its N real tokens (ModernBERT, Warner et al. 2024 §2.1.3).

Linear layers, norms and feed-forward blocks act on each token alone, so they can run on the (N, H) packed
tokens instead of the (B, T, H) padded batch: padding then costs nothing. Only the attention product needs
the sequences apart again. :class:`Unpadded` says where the real tokens are, packs and pads, and — for an
attention product that gathers sequences of similar length into small padded groups — plans those groups.

Used by :class:`~bertforge.models.modernbert.ModernBertEncoder` (grouped attention on packed tokens) and by the
CPU kernels' :class:`~bertforge.engine.kernels.cpu.CpuEncoder` (attention on the re-padded Q/K/V). Results
equal the padded computation at every real token; a speed path only.
"""
from __future__ import annotations

from typing import Optional

import torch

#: a group of :meth:`Unpadded.groups` takes the next sequence while it is at least this × the group's longest
SLACK = 0.8


class Unpadded:
    """Where the real tokens of a padded (B, T) batch are, from its ``attention_mask`` (1 = token, 0 = padding).

    ``idx`` (N,): flat indices into B·T (row-major), so ``x.reshape(B·T, H)[idx]`` is the (N, H) packed batch
    (:meth:`pack`) and :meth:`pad` puts it back; ``batch`` B, ``length`` T; :attr:`starts` and :meth:`groups`
    are computed when first asked for. Any padding side (see :meth:`from_mask` for right padding only)."""

    def __init__(self, attention_mask: torch.Tensor):
        self.mask = attention_mask
        self.batch, self.length = attention_mask.shape
        self.idx = attention_mask.reshape(-1).bool().nonzero(as_tuple=True)[0]
        self._starts: Optional[torch.Tensor] = None
        self._groups: Optional[list] = None

    @staticmethod
    def from_mask(attention_mask: torch.Tensor, right_padded: bool = False) -> Optional["Unpadded"]:
        """:class:`Unpadded` of a (B, T) 0/1 mask; with ``right_padded``, None for a batch where some row starts
        with padding (a caller that reads position 0 as each sequence's first token)."""
        if right_padded and not bool(attention_mask[:, 0].all()):
            return None
        return Unpadded(attention_mask)

    @property
    def starts(self) -> torch.Tensor:
        """(B,) the packed index of each sequence's first real token."""
        if self._starts is None:
            pos = torch.cumsum(self.mask.reshape(-1).bool().long(), 0) - 1
            self._starts = pos[torch.arange(self.batch, device=pos.device) * self.length]
        return self._starts

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, …) → (N, …)."""
        return x.reshape(self.batch * self.length, *x.shape[2:]).index_select(0, self.idx)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, …) → (B, T, …), zeros at padding."""
        out = x.new_zeros(self.batch * self.length, *x.shape[1:]).index_copy_(0, self.idx, x)
        return out.view(self.batch, self.length, *x.shape[1:])

    def groups(self) -> list:
        """Sequences of similar length grouped for the attention product: each group gathers its tokens into
        (n, T_g) with T_g its longest, so the product costs Σ n·T_g² instead of B·T² and most groups need no
        padding mask. Sequences are sorted by length, longest first; a group takes the next one while it is at
        least :data:`SLACK` × the group's longest (padding inside a group ≤ 1 − SLACK per sequence). Per group:
        ``(gather (n·T_g,) indices into the N packed rows + one zero row (index N), slots (N_g,) of the real
        tokens among the n·T_g, their packed rows (N_g,), n, T_g, valid (n, T_g) bool or None when full)``."""
        if self._groups is not None:
            return self._groups
        lengths = self.mask.sum(1).tolist()
        starts = [0]
        for n in lengths[:-1]:
            starts.append(starts[-1] + n)
        order = sorted(range(self.batch), key=lambda i: -lengths[i])
        groups, cur = [], []
        for i in order:
            if lengths[i] == 0:
                continue
            if cur and lengths[i] < SLACK * lengths[cur[0]]:
                groups.append(cur)
                cur = []
            cur.append(i)
        if cur:
            groups.append(cur)
        n_tok = int(self.idx.numel())
        dev = self.mask.device
        plan = []
        for g in groups:
            tg = lengths[g[0]]
            pos = torch.arange(tg)
            gather = torch.full((len(g), tg), n_tok, dtype=torch.long)  # n_tok = the zero row
            for r, i in enumerate(g):
                gather[r, :lengths[i]] = starts[i] + pos[:lengths[i]]
            valid = gather != n_tok
            slots = valid.reshape(-1).nonzero(as_tuple=True)[0]
            rows = gather.reshape(-1)[slots]
            plan.append((gather.reshape(-1).to(dev), slots.to(dev), rows.to(dev), len(g), tg,
                         None if bool(valid.all()) else valid.to(dev)))
        self._groups = plan
        return plan


__all__ = ["SLACK", "Unpadded"]
