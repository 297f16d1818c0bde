"""Pretraining objectives: masking, MLM (sparse, tied), NSP, SOP, SpanBERT SBO, ELECTRA RTD.

Importing this package registers the pretraining heads in :data:`bertforge.models.heads.HEADS`:
``mlm`` (``…ForMaskedLM``), ``mlm_nsp`` (``BertForPreTraining``), ``mlm_sop`` (``AlbertForPreTraining``),
``mlm_sbo`` (SpanBERT; saved as ``BertForMaskedLM`` plus ``cls.sbo.*``) and ``electra_discriminator``
(``ElectraForPreTraining``).
"""
from . import mlm, nsp, sop, span, rtd  # noqa: F401

__all__ = ["mlm", "nsp", "sop", "span", "rtd"]
