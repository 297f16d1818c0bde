"""The Python API: one function per job, typed options in, a result out, the run folder's life included
(:mod:`bertforge.pipelines.rundir`). The command line (``bertforge.cli``) parses flags, words errors and calls
these; a notebook calls them directly (docs/python.md).

===================  ===========================================================  ==========================
function             does                                                         returns
===================  ===========================================================  ==========================
``finetune``         fine-tune on a labelled task with the one Trainer            :class:`TrainResult`
``distill``          a teacher taught to a smaller student                        :class:`TrainResult`
``pretrain``         pretrain an encoder from raw text (BERT, RoBERTa, ALBERT …)  :class:`TrainResult`
``prune``            heads / FFN neurons by importance, or weights by magnitude   :class:`PruneResult`
``translate_train``  train a translation Transformer on parallel text             :class:`TrainResult`
``translate``        translate sentences (greedy or beam); BLEU given references  :class:`TranslateResult`
``quantize``         INT8 for a CPU kind, with the accuracy gate                  :class:`QuantizeResult`
``export``           ONNX export (+ ORT optimisation)                             :class:`ExportResult`
``evaluate``         a model dir's task metrics on labelled data                  :class:`EvalResult`
``embed``            sentence embeddings of texts                                 ``(N, d)`` float32 array
``embed_corpus``     a corpus larger than memory into resumable shards            :class:`EmbedCorpusResult`
``embed_eval``       models scored as sentence encoders (Lee ρ, latency …)        :class:`EmbedEvalResult`
``serve_bench``      models served on loopback, timed under a burst of requests   :class:`ServeBenchResult`
===================  ===========================================================  ==========================

The functions are exported at the top of the package (``bertforge.pretrain``, ``bertforge.prune`` …, loaded on
first use); each module here holds one job with its option and result types (``translate.py``: both
``translate_train`` and ``translate``; ``distill.py`` builds its teachers, data and student in
``distill_data.py``, its static table in ``distill_static.py``). ``demo.py`` (with ``demo_report.py``) holds the
demo's stage table and report: its stages are ``bertforge`` commands, so ``bertforge demo`` passes the command
runner in (:func:`bertforge.pipelines.demo.demo_with`). A model dir is opened with
:class:`bertforge.checkpoint.modeldir.ModelDir`.
"""
