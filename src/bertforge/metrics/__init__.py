"""Metrics (core layer): numbers computed from predictions and references, with nothing run.

* :mod:`~bertforge.metrics.task` — the task metrics (accuracy, F1, MCC, Pearson, Spearman): :data:`METRICS`;
* :mod:`~bertforge.metrics.retrieval` — retrieval metrics (NDCG@k, MRR@k, Recall@k), exact nearest-neighbour
  search and faiss indexes.

Running a model to get the predictions is the runtime's (:mod:`bertforge.runtime`); this package imports
numpy only (scikit-learn, SciPy and faiss on first use).
"""
