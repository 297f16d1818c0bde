"""Progressive knowledge transfer (MobileBERT, Sun et al. 2020 §3.4–3.5): :class:`ProgressiveDistiller`.

The student learns one layer at a time. With L student layers the run is L + 1 stages of the one
:class:`~bertforge.engine.train.trainer.Trainer` run (a stage schedule inside the objective, no loop of its
own):

* **stage l** (1 ≤ l ≤ L) — the layer-wise terms (feature-map transfer ``feature_map_mse`` and attention
  transfer ``attention_kl``) on student layer l and its teacher layer only; layer l is trained, every other
  student parameter is frozen (``requires_grad=False``: no gradient, so the optimizer leaves it bit-unchanged),
  except that stage 1 also trains the embeddings (frozen after it, as in the paper §3.4);
* **stage L + 1** — the method's other terms with everything trainable: pre-training distillation
  ``α·L_MLM + (1−α)·L_KD`` (§3.5) in the general stage, logit KD in the task stage; when the method has no
  such term left (a teacher without an MLM head in the general stage) every layer pair at once.

Each stage is ``stage_steps`` optimizer steps (:meth:`ProgressiveDistiller.set_schedule`: the run's steps split
evenly, the last stage taking the remainder). The stage follows a step counter saved with the objective (a
buffer), so a resumed run continues in its stage. Teacher features are the union of every stage's (one
teacher pass gives them all), so the teacher cache works as for :class:`~.distiller.Distiller`.
"""
from __future__ import annotations

import dataclasses

import torch

from ..errors import ConfigError
from .distiller import Distiller
from .features import request_of


class ProgressiveDistiller(Distiller):
    """:class:`~.distiller.Distiller` with MobileBERT's stage schedule (module doc). Same arguments and output;
    :attr:`stage` is the current stage (1-based; L + 1 the last), logged as the ``stage`` term.

    Raises:
        ConfigError: no layer-wise term (nothing to transfer progressively)."""

    def __init__(self, student, teachers, terms, cache=None):
        super().__init__(student, teachers, terms, cache)
        self.layerwise = [t for t in terms if t.feature.layerwise]
        if not self.layerwise:
            raise ConfigError("progressive transfer needs layer-wise terms (feature_map_mse, attention_kl)")
        self.final = [t for t in terms if not t.feature.layerwise] or list(self.layerwise)
        self.num_layers = student.config.num_hidden_layers
        self.stage_steps = 1
        self.accum = 1
        self.register_buffer("micro_batches", torch.zeros((), dtype=torch.long))  # training forwards so far
        self._stage = None

    def set_schedule(self, total_steps: int, grad_accum_steps: int = 1) -> None:
        """Split ``total_steps`` optimizer steps evenly over the L + 1 stages (at least one step each)."""
        self.accum = max(1, int(grad_accum_steps))
        self.stage_steps = max(1, int(total_steps) // (self.num_layers + 1))

    @property
    def stage(self) -> int:
        step = int(self.micro_batches) // self.accum
        return min(self.num_layers + 1, step // self.stage_steps + 1)

    def stage_terms(self, stage: int) -> list:
        """The terms of ``stage``: each layer-wise term on its pair(s) of student layer ``stage``, or the
        final stage's terms."""
        if stage > self.num_layers:
            return self.final
        out = []
        for t in self.layerwise:
            pairs = [p for p in t.pairs if p[0] == stage]
            if pairs:
                out.append(dataclasses.replace(t, pairs=pairs))
        return out

    def trainable(self, stage: int) -> list:
        """The student modules trained in ``stage``: layer ``stage`` (+ the embeddings in stage 1), or the whole
        student in the last stage."""
        enc = self.student.encoder
        if stage > self.num_layers:
            return [self.student]
        return [enc.layers[stage - 1]] + ([enc.embeddings] if stage == 1 else [])

    def _enter(self, stage: int) -> None:
        self.student.requires_grad_(False)
        for m in self.trainable(stage):
            m.requires_grad_(True)
        self.proj.requires_grad_(stage > self.num_layers or stage == 1)
        self.terms = self.stage_terms(stage)
        self._request = request_of(t.feature for t in self.terms)
        self._stage = stage

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, **batch):
        if self.training:
            stage = self.stage
            if stage != self._stage:
                self._enter(stage)
            self.micro_batches += 1
        elif self._stage is None:
            self._enter(self.stage)
        out = super().forward(input_ids, attention_mask, token_type_ids, **batch)
        out.terms["stage"] = float(self._stage)
        return out


__all__ = ["ProgressiveDistiller"]
