"""The only training loop in bertforge.

Every verb (finetune, pretrain, distill, translate train) builds a model whose ``forward(**batch)``
returns an object with ``loss`` (scalar) and optionally ``terms`` (dict of named loss components,
logged), a dataset and a collator, and hands them to :class:`Trainer`. The Trainer owns the loop: AdamW +
warmup/decay (:mod:`.optim`), gradient accumulation and clipping, bf16 autocast (``impl.dtype``,
:mod:`.precision`), DDP or FSDP under ``torchrun`` (:mod:`.distributed`), ``torch.compile``
(``impl.compile``), collation in DataLoader workers (``impl.num_workers``), periodic evaluation with
best-checkpoint keeping, a NaN/inf guard, progress (:mod:`bertforge.progress`: a tqdm bar on a terminal, else
a plain stderr line with step, rate and ETA every ``$BERTFORGE_PROGRESS_EVERY`` seconds, 30 by default) and
``metrics.jsonl``. Beside it: the data order (:mod:`.sampler`), checkpoint files and the run directory's layout
(:mod:`.checkpoint`), RNG state (:mod:`.rng`) and the running loss means (:mod:`.running`).

An optimizer step takes ``train.grad_accum_steps`` micro-batches (``no_sync`` on all but the last); an epoch
has ``len(dataset) // (B · grad_accum_steps)`` steps (the remainder is dropped, as ``drop_last``), so the
data position of a checkpoint is just its step.
"""
from __future__ import annotations

import contextlib
import copy
import math
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn
from torch.utils.data import Dataset

from ...config import Recipe
from ...errors import ConfigError, TrainingError
from ...io import _explain, append_jsonl
from ..kernels import apply_kernels, kernels_in_use
from ..kernels.allocator import keep_freed_memory
from . import checkpoint as ckpt
from . import distributed as dist_utils
from .optim import make_optimizer, make_scheduler, resume_notes, set_peak_lr
from .precision import resolve_dtype, warn_if_emulated
from .rng import set_seed
from .running import RunningMeans, truncate_metrics
from .sampler import EpochSampler, GlobalMicroBatches, global_micro_batch, item_length, iterate


class Trainer:
    """Train ``model`` on ``train_dataset``.

    Args:
        model: ``forward(**batch)`` → object with ``.loss`` and optional ``.terms``. Under W > 1 processes a
            batch with token-level ``labels`` (B, T) also carries ``loss_normalizer`` (global count of targets
            / W, :func:`bertforge.engine.train.distributed.loss_normalizer`) when ``forward`` accepts it (by name or
            ``**kwargs``): a loss that is a mean over those targets divides its sum by it.
        train_dataset: a map-style dataset (``len`` + ``__getitem__``) of examples.
        collate_fn: list of examples → batch dict of tensors. It may draw random numbers (dynamic
            masking); the Trainer seeds it per global micro-batch so runs, resumes, DataLoader workers and
            any number of processes draw the same masks. Tensors whose first dimension is the batch are
            split across ranks; others are passed to every rank unchanged.
        recipe: the resolved recipe; ``train`` and ``impl`` sections are read here.
        out_dir: run directory (created; layout in :mod:`bertforge.engine.train.checkpoint`).
        eval_fn: ``eval_fn(model) -> dict`` of metrics, called (on rank 0) every ``train.eval_every``
            steps and at the end; ``train.metric_for_best`` names the key that picks the best checkpoint
            (higher is better unless it contains "loss").
        save_fn: ``save_fn(model, dir)`` writes the model in HF layout (default: ``model.save_pretrained``).
        sources: name → :func:`bertforge.io.dir_fingerprint` of each model dir the run reads, kept in every
            checkpoint; :meth:`resume` refuses a checkpoint written from other files.
    Raises:
        ConfigError: ``train.batch_size`` not divisible by the number of processes or larger than the training
            set (``reason="batch_exceeds_data"``), unknown ``impl.parallel``.
        DataError: an empty training set.
        TrainingError: the loss became NaN/inf (``reason="non_finite_loss"``; the last good checkpoint is
            kept); a checkpoint write failed.
        CheckpointError: resuming from a checkpoint that is incomplete or was written for other data / batch
            settings / source model dirs (see :meth:`resume`).
    """

    def __init__(self, model: nn.Module, train_dataset: Dataset, collate_fn: Callable, recipe: Recipe,
                 out_dir, eval_fn: Optional[Callable[[nn.Module], dict]] = None,
                 save_fn: Optional[Callable[[nn.Module, Path], None]] = None, sources: Optional[dict] = None):
        self.recipe, self.cfg, self.impl = recipe, recipe.train, recipe.impl
        self.sources = dict(sources or {})  # name → {"path", "sha256"} of the dirs the run started from
        self.out_dir = Path(out_dir)
        self.parallel = getattr(self.impl, "parallel", "ddp") or "ddp"
        if self.parallel not in dist_utils.PARALLEL:
            raise ConfigError(f"impl.parallel={self.parallel!r}; choose one of {', '.join(dist_utils.PARALLEL)}")
        self.ctx = dist_utils.init_distributed()
        self.device = self.ctx.device if self.impl.device == "auto" else torch.device(self.impl.device)
        if self.impl.threads:
            torch.set_num_threads(self.impl.threads)
        self.dtype = resolve_dtype(self.impl.dtype, str(self.device))  # "auto" → bfloat16 where native
        if self.is_main:
            warn_if_emulated(self.dtype, self.device.type)
        if self.device.type == "cpu" and getattr(self.impl, "keep_freed_memory", True):
            keep_freed_memory()  # no page faults on re-allocating last step's tensors (engine/kernels/allocator.py)
        if self.cfg.deterministic:
            dist_utils.set_deterministic()
        set_seed(self.cfg.seed)
        self.model = model.to(self.device)
        self.model = apply_kernels(self.model, getattr(self.impl, "kernels", "auto"))  # speed: impl.kernels
        #: the kernels in effect (``cpu`` | ``none``), named in the line :meth:`fit` prints when the run starts
        self.kernels = kernels_in_use(self.model)
        if self.cfg.dropout_off:
            for m in self.model.modules():
                if isinstance(m, nn.Dropout):
                    m.p = 0.0
        self.train_dataset, self.collate_fn, self.eval_fn = train_dataset, collate_fn, eval_fn
        self.save_fn = save_fn or (lambda m, d: m.save_pretrained(d))
        world = self.ctx.world_size
        # a dataset whose items are whole batches (``prebatched = True``, e.g. token-count batches for
        # translation) gives each rank its own items: the global micro-batch is batch_size × world items
        self.prebatched = bool(getattr(train_dataset, "prebatched", False))
        self.n_examples = len(train_dataset)
        self.global_micro = global_micro_batch(self.cfg.batch_size, world, self.n_examples, self.prebatched)
        group = self.cfg.group_by_length  # None: the dataset's choice (e.g. embedding_mse distillation's texts)
        if group is None:
            group = bool(getattr(train_dataset, "group_by_length", False))
        lengths = [item_length(train_dataset[i]) for i in range(self.n_examples)] \
            if group and not self.prebatched else None
        # a dataset trained with in-batch negatives names each item's texts (``batch_keys``): with
        # train.no_duplicates no global micro-batch holds one of them twice (sampler.no_duplicate_batches)
        keys = train_dataset.batch_keys() if getattr(self.cfg, "no_duplicates", True) and not self.prebatched \
            and callable(getattr(train_dataset, "batch_keys", None)) else None
        self.sampler = EpochSampler(self.n_examples, self.cfg.seed, True, self.ctx.rank, world,
                                    lengths=lengths, group=self.global_micro, keys=keys)
        self.duplicates: Optional[dict] = None  # the last epoch's no_duplicates counts (_report_duplicates)
        self.steps_per_epoch = max(1, self.n_examples // (self.global_micro * self.cfg.grad_accum_steps))
        self.total_steps = int(self.cfg.max_steps) if self.cfg.max_steps else max(
            1, int(math.ceil(self.cfg.epochs * self.steps_per_epoch)))
        # FSDP shards the parameters in place: keep a weightless (meta) skeleton to rebuild a plain module
        # from a gathered state dict at save time, and wrap before the optimizer sees the parameters
        self._skeleton = copy.deepcopy(self.model).to("meta") if self._fsdp else None
        self.ddp_model = dist_utils.wrap_model(self.model, self.ctx, self.parallel)
        self.train_model = torch.compile(self.ddp_model) if self.impl.compile else self.ddp_model
        self._takes_normalizer = dist_utils.takes_loss_normalizer(model)
        self.optimizer = make_optimizer(self.model, self.cfg.lr, self.cfg.weight_decay, self.cfg.adam_betas,
                                        self.cfg.adam_eps)
        self.scheduler = make_scheduler(self.optimizer, self.cfg.schedule, self._warmup(self.total_steps),
                                        self.total_steps)
        if self.ctx.rank:  # model-internal randomness (dropout) differs per rank; data order does not
            torch.manual_seed(self.cfg.seed + 1_000_003 * self.ctx.rank)
        self.step, self.best, self.best_step = 0, None, None
        self.metrics_path, self.ckpt_root = self.out_dir / "metrics.jsonl", self.out_dir / "checkpoints"
        self.checkpoints = ckpt.Checkpointer(self.ckpt_root, self.model, self.optimizer, self.scheduler, self.ctx,
                                             self.save_fn, self._skeleton)
        self._running = RunningMeans()
        self._warned_metric = False

    @property
    def is_main(self) -> bool:
        return self.ctx.rank == 0

    @property
    def _fsdp(self) -> bool:
        return self.parallel == "fsdp" and self.ctx.world_size > 1

    def _autocast(self):
        if self.dtype == "bfloat16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _log(self, record: dict) -> None:
        if self.is_main:
            try:
                append_jsonl(self.metrics_path, record)
            except OSError as e:
                raise _explain(e, self.metrics_path) from None

    def _warmup(self, total: int) -> int:
        """Warm-up steps of a run of ``total`` steps: ``train.warmup_steps``, else ``warmup_ratio · total``."""
        return self.cfg.warmup_steps if self.cfg.warmup_steps is not None else int(self.cfg.warmup_ratio * total)

    def _batches(self, epoch: int, skip: int):
        """Yield this rank's share of the global micro-batches of ``epoch``, from optimizer step ``skip`` on
        (order: :mod:`bertforge.engine.train.sampler`), collated in ``impl.num_workers`` worker processes if > 0."""
        accum, n_micro = self.cfg.grad_accum_steps, self.steps_per_epoch * self.cfg.grad_accum_steps
        self.sampler.set_epoch(epoch)
        order = self.sampler.global_order(n_micro * self.global_micro)
        self._report_duplicates(n_micro)
        items = GlobalMicroBatches(self.train_dataset, self.collate_fn, order, self.global_micro,
                                   self.cfg.seed, epoch, self.ctx.rank, self.ctx.world_size, self.prebatched)
        return iterate(items, range(skip * accum, n_micro), int(getattr(self.impl, "num_workers", 0) or 0),
                       pin_memory=self.device.type == "cuda")

    def _report_duplicates(self, n_micro: int) -> None:
        """One stderr line per epoch (rank 0) with what ``train.no_duplicates`` did to its order: pairs deferred
        to a later batch, pairs dropped (no clean batch could hold them), pairs of the incomplete last batch, and
        the totals in ``self.duplicates``."""
        d = self.sampler.duplicates
        if d is None:
            return
        self.duplicates = {**d, "micro_batches": n_micro}
        if self.is_main:
            cycled = f"; {n_micro - d['batches']} batches repeated to fill the epoch" if d["batches"] < n_micro else ""
            print(f"bertforge train: no_duplicates (epoch {d['epoch']}): {d['deferred']} of {self.n_examples} pairs "
                  f"deferred to a later batch, {d['dropped']} dropped (no batch of {self.global_micro} left could "
                  f"hold them without a repeated text), {d['unfilled']} in the incomplete last batch{cycled}; "
                  f"train.no_duplicates=false turns this off", file=sys.stderr, flush=True)

    def _forward(self, batch: dict):
        batch = {k: (v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()
                 if k != "loss_normalizer" or self._takes_normalizer}
        return self.train_model(**batch)

    # -------------------------------------------------------------- checkpoints
    def latest_checkpoint(self) -> Optional[Path]:
        return ckpt.latest_checkpoint(self.ckpt_root)

    def _state(self) -> dict:
        return {"step": self.step, "best": self.best, "best_step": self.best_step,
                "world_size": self.ctx.world_size, "seed": self.cfg.seed,
                # data position: epoch and next global micro-batch; the order is a function of the seed
                "epoch": self.step // self.steps_per_epoch,
                "micro_batch": (self.step % self.steps_per_epoch) * self.cfg.grad_accum_steps,
                "examples_seen": self.step * self.global_micro * self.cfg.grad_accum_steps,
                "global_micro_batch": self.global_micro,
                "n_examples": self.n_examples, "batch_size": self.cfg.batch_size,
                "grad_accum_steps": self.cfg.grad_accum_steps, "steps_per_epoch": self.steps_per_epoch,
                "total_steps": self.total_steps, "sources": self.sources,
                "running": {k: [float(s), int(c)] for k, (s, c) in self._running.reduce(self.ctx).items()}}

    def save_checkpoint(self) -> None:
        """Write ``checkpoints/step-N`` (:meth:`bertforge.engine.train.checkpoint.Checkpointer.save`): all of it or
        nothing, keeping the last ``train.keep_checkpoints`` plus the best. A collective."""
        self.checkpoints.save(self.step, self._state(), self.cfg.keep_checkpoints, self.best_step)

    def resume(self, path: Optional[Path] = None) -> bool:
        """Load model/optimizer/scheduler/RNG (this rank's) and the data position from ``path`` (default: the
        latest checkpoint). Returns False when there is none.

        Raises:
            CheckpointError: a file is missing (``reason="incomplete"``) or unreadable, or the checkpoint's data
                position means something else in this run (:func:`bertforge.engine.train.checkpoint.check_state`).
            ConfigError: the checkpoint is past this run's last step (``reason="past_end"``).
        """
        path = Path(path) if path else self.latest_checkpoint()
        if path is None:
            return False
        expected = {"seed": self.cfg.seed, "n_examples": self.n_examples, "batch_size": self.cfg.batch_size,
                    "grad_accum_steps": self.cfg.grad_accum_steps, "global_micro_batch": self.global_micro}
        state = self.checkpoints.load(path, expected, self.sources, self.total_steps)
        for name, was in (state.get("sources") or {}).items():  # same files: keep the dir the run started from
            if name in self.sources:
                self.sources[name] = dict(was)
        self.step, self.best, self.best_step = state["step"], state["best"], state["best_step"]
        old_lr = set_peak_lr(self.scheduler, self.optimizer, self.cfg.lr)
        for note in resume_notes(path.name, self.step, old_lr, self.cfg.lr, self.cfg.schedule,
                                 state.get("total_steps"), self.total_steps, self._warmup):
            if self.is_main:
                print(note, file=sys.stderr)
        # rank 0 carries the reduced sums of the interrupted log window; the others start at zero
        self._running = RunningMeans({k: ((s, c) if self.is_main else (0.0, 0))
                                      for k, (s, c) in (state.get("running") or {}).items()})
        return True

    # ---------------------------------------------------------------- evaluate
    def evaluate(self) -> dict:
        """Run ``eval_fn`` on rank 0 (every rank under FSDP: the weights are sharded), share its metrics
        with every rank; update the best step."""
        if self.eval_fn is None:
            return {}
        metrics: dict = {}
        if self.is_main or self._fsdp:
            self.model.eval()
            with torch.no_grad(), self._autocast():
                metrics = self.eval_fn(self.model)
            self.model.train()
        metrics = dist_utils.broadcast_object(metrics, self.ctx)
        key = self.cfg.metric_for_best or (next(iter(metrics)) if metrics else None)
        if key is not None and key not in metrics and metrics and self.is_main and not self._warned_metric:
            self._warned_metric = True
            print(f"bertforge: warning: train.metric_for_best={key!r} is not among the evaluation's metrics "
                  f"({', '.join(map(str, metrics))}); no best checkpoint is tracked — set it to one of them",
                  file=sys.stderr)
        if key is not None and key in metrics:
            v = float(metrics[key])
            if self.best is None or (v < self.best if "loss" in key else v > self.best):
                self.best, self.best_step = v, self.step
        self._log({"step": self.step, "eval": metrics})
        return metrics

    # --------------------------------------------------------------------- fit
    def fit(self, resume: bool = False) -> dict:
        """Train to ``total_steps`` (``train.max_steps`` or ``train.epochs``), from the latest checkpoint
        when ``resume``. Returns ``{"step", "best", "best_step", "model_step" (the step whose weights are
        written at the top of out_dir: ``best_step`` with ``train.load_best_at_end``), **the last evaluation's
        metrics, "eval_step"}``.

        Raises:
            TrainingError: NaN/inf loss on any rank (before the optimizer step; the last checkpoint is
                intact and named in the message), or a failed checkpoint write.
            CheckpointError, ConfigError: see :meth:`resume`.
        """
        if self.is_main:
            try:
                self.out_dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise _explain(e, self.out_dir) from None
            ckpt.clean_stale(self.ckpt_root)
        dist_utils.barrier(self.ctx)
        if resume:  # before anything is written: a refused resume leaves the run dir as it was
            if self.resume():
                if self.is_main:
                    truncate_metrics(self.metrics_path, self.step)
            elif self.is_main:
                print(f"bertforge: no checkpoint in {self.ckpt_root}; starting from step 0")
        elif self.is_main and self.metrics_path.exists():
            self.metrics_path.unlink()
        if self.is_main:
            self.recipe.save(self.out_dir / "recipe.yaml")
        dist_utils.barrier(self.ctx)
        if self.is_main:
            print(self.start_line(), file=sys.stderr, flush=True)
        from ...progress import Progress  # a bar on a terminal, plain lines with rate and ETA in a log
        bar = Progress(self.total_steps, "train", unit="step", initial=self.step, show=self.impl.progress,
                       quiet=not self.is_main)
        self.model.train()
        accum, running = self.cfg.grad_accum_steps, self._running
        eval_every = self.cfg.eval_every or self.steps_per_epoch
        save_every = self.cfg.save_every or self.steps_per_epoch
        t0, c0, tokens, examples = time.perf_counter(), time.process_time(), 0, 0
        last_metrics: dict = {}
        while self.step < self.total_steps:
            epoch, skip = divmod(self.step, self.steps_per_epoch)
            losses: list = []  # this optimizer step's micro-batch losses, on the device
            for micro, batch in enumerate(self._batches(epoch, skip), 1):
                if "attention_mask" in batch:  # counted on the host, before the batch moves
                    tokens += int(batch["attention_mask"].sum())
                examples += int(next(iter(v for v in batch.values() if torch.is_tensor(v))).shape[0])
                sync = micro % accum == 0  # the last micro-batch of the step: gradients are all-reduced
                local = contextlib.nullcontext() if sync else dist_utils.no_sync(self.ddp_model, self.model, self._fsdp)
                with local, self._autocast():
                    out = self._forward(batch)
                    loss = out.loss if not isinstance(out, dict) else out["loss"]
                    (loss / accum).backward()
                losses.append(loss.detach())
                running.add("loss", loss)
                terms = getattr(out, "terms", None) if not isinstance(out, dict) else out.get("terms")
                for k, v in (terms or {}).items():
                    running.add(k, v)
                if not sync:
                    continue
                self._guard_finite(losses, bar)
                losses = []
                if self.cfg.max_grad_norm and self.cfg.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.step += 1
                bar.update(1)
                if self.cfg.max_minutes and dist_utils.any_rank(
                        time.perf_counter() - t0 >= 60.0 * self.cfg.max_minutes, self.ctx):
                    self.total_steps = self.step  # train.max_minutes reached: final eval + save below
                if self.step % self.cfg.log_every == 0 or self.step == self.total_steps:
                    rec = running.means(self.ctx)  # the one host sync of the loss terms per log step
                    running.clear()
                    dt = time.perf_counter() - t0
                    rec.update(step=self.step, epoch=epoch, lr=self.scheduler.get_last_lr()[0],
                               elapsed_s=dt, cpu_s=time.process_time() - c0,
                               examples_per_s=examples * self.ctx.world_size / dt,
                               tokens_per_s=tokens * self.ctx.world_size / dt)
                    self._log(rec)
                    bar.set_postfix(loss=f"{rec['loss']:.4f}")
                if self.eval_fn is not None and (self.step % eval_every == 0 or self.step == self.total_steps):
                    last_metrics = {**self.evaluate(), "eval_step": self.step}
                if self.step % save_every == 0 or self.step == self.total_steps:
                    self.save_checkpoint()
                if self.step >= self.total_steps:
                    break
        bar.close()
        model_step = self.checkpoints.write_final(self.out_dir, self.step, self.best, self.best_step,
                                                  self.cfg.load_best_at_end, self.cfg.save_every)
        dup = {"no_duplicates": self.duplicates} if self.duplicates is not None else {}
        return {"step": self.step, "best": self.best, "best_step": self.best_step, "model_step": model_step,
                **last_metrics, **dup}

    def start_line(self) -> str:
        """The line :meth:`fit` prints on stderr (rank 0) when the run starts: from which step, where, in which
        dtype and with which kernels (``impl.kernels``, :mod:`bertforge.engine.kernels`), e.g.
        ``bertforge train: step 0 of 40 on cpu, float32, kernels cpu (impl.kernels=auto)``."""
        return (f"bertforge train: step {self.step} of {self.total_steps} on {self.device.type}, {self.dtype}, "
                f"kernels {self.kernels} (impl.kernels={getattr(self.impl, 'kernels', 'auto')})")

    def _guard_finite(self, losses: list, bar) -> None:
        """TrainingError (``reason="non_finite_loss"``) before the optimizer step when a micro-batch loss of
        this step is NaN/inf on any rank (one host sync per optimizer step)."""
        window = torch.stack([x.float().reshape(()) for x in losses])
        bad = None if bool(torch.isfinite(window).all()) else next(
            float(x) for x in losses if not math.isfinite(float(x)))
        if dist_utils.any_rank(bad is not None, self.ctx):
            self.optimizer.zero_grad(set_to_none=True)
            bar.close()
            what = f"{bad}" if bad is not None else "NaN/inf on another rank"
            last = self.latest_checkpoint()
            raise TrainingError(f"loss became {what} at step {self.step + 1}; lower train.lr or use "
                                f"impl.dtype=float32 and resume from the last good checkpoint ({last or 'none yet'})",
                                reason="non_finite_loss", what=what, step=self.step + 1, last=last)
