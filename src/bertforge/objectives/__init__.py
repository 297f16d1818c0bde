"""Pretraining objectives, one file each: its head, sequence mode, masking and defaults (an :class:`Objective`).

``mlm.py`` (RoBERTa), ``nsp.py`` (BERT), ``sop.py`` (ALBERT), ``spanbert.py`` (SpanBERT), ``electra.py`` with
``rtd.py`` (ELECTRA); ``masking.py`` and ``collate.py`` select and corrupt tokens; ``pretrain.py`` holds the
registry :data:`~bertforge.objectives.pretrain.OBJECTIVES`. The heads are registered by name in
:data:`bertforge.heads.HEADS`. Importing this package imports none of its modules.
"""
