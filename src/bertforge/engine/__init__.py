"""The engine (above the core, below the runtime and the CLI): what trains a model, and how fast it runs.

* :mod:`bertforge.engine.train` — the one training loop (:class:`~bertforge.engine.train.trainer.Trainer`),
  training checkpoints and resume, RNG, distributed data parallel, precision, optimisers;
* :mod:`bertforge.engine.kernels` — the CPU speed paths chosen by ``impl.kernels`` (speed only, never results).

The engine imports the core only; the runtime and the CLI import it (import-linter contracts in pyproject.toml).
"""
