"""ELECTRA pretraining (Clark et al. 2020): generator + discriminator with shared embeddings, and the setup.

``loss = L_MLM(G) + λ·L_RTD(D)`` with λ = 50 (eq. 1); the generator's samples replace the masked tokens
under no gradient and the discriminator tells original from replaced over every token
(:mod:`bertforge.objectives.rtd`). The discriminator is saved at the top of the run dir as
``ElectraForPreTraining`` (``discriminator_predictions.dense`` / ``dense_prediction``) and the generator in
``generator/`` as ``ElectraForMaskedLM``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from torch import nn

from ..checkpoint.read import load_pretrained
from ..config import ModelConfig
from ..models.output import ModelOutput
from ..task_model import TaskModel
from .rtd import RTD_WEIGHT, generator_config, replace_tokens, sample_from_logits
from .spec import Objective


class ElectraPretrainModel(nn.Module):
    """Generator + discriminator with shared embeddings; ``forward(**batch)`` → :class:`ModelOutput`.

    Batch: ``input_ids`` (B, T) after masking, ``labels`` (B, T) original ids at masked positions (-100
    elsewhere), ``attention_mask``, ``token_type_ids``; ``loss_normalizer`` divides the generator's summed
    MLM loss (:func:`~bertforge.objectives.mlm.mlm_outputs`). ``terms``: ``mlm_loss``, ``mlm_acc`` (generator),
    ``rtd_loss``, ``rtd_acc`` (discriminator, all tokens), ``replaced`` (fraction of tokens replaced).
    """

    def __init__(self, config: ModelConfig, gen_config: Optional[ModelConfig] = None,
                 rtd_weight: float = RTD_WEIGHT, generator_size: float = 0.25):
        super().__init__()
        self.config = config
        self.rtd_weight = rtd_weight
        self.discriminator = TaskModel(config, head="electra_discriminator")
        self.generator = TaskModel(gen_config or generator_config(config, generator_size), head="mlm")
        self.share_embeddings()

    def share_embeddings(self) -> None:
        d, g = self.discriminator.encoder.embeddings, self.generator.encoder.embeddings
        for name in ("word_embeddings", "position_embeddings", "token_type_embeddings", "LayerNorm"):
            if getattr(d, name, None) is not None:
                setattr(g, name, getattr(d, name))
        self.generator.head.tie_weights(self.generator.encoder)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, labels: Optional[torch.Tensor] = None,
                loss_normalizer: Optional[torch.Tensor] = None, **_) -> ModelOutput:
        g = self.generator(input_ids, attention_mask, token_type_ids, labels=labels,
                           loss_normalizer=loss_normalizer)
        with torch.no_grad():
            sampled = sample_from_logits(g.logits.detach())
            corrupted, rtd_labels = replace_tokens(input_ids, labels, sampled)
        d = self.discriminator(corrupted, attention_mask, token_type_ids, labels=rtd_labels)
        loss = g.loss + self.rtd_weight * d.loss
        am = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        terms = {**(g.terms or {}), **(d.terms or {}),
                 "replaced": (rtd_labels * am).sum() / am.sum().clamp(min=1)}
        return ModelOutput(loss=loss, logits=d.logits, terms=terms)

    def save_pretrained(self, out_dir, tokenizer=None, tokenizer_dir=None) -> None:
        """Discriminator in ``out_dir`` (``ElectraForPreTraining``), generator in ``out_dir/generator``."""
        self.discriminator.save_pretrained(out_dir, tokenizer=tokenizer, tokenizer_dir=tokenizer_dir)
        self.generator.save_pretrained(Path(out_dir) / "generator", tokenizer=tokenizer,
                                       tokenizer_dir=tokenizer_dir)

    @classmethod
    def from_pretrained(cls, path, rtd_weight: float = RTD_WEIGHT) -> "ElectraPretrainModel":
        disc = load_pretrained(path, head="electra_discriminator")
        gen = load_pretrained(Path(path) / "generator", head="mlm")
        m = cls(disc.config, gen.config, rtd_weight)
        m.discriminator.load_state_dict(disc.state_dict())
        m.generator.load_state_dict(gen.state_dict(), strict=False)
        m.share_embeddings()
        return m


def build_electra(config: ModelConfig, opts: dict) -> ElectraPretrainModel:
    """The ELECTRA model of a resolved ``pretrain`` section (``rtd_weight`` λ, ``generator_size``)."""
    return ElectraPretrainModel(config, rtd_weight=float(opts["rtd_weight"]),
                                generator_size=float(opts["generator_size"]))


#: ELECTRA: FULL-SENTENCES, dynamic masking; the generator's input is 85% [MASK], 15% kept, no random token
#: (google-research/electra ``pretrain_helpers.mask``); Adam ε = 1e-6 (Clark et al. 2020 App. B, Table 6)
OBJECTIVE = Objective(name="electra", family="electra", head="electra", mode="full", masking="dynamic", scheme="token",
                      options={"replace_probs": [0.85, 0.0, 0.15]}, train={"adam_eps": 1.0e-6},
                      build=build_electra, source="Clark et al. 2020 §2-3")

__all__ = ["OBJECTIVE", "ElectraPretrainModel", "build_electra"]
