"""The Python API: one function per job, typed options in, a result out, the run folder's life included
(:mod:`bertforge.pipelines.rundir`). The command line (``bertforge.cli``) parses flags, words errors and calls
these; a notebook calls them directly (docs/python.md).

=================  ===========================================  ==========================
function           does                                         returns
=================  ===========================================  ==========================
``distill``        a teacher taught to a smaller student        :class:`TrainResult`
``quantize``       INT8 for a CPU kind, with the accuracy gate  :class:`QuantizeResult`
``export``         ONNX export (+ ORT optimisation)             :class:`ExportResult`
``evaluate``       a model dir's task metrics on labelled data  :class:`EvalResult`
``embed``          sentence embeddings of texts                 ``(N, d)`` float32 array
=================  ===========================================  ==========================

The functions are exported as ``bertforge.distill``, ``bertforge.quantize``, ``bertforge.export``,
``bertforge.evaluate`` and ``bertforge.embed`` (loaded on first use); each module here holds one of them with its
option and result types (:mod:`~bertforge.pipelines.distill` builds its teachers, data and student in
:mod:`~bertforge.pipelines.distill_data`, its static table in :mod:`~bertforge.pipelines.distill_static`).
"""


def resolve_model_dir(name):
    """:func:`bertforge.checkpoint.read.resolve_model_dir`, imported on first call: a pipeline module loads
    without torch, so its options are checked (and the CLI's errors worded) before torch loads."""
    from ..checkpoint.read import resolve_model_dir as resolve
    return resolve(name)
