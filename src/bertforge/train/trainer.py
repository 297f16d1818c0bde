"""The only training loop in bertforge.

Every verb (finetune, pretrain, distill, translate train) builds a model whose ``forward(**batch)``
returns an object with ``loss`` (scalar) and optionally ``terms`` (dict of named loss components,
logged), a dataset and a collator, and hands them to :class:`Trainer`. The Trainer owns the rest:
AdamW + warmup/decay, gradient accumulation and clipping, bf16 autocast (``impl.dtype``), DDP or FSDP
under ``torchrun`` (gloo on CPU, NCCL on GPU), periodic evaluation with best-checkpoint keeping, atomic
checkpoints with optimizer/scheduler/RNG state (every rank) and data position, ``--resume``, a NaN/inf
guard, tqdm progress and ``metrics.jsonl``; on CPU, glibc ``malloc`` keeps freed memory for the next step
(``impl.keep_freed_memory``, :mod:`bertforge.kernels.allocator`).

Data order (what makes 1 process ≡ N processes, and resume ≡ no interruption): epoch ``e`` is a
permutation of the dataset that is a pure function of ``(train.seed, e)``; global micro-batch ``j`` of
epoch ``e`` is the slice ``[j·B, (j+1)·B)`` of it (``B = train.batch_size``), and it is collated — with
the collator's random draws (dynamic masking) seeded by ``(seed, e, j)`` — identically on every rank;
rank ``r`` of ``W`` then trains on rows ``r, r+W, …`` of it. DDP averages the ``W`` shard gradients,
which equals the gradient of the mean loss over the global micro-batch. An optimizer step takes
``train.grad_accum_steps`` micro-batches (``no_sync`` on all but the last); an epoch has
``len(dataset) // (B · grad_accum_steps)`` steps (the remainder is dropped, as ``drop_last``), so the
data position of a checkpoint is just its step.

Layout of ``out_dir``::

    recipe.yaml              the resolved recipe (re-run from it)
    metrics.jsonl            one JSON object per log/eval event
    config.json, model.safetensors, tokenizer.json …   the final (or best) model, HF layout
    checkpoints/step-N/      model (HF layout) + trainer_model.safetensors + trainer_state.json
                             + optimizer.pt + scheduler.pt + rng.pt (one RNG state per rank)

Every checkpoint directory is written under a hidden temporary name and renamed when complete
(:func:`bertforge.io.atomic_dir`), so a kill at any moment leaves the previous checkpoint loadable.
Weights are safetensors; ``optimizer.pt``/``scheduler.pt``/``rng.pt`` hold only tensors and plain
containers and are read with ``torch.load(weights_only=True)``.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, Sampler

from ..config import Recipe
from ..errors import BertforgeError, CheckpointError, ConfigError, DataError, TrainingError
from ..io import _explain, append_jsonl, atomic_dir, atomic_write_text
from ..kernels import apply_kernels
from ..kernels.allocator import keep_freed_memory
from . import distributed as dist_utils
from .optim import make_optimizer, make_scheduler
from .precision import resolve_dtype, warn_if_emulated

#: test hook: seconds to sleep inside a checkpoint write (after the model files, before the rename)
CKPT_DELAY_ENV = "BERTFORGE_TEST_CKPT_WRITE_DELAY"


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every GPU) RNGs. Call it before building a model whose
    fresh weights (e.g. a new head) must be the same in every run and on every rank."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class EpochSampler(Sampler):
    """Shuffles with a generator seeded by (seed, epoch) and shards across ranks.

    The order of epoch e is a pure function of (seed, e), so a resumed run skips exactly the batches it
    already saw, and N processes see the same global order as one. :meth:`global_order` is what the
    Trainer slices into global micro-batches; :meth:`order` (every W-th index, padded by repetition so
    every rank has the same count, as ``DistributedSampler``) is this rank's share of it.
    """

    def __init__(self, n: int, seed: int, shuffle: bool = True, rank: int = 0, world: int = 1):
        self.n, self.seed, self.shuffle, self.rank, self.world = n, seed, shuffle, rank, world
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def global_order(self, length: Optional[int] = None) -> list:
        """The permutation of epoch ``self.epoch`` (identical on every rank), repeated cyclically up to
        ``length`` indices when the dataset is smaller than that."""
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed * 1000003 + self.epoch)
            idx = torch.randperm(self.n, generator=g).tolist()
        else:
            idx = list(range(self.n))
        if length is not None and length > len(idx):
            idx = (idx * (length // max(1, len(idx)) + 1))[:length]
        return idx

    def order(self) -> list:
        idx = self.global_order()
        per = math.ceil(self.n / self.world)
        idx = idx + idx[: per * self.world - self.n]
        return idx[self.rank::self.world]

    def __iter__(self):
        return iter(self.order())

    def __len__(self) -> int:
        return math.ceil(self.n / self.world)


class Trainer:
    """Train ``model`` on ``train_dataset``.

    Args:
        model: ``forward(**batch)`` → object with ``.loss`` and optional ``.terms``.
        train_dataset: a map-style dataset (``len`` + ``__getitem__``) of examples.
        collate_fn: list of examples → batch dict of tensors. It may draw random numbers (dynamic
            masking); the Trainer seeds it per global micro-batch so runs, resumes and any number of
            processes draw the same masks. Tensors whose first dimension is the batch are split across
            ranks; others are passed to every rank unchanged.
        recipe: the resolved recipe; ``train`` and ``impl`` sections are read here.
        out_dir: run directory (created; see module doc for its layout).
        eval_fn: ``eval_fn(model) -> dict`` of metrics, called (on rank 0) every ``train.eval_every``
            steps and at the end; ``train.metric_for_best`` names the key that picks the best checkpoint
            (higher is better unless it contains "loss").
        save_fn: ``save_fn(model, dir)`` writes the model in HF layout (default: ``model.save_pretrained``).
        sources: flag → :func:`bertforge.io.dir_fingerprint` of each model dir the run reads (``--model``,
            ``--teacher``…), kept in every checkpoint; ``--resume`` refuses one whose files differ.
    Raises:
        ConfigError: ``train.batch_size`` not divisible by the number of processes or larger than the training
            set, unknown ``impl.parallel``.
        DataError: an empty training set.
        TrainingError: the loss became NaN/inf (the last good checkpoint is kept); a checkpoint write failed.
        CheckpointError: ``--resume`` from a checkpoint that is incomplete or was written for other data /
            batch settings / source model dirs.
    """

    def __init__(self, model: nn.Module, train_dataset: Dataset, collate_fn: Callable, recipe: Recipe,
                 out_dir, eval_fn: Optional[Callable[[nn.Module], dict]] = None,
                 save_fn: Optional[Callable[[nn.Module, Path], None]] = None,
                 global_batch_size: Optional[int] = None, sources: Optional[dict] = None):
        self.recipe, self.cfg, self.impl = recipe, recipe.train, recipe.impl
        self.sources = dict(sources or {})  # flag → {"path", "sha256"} of the dirs the run started from
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
            keep_freed_memory()  # no page faults on re-allocating last step's tensors (kernels/allocator.py)
        if self.cfg.deterministic:
            dist_utils.set_deterministic()
        set_seed(self.cfg.seed)
        self.model = model.to(self.device)
        self.model = apply_kernels(self.model, getattr(self.impl, "kernels", "auto"))  # speed: impl.kernels
        if self.cfg.dropout_off:
            for m in self.model.modules():
                if isinstance(m, nn.Dropout):
                    m.p = 0.0
        self.train_dataset, self.collate_fn = train_dataset, collate_fn
        self.eval_fn = eval_fn
        self.save_fn = save_fn or (lambda m, d: m.save_pretrained(d))
        world = self.ctx.world_size
        # a dataset whose items are whole batches (``prebatched = True``, e.g. token-count batches for
        # translation) gives each rank its own items: the global micro-batch is batch_size × world items
        self.prebatched = bool(getattr(train_dataset, "prebatched", False))
        if self.prebatched:
            self.micro_batch, self.global_micro = self.cfg.batch_size, self.cfg.batch_size * world
        elif self.cfg.batch_size % world:
            raise ConfigError(f"train.batch_size={self.cfg.batch_size} is not divisible by the "
                              f"{world} processes; pick a multiple of {world}")
        else:
            # train.batch_size is the global micro-batch; each rank takes batch_size / world rows of it
            self.micro_batch, self.global_micro = self.cfg.batch_size // world, self.cfg.batch_size
        self.n_examples = len(train_dataset)
        if self.n_examples == 0:
            raise DataError("the training set is empty; pass a file with examples")
        check_batch_fits(self.global_micro, self.n_examples)
        self.sampler = EpochSampler(self.n_examples, self.cfg.seed, True, self.ctx.rank, world)
        self.steps_per_epoch = max(1, self.n_examples // (self.global_micro * self.cfg.grad_accum_steps))
        if self.cfg.max_steps:
            self.total_steps = int(self.cfg.max_steps)
        else:
            self.total_steps = max(1, int(math.ceil(self.cfg.epochs * self.steps_per_epoch)))
        warm = self._warmup(self.total_steps)
        # FSDP shards the parameters in place: keep a weightless (meta) skeleton to rebuild a plain module
        # from a gathered state dict at save time, and wrap before the optimizer sees the parameters
        self._skeleton = None
        if self.parallel == "fsdp" and world > 1:
            import copy
            self._skeleton = copy.deepcopy(self.model).to("meta")
        self.ddp_model = dist_utils.wrap_model(self.model, self.ctx, self.parallel)
        self.optimizer = make_optimizer(self.model, self.cfg.lr, self.cfg.weight_decay, self.cfg.adam_betas,
                                        self.cfg.adam_eps)
        self.scheduler = make_scheduler(self.optimizer, self.cfg.schedule, warm, self.total_steps)
        if self.ctx.rank:  # model-internal randomness (dropout) differs per rank; data order does not
            torch.manual_seed(self.cfg.seed + 1_000_003 * self.ctx.rank)
        self.step = 0
        self.best: Optional[float] = None
        self.best_step: Optional[int] = None
        self.metrics_path = self.out_dir / "metrics.jsonl"
        self._running: dict = {}
        self._warned_metric = False

    # ------------------------------------------------------------------ helpers
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

    def _batches(self, epoch: int, skip: int):
        """Yield this rank's share of the global micro-batches of ``epoch``, from optimizer step
        ``skip`` on (see the module doc for the order)."""
        accum, B, W, r = self.cfg.grad_accum_steps, self.global_micro, self.ctx.world_size, self.ctx.rank
        n_micro = self.steps_per_epoch * accum
        self.sampler.set_epoch(epoch)
        order = self.sampler.global_order(n_micro * B)
        for j in range(skip * accum, n_micro):
            idx = order[j * B:(j + 1) * B]
            # the collator's randomness (dynamic masking) is a function of (seed, epoch, micro-batch)
            seed = (self.cfg.seed * 7919 + epoch * 1_000_003 + j * 31) % 2**63
            if self.prebatched:  # this rank's own items of the global micro-batch
                idx = idx[r * self.micro_batch:(r + 1) * self.micro_batch]
                with _seeded((seed + 7 * r) % 2**63):
                    batch = self.collate_fn([self.train_dataset[i] for i in idx])
                yield batch
                continue
            with _seeded(seed):
                batch = self.collate_fn([self.train_dataset[i] for i in idx])
            if W > 1:
                norms = _target_counts(batch, W)
                batch = _shard(batch, r, W, len(idx))
                if norms:
                    batch["__target_norms__"] = norms
            yield batch

    def _forward(self, batch: dict):
        norms = batch.pop("__target_norms__", None)
        if not norms:
            return self.ddp_model(**batch)
        with dist_utils.target_normalizers(norms):
            return self.ddp_model(**batch)

    def _to_device(self, batch: dict) -> dict:
        return {k: (v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v)
                for k, v in batch.items()}

    # -------------------------------------------------------------- checkpoints
    def _ckpt_root(self) -> Path:
        return self.out_dir / "checkpoints"

    def _full_state(self) -> tuple:
        """(model state dict, optimizer state dict) as full, unsharded tensors — a collective under FSDP."""
        if not self._fsdp:
            return None, self.optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return (get_model_state_dict(self.model, options=opts),
                get_optimizer_state_dict(self.model, self.optimizer, options=opts))

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
                "running": {k: [float(s), int(c)] for k, (s, c) in
                            _reduce(self._running, self.ctx).items()}}

    def save_checkpoint(self) -> None:
        """Write ``checkpoints/step-N`` atomically (all of it, or nothing), then rotate old ones
        (keep the last ``train.keep_checkpoints`` plus the best). A collective: call it on every rank.

        Raises:
            TrainingError / BertforgeError: the write failed (disk full, permission…); nothing
                half-written is left under ``step-N`` and older checkpoints are intact.
        """
        rng = dist_utils.gather_object(_rng_state_portable(), self.ctx)
        model_sd, optim_sd = self._full_state()
        state = self._state()
        err: Optional[BaseException] = None
        if self.is_main:
            target = self._ckpt_root() / f"step-{self.step}"
            try:
                with atomic_dir(target) as tmp:
                    self._save_model(tmp, model_sd)
                    _test_delay(self.step)
                    _torch_save(optim_sd, tmp / "optimizer.pt")
                    _torch_save(self.scheduler.state_dict(), tmp / "scheduler.pt")
                    _torch_save({"world_size": self.ctx.world_size, "ranks": rng}, tmp / "rng.pt")
                    (tmp / "trainer_state.json").write_text(json.dumps(state), encoding="utf-8")
                self._rotate()
            except OSError as e:
                err = _explain(e, target)
            except BertforgeError as e:
                err = e
        if dist_utils.any_rank(err is not None, self.ctx):
            if err is not None:
                raise err
            raise TrainingError("rank 0 could not write a checkpoint (see its message); free space or "
                                "choose a writable --out")

    def _save_model(self, tmp: Path, model_sd: Optional[dict]) -> None:
        from safetensors.torch import save_model
        if model_sd is None:
            self.save_fn(self.model, tmp)
            save_model(self.model, str(tmp / "trainer_model.safetensors"))
            return
        # FSDP: a plain CPU copy of the module carries the gathered weights into save_fn
        plain = _plain_copy(self._skeleton, model_sd)
        self.save_fn(plain, tmp)
        save_model(plain, str(tmp / "trainer_model.safetensors"))

    def _rotate(self) -> None:
        ckpts = sorted(self._ckpt_root().glob("step-*"), key=_step_of)
        keep = set(ckpts[-max(1, self.cfg.keep_checkpoints):])
        if self.best_step is not None:
            keep.add(self._ckpt_root() / f"step-{self.best_step}")
        for p in ckpts:
            if p not in keep:
                # rename first (atomic): a kill during rmtree leaves no half-deleted step-N behind
                gone = p.with_name(f".{p.name}.deleting")
                os.replace(p, gone)
                shutil.rmtree(gone, ignore_errors=True)

    def _clean_stale(self) -> None:
        """Remove temporaries of checkpoint writes that a kill interrupted."""
        root = self._ckpt_root()
        if root.is_dir():
            for p in root.glob(".step-*"):
                shutil.rmtree(p, ignore_errors=True)

    def latest_checkpoint(self) -> Optional[Path]:
        return _latest_checkpoint(self._ckpt_root())

    def _warmup(self, total: int) -> int:
        """Warm-up steps of a run of ``total`` steps: ``train.warmup_steps``, else ``warmup_ratio · total``."""
        return self.cfg.warmup_steps if self.cfg.warmup_steps is not None else int(self.cfg.warmup_ratio * total)

    def resume(self, path: Optional[Path] = None) -> bool:
        """Load model/optimizer/scheduler/RNG (this rank's) and the data position from ``path`` (default:
        the latest checkpoint). Returns False when there is none.

        Raises:
            CheckpointError: a file is missing or unreadable, or the checkpoint cannot be continued by this
                run (:func:`_check_state`: another verb, model, task or source files, training set size —
                with the recipe values that differ, the likely cause —, batch size or accumulation).
        """
        path = Path(path) if path else self.latest_checkpoint()
        if path is None:
            return False
        need = ("trainer_state.json", "trainer_model.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt")
        missing = [f for f in need if not (path / f).is_file()]
        if missing:
            raise CheckpointError(f"checkpoint {path} has no {missing[0]}; resume from another "
                                  f"checkpoint or run without --resume")
        state = _read_state(path)
        _check_state(path, state, self.n_examples, self.cfg, self.global_micro, self.sources,
                     self.out_dir, self.recipe)
        if state["step"] > self.total_steps:
            raise ConfigError(f"--resume: {path} is at step {state['step']}, past this run's {self.total_steps} "
                              f"steps (train.max_steps / --max-steps, or train.epochs); pass more steps to "
                              f"train further, or use the run as it is")
        for flag, was in (state.get("sources") or {}).items():  # same files: keep the dir the run started from
            if flag in self.sources:
                self.sources[flag] = dict(was)
        try:
            from safetensors.torch import load_model
            if self._fsdp:
                from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                                     set_optimizer_state_dict)
                opts = StateDictOptions(full_state_dict=True)
                plain = _plain_copy(self._skeleton, {})
                load_model(plain, str(path / "trainer_model.safetensors"))
                set_model_state_dict(self.model, plain.state_dict(), options=opts)
                set_optimizer_state_dict(self.model, self.optimizer,
                                         torch.load(path / "optimizer.pt", weights_only=True), options=opts)
            else:
                missing_k, unexpected = load_model(self.model, str(path / "trainer_model.safetensors"),
                                                   strict=False)
                if missing_k or unexpected:
                    raise CheckpointError(f"{path} does not fit this model ({(missing_k or unexpected)[0]}); "
                                          f"resume with the same model and recipe")
                self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
            self.scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
            rng = torch.load(path / "rng.pt", weights_only=True)
        except CheckpointError:
            raise
        except Exception as e:  # truncated file, unpickling refused, shape mismatch …
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
            why = next((ln for ln in lines if "size mismatch" in ln or "Missing" in ln), lines[0] if lines
                       else type(e).__name__)
            raise CheckpointError(f"checkpoint {path} cannot be loaded ({why[:200]}); resume with the options "
                                  f"and model.* overrides the run was started with, or, if the files are "
                                  f"damaged, delete that step-N dir to resume from the one before it") from None
        if isinstance(rng, dict) and "ranks" in rng:
            ranks = rng["ranks"]
            _set_rng_state_portable(ranks[self.ctx.rank % len(ranks)])
        else:  # single-state format of earlier checkpoints
            _set_rng_state_portable(rng)
        self.step, self.best, self.best_step = state["step"], state["best"], state["best_step"]
        self._apply_peak_lr(path)
        planned = state.get("total_steps")
        # linear and cosine decay over the total; constant and inverse_sqrt only through a warm-up ratio
        moves = self.cfg.schedule in ("linear", "cosine") or self._warmup(planned or 0) != self._warmup(
            self.total_steps)
        if planned is not None and planned != self.total_steps and moves and self.is_main:
            print(f"bertforge: resuming at step {self.step} a run planned for {planned} steps as one of "
                  f"{self.total_steps}: the learning-rate schedule is recomputed over {self.total_steps} steps "
                  f"(the rate jumps), so this is not the same as one run of {self.total_steps} steps",
                  file=sys.stderr)
        run = state.get("running") or {}
        # rank 0 carries the reduced sums of the interrupted log window; the others start at zero
        self._running = {k: ((s, c) if self.is_main else (0.0, 0)) for k, (s, c) in run.items()}
        return True

    def _apply_peak_lr(self, path: Path) -> None:
        """The scheduler's state carries the peak lr of the run that wrote it: a resume with another
        ``train.lr`` continues the schedule from the new peak (and says so) rather than silently keeping
        the old one, which ``recipe.yaml`` would no longer record."""
        old = list(self.scheduler.base_lrs)
        new = [float(self.cfg.lr)] * len(old)
        self.scheduler.base_lrs = new
        # the rate of the next step, also when the schedule's length changed (train.max_steps)
        for group, base, factor in zip(self.optimizer.param_groups, new, self.scheduler.lr_lambdas):
            group["initial_lr"] = base
            group["lr"] = base * factor(self.scheduler.last_epoch)
        if old != new and self.is_main:
            print(f"bertforge: resuming from {path.name} with train.lr={self.cfg.lr:g} (the run had "
                  f"{old[0]:g}): the schedule continues from step {self.step} with the new peak",
                  file=sys.stderr)

    def _truncate_metrics(self, step: int) -> None:
        """Drop log records written after ``step`` (by the killed run), and a torn last line."""
        if not (self.is_main and self.metrics_path.is_file()):
            return
        keep = []
        for line in self.metrics_path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("step", 0) <= step:
                keep.append(line)
        atomic_write_text(self.metrics_path, "".join(x + "\n" for x in keep))

    # ---------------------------------------------------------------- evaluate
    def evaluate(self) -> dict:
        """Run ``eval_fn`` on rank 0 and share its metrics with every rank; update the best step."""
        if self.eval_fn is None:
            return {}
        metrics: dict = {}
        if self.is_main and not self._fsdp:
            self.model.eval()
            with torch.no_grad(), self._autocast():
                metrics = self.eval_fn(self.model)
            self.model.train()
        elif self._fsdp:  # sharded weights: every rank takes part in the forward passes
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
            better = (self.best is None or (v < self.best if "loss" in key else v > self.best))
            if better:
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
        """
        if self.is_main:
            try:
                self.out_dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise _explain(e, self.out_dir) from None
            self._clean_stale()
        dist_utils.barrier(self.ctx)
        if resume:  # before anything is written: a refused resume leaves the run dir as it was
            if self.resume():
                self._truncate_metrics(self.step)
            elif self.is_main:
                print(f"bertforge: no checkpoint in {self._ckpt_root()}; starting from step 0")
        elif self.is_main and self.metrics_path.exists():
            self.metrics_path.unlink()
        if self.is_main:
            self.recipe.save(self.out_dir / "recipe.yaml")
        dist_utils.barrier(self.ctx)
        from tqdm.auto import tqdm
        bar = tqdm(total=self.total_steps, initial=self.step, desc="train", unit="step",
                   disable=not (self.impl.progress and self.is_main), dynamic_ncols=True)
        self.model.train()
        accum = self.cfg.grad_accum_steps
        eval_every = self.cfg.eval_every or self.steps_per_epoch
        save_every = self.cfg.save_every or self.steps_per_epoch
        t0, c0, tokens, examples = time.perf_counter(), time.process_time(), 0, 0
        last_metrics: dict = {}
        running = self._running
        while self.step < self.total_steps:
            epoch, skip = divmod(self.step, self.steps_per_epoch)
            micro, bad = 0, None
            for batch in self._batches(epoch, skip):
                batch = self._to_device(batch)
                micro += 1
                sync = micro % accum == 0
                ctx = self._no_sync() if not sync else contextlib.nullcontext()
                with ctx, self._autocast():
                    out = self._forward(batch)
                    loss = out.loss if not isinstance(out, dict) else out["loss"]
                    (loss / accum).backward()
                if bad is None and not torch.isfinite(loss.detach()):
                    bad = float(loss.detach())
                _accumulate(running, "loss", loss.detach().float(), accum)
                terms = getattr(out, "terms", None) if not isinstance(out, dict) else out.get("terms")
                for k, v in (terms or {}).items():
                    _accumulate(running, k, torch.as_tensor(v).detach().float(), accum)
                if "attention_mask" in batch:
                    tokens += int(batch["attention_mask"].sum())
                examples += int(next(iter(v for v in batch.values() if torch.is_tensor(v))).shape[0])
                if not sync:
                    continue
                if dist_utils.any_rank(bad is not None, self.ctx):
                    self.optimizer.zero_grad(set_to_none=True)
                    bar.close()
                    what = f"{bad}" if bad is not None else "NaN/inf on another rank"
                    last = self.latest_checkpoint()
                    raise TrainingError(
                        f"loss became {what} at step {self.step + 1}; lower train.lr or use "
                        f"impl.dtype=float32 and --resume (last good checkpoint: {last or 'none yet'})")
                bad = None
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
                    rec = {k: v / max(1, c) for k, (v, c) in _reduce(running, self.ctx).items()}
                    for k in rec:  # a *_count term counts per global micro-batch, as in one process
                        if k.endswith("_count"):
                            rec[k] *= self.ctx.world_size
                    running.clear()
                    dt = time.perf_counter() - t0
                    rec.update(step=self.step, epoch=epoch, lr=self.scheduler.get_last_lr()[0],
                               elapsed_s=dt, cpu_s=time.process_time() - c0,
                               examples_per_s=examples * self.ctx.world_size / dt,
                               tokens_per_s=tokens * self.ctx.world_size / dt)
                    self._log(rec)
                    bar.set_postfix(loss=f"{rec['loss']:.4f}")
                if self.eval_fn is not None and (self.step % eval_every == 0 or
                                                 self.step == self.total_steps):
                    last_metrics = {**self.evaluate(), "eval_step": self.step}
                if self.step % save_every == 0 or self.step == self.total_steps:
                    self.save_checkpoint()
                if self.step >= self.total_steps:
                    break
        bar.close()
        model_step = self._finalize()
        return {"step": self.step, "best": self.best, "best_step": self.best_step, "model_step": model_step,
                **last_metrics}

    def _no_sync(self):
        if self.ddp_model is not self.model and hasattr(self.ddp_model, "no_sync"):
            return self.ddp_model.no_sync()
        if self._fsdp and hasattr(self.model, "set_requires_gradient_sync"):
            return _fsdp_no_sync(self.model)
        return contextlib.nullcontext()

    def _finalize(self) -> int:
        """Write the final model (the best one when evaluation picked one) at the top of out_dir. Returns the
        step whose weights were written."""
        model_sd, _ = self._full_state() if self._fsdp else (None, None)
        err: Optional[BaseException] = None
        src = None
        if self.cfg.load_best_at_end and self.best_step is not None and self.best_step != self.step:
            cand = self._ckpt_root() / f"step-{self.best_step}"
            if cand.is_dir():
                src = cand
            elif self.is_main:
                import sys
                sys.stderr.write(f"bertforge: warning: the best evaluation was at step {self.best_step}, which "
                                 f"has no checkpoint (train.save_every={self.cfg.save_every}); the final model "
                                 f"is step {self.step}'s. Save at every evaluation (train.save_every = "
                                 f"train.eval_every) to keep the best\n")
        if self.is_main:
            try:
                if src is not None:
                    for f in src.iterdir():
                        if f.suffix in (".json", ".safetensors", ".txt", ".model") and \
                                f.name not in ("trainer_state.json", "trainer_model.safetensors"):
                            tmp = self.out_dir / f".{f.name}.tmp"
                            shutil.copyfile(f, tmp)
                            os.replace(tmp, self.out_dir / f.name)
                elif model_sd is not None:
                    self.save_fn(_plain_copy(self._skeleton, model_sd), self.out_dir)
                else:
                    self.save_fn(self.model, self.out_dir)
                atomic_write_text(self.out_dir / "trainer_state.json",
                                  json.dumps({"step": self.step, "best": self.best,
                                              "best_step": self.best_step,
                                              "final_from": str(src.name) if src else "last"}))
            except OSError as e:
                err = _explain(e, self.out_dir)
            except BertforgeError as e:
                err = e
        if dist_utils.any_rank(err is not None, self.ctx):
            if err is not None:
                raise err
            raise TrainingError("rank 0 could not write the final model (see its message)")
        return self.best_step if src is not None else self.step


#: recipe values a resumed run may change (limits, logging, speed) without changing what it trains on
_RESUMABLE = ("train.max_steps", "train.epochs", "train.max_minutes", "train.eval_every", "train.save_every",
              "train.keep_checkpoints", "train.log_every", "train.load_best_at_end", "impl.")


#: recipe values a resumed run may not change: what the model is and what it learns from (the data's
#: size, batch and seed are checked against the checkpoint state; the model dirs by fingerprint)
_FIXED = ("model.", "data.task", "data.max_seq_len", "data.text_columns", "data.label_column", "data.labels",
          "data.header", "distill.", "pretrain.")
_FIXED_EXCEPT = ("distill.teachers", "distill.student", "pretrain.max_eval_sequences")


def _saved_recipe(out_dir) -> Optional[dict]:
    """The run's ``recipe.yaml`` as a dict; None when it is missing or unreadable."""
    try:
        import yaml
        old = yaml.safe_load((Path(out_dir) / "recipe.yaml").read_text(encoding="utf-8"))
    except Exception:
        return None
    return old if isinstance(old, dict) else None


def _recipe_changes(old: dict, new: dict, limit: int = 3, fixed: bool = False) -> str:
    """``"key old → new, …"`` for the (at most ``limit``) values that differ between a run's saved recipe
    ``old`` and this run's ``new`` (``fixed``: only the :data:`_FIXED` ones, else all but the
    :data:`_RESUMABLE` ones) among the keys both record; paths are compared resolved; "" when nothing that
    matters differs."""
    def same_path(v):  # "data/x.txt" and "/abs/data/x.txt" name one file: compare them resolved
        if isinstance(v, (list, tuple)):
            return [same_path(x) for x in v]
        return str(Path(v).resolve()) if isinstance(v, str) and v and Path(v).exists() else v

    def flat(d, prefix=""):
        out = {}
        for k, v in (d or {}).items():
            key = f"{prefix}{k}"
            if isinstance(v, dict):
                out.update(flat(v, key + "."))
            else:
                out[key] = same_path(v)
        return out
    a, b = flat(old), flat(new)
    keep = ((lambda k: k.startswith(_FIXED) and not k.startswith(_FIXED_EXCEPT)) if fixed
            else (lambda k: not k.startswith(_RESUMABLE)))
    # a key only one side records is a setting another bertforge version added or stopped recording
    # (pretrain.max_ngram, model.embedding_size of an E = H family): not a change the user made
    diffs = [f"{k} {a.get(k)!r} → {b.get(k)!r}" for k in sorted(set(a) & set(b))
             if a.get(k) != b.get(k) and keep(k)]
    return ", ".join(diffs[:limit]) + (f" (+{len(diffs) - limit} more)" if len(diffs) > limit else "")


#: the recipe section each training verb adds (a recipe without one is a fine-tuning run's)
_VERB_SECTIONS = {"pretrain": "pretrain", "distill": "distill", "translate": "translate train"}


def _run_verb(sections) -> str:
    return next((verb for sec, verb in _VERB_SECTIONS.items() if sec in sections), "finetune")


def _check_state(path: Path, state: dict, n_examples: int, cfg, global_micro: Optional[int] = None,
                 sources: Optional[dict] = None, out_dir=None, recipe=None) -> None:
    """CheckpointError unless checkpoint ``path`` (its ``state``) can be continued by this run. With
    ``recipe``, first against ``out_dir/recipe.yaml``: the same verb and the same :data:`_FIXED` values
    (another model, task or sequence length also changes the data size); then the same source model files,
    seed, data size (a mismatch names the recipe values that differ, the likely cause), batch and
    accumulation (and process layout)."""
    old = _saved_recipe(out_dir) if recipe is not None else None
    new = recipe.to_dict() if old is not None else None
    if old is not None:
        if _run_verb(old) != _run_verb(new):
            raise CheckpointError(f"--resume: {out_dir} is a `bertforge {_run_verb(old)}` run, not a `bertforge "
                                  f"{_run_verb(new)}` one; resume it with `bertforge {_run_verb(old)}`, or start "
                                  f"a new --out")
        changed = _recipe_changes(old, new, fixed=True)
        if changed:
            raise CheckpointError(f"--resume: {path} was written by a run with other options ({changed}); resume "
                                  f"with the options the run was started with, or start a new --out")
    for flag, now in (sources or {}).items():  # a model dir the run started from (teacher, tokenizer…)
        was = (state.get("sources") or {}).get(flag)
        if was and was.get("sha256") != now.get("sha256"):
            same = Path(was.get("path", "")) == Path(now.get("path", ""))
            raise CheckpointError(f"--resume: {path} was written by a run started from {flag} {was.get('path')}"
                                  f"{', whose files have changed since' if same else ''}; resume with the "
                                  f"{flag} the run started from, or start a new --out")
    # the seed first: it may also change the data (pretraining's held-out split and duplication draw from it)
    checks = [("seed", cfg.seed), ("n_examples", n_examples), ("batch_size", cfg.batch_size),
              ("grad_accum_steps", cfg.grad_accum_steps)]
    if global_micro is not None:
        checks.append(("global_micro_batch", global_micro))
    for key, now in checks:
        if key in state and state[key] != now:
            if key == "global_micro_batch":
                raise CheckpointError(f"--resume: {path} was written by {state.get('world_size')} processes "
                                      f"with pre-built batches; resume with the same number of processes")
            what = "training examples" if key == "n_examples" else key
            fix = "the same training data" if key == "n_examples" else f"train.{key}={state[key]}"
            cause = _recipe_changes(old, new) if (key == "n_examples" and old is not None) else ""
            raise CheckpointError(f"--resume: {path} was written with {state[key]} {what} but this run has "
                                  f"{now}" + (f" (the run was started with other options: {cause})" if cause
                                              else "") + f"; resume with {fix}, or start a new --out")


def check_batch_fits(batch_size: int, n_examples: int) -> None:
    """ConfigError when one (global micro-)batch is larger than the training set: every row would repeat
    examples. Verbs call it before loading a model; the Trainer checks again."""
    if batch_size > n_examples:
        raise ConfigError(f"train.batch_size {batch_size} exceeds the {n_examples} training examples; pass "
                          f"--batch-size {n_examples} or less, or more data")


def check_resume(out_dir, n_examples: int, train_cfg, sources: Optional[dict] = None, recipe=None) -> None:
    """Validate ``--resume`` before a verb builds its model: the latest checkpoint in ``out_dir`` must have
    been written for the same number of training examples, batch size, accumulation and seed (else the
    data position would point elsewhere) and, for each entry of ``sources`` (flag → :func:`bertforge.io.
    dir_fingerprint`), from a model dir with the same files (else, e.g., a frozen teacher or the tokenizer
    saved with the result would silently change), and ``recipe`` must keep the run's model, task, sequence
    length and distillation/pretraining options (:data:`_FIXED`).

    Raises:
        CheckpointError: a mismatch (the message names the setting to restore) or an unreadable state.
    """
    path = _latest_checkpoint(Path(out_dir) / "checkpoints")
    if path is not None:
        _check_state(path, _read_state(path), n_examples, train_cfg, sources=sources, out_dir=out_dir,
                     recipe=recipe)


def _latest_checkpoint(root: Path) -> Optional[Path]:
    ckpts = [p for p in root.glob("step-*") if (p / "trainer_state.json").is_file()]
    return max(ckpts, key=_step_of) if ckpts else None


def _read_state(path: Path) -> dict:
    try:
        return json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}/trainer_state.json is unreadable ({e}); resume from another "
                              f"checkpoint") from None


def _test_delay(step: int) -> None:
    """Test hook: ``BERTFORGE_TEST_CKPT_WRITE_DELAY=S`` sleeps S seconds inside every checkpoint write,
    ``=N:S`` only inside the write of step N (so a test can kill the process mid-write)."""
    spec = os.environ.get(CKPT_DELAY_ENV, "")
    if not spec:
        return
    at, _, sec = spec.rpartition(":")
    if not at or int(at) == step:
        time.sleep(float(sec))


def _step_of(p: Path) -> int:
    return int(p.name.split("-")[1])


def _torch_save(obj, path: Path) -> None:
    """``torch.save`` that reports a failed write as the OSError it is (torch wraps it in RuntimeError)."""
    try:
        torch.save(obj, path)
    except RuntimeError as e:
        import errno
        msg = str(e)
        free = shutil.disk_usage(path.parent).free
        code = errno.ENOSPC if free < 1 << 20 or "No space" in msg else errno.EIO
        raise OSError(code, os.strerror(code)) from None


@contextlib.contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _plain_copy(skeleton: nn.Module, full_state: dict) -> nn.Module:
    """A plain CPU module built from the meta-device ``skeleton`` (tied weights stay tied), carrying
    ``full_state`` (a gathered FSDP state dict) when given."""
    import copy
    plain = copy.deepcopy(skeleton).to_empty(device="cpu")
    if full_state:
        plain.load_state_dict(full_state, strict=True)
    return plain


def _target_counts(batch: dict, world: int) -> dict:
    """For token-level label tensors (B, T) of the global micro-batch: (targets ≠ -100) / world."""
    out = {}
    for k, v in batch.items():
        if k.endswith("labels") and torch.is_tensor(v) and v.dim() == 2 and not v.is_floating_point():
            out[k] = float((v != -100).sum()) / world
    return out


def _shard(batch: dict, rank: int, world: int, b: int) -> dict:
    """Rows ``rank, rank+world, …`` of every tensor whose first dimension is the batch size ``b``."""
    out = {}
    for k, v in batch.items():
        if torch.is_tensor(v) and v.dim() > 0 and v.shape[0] == b:
            out[k] = v[rank::world]
        else:
            out[k] = v
    return out


def _accumulate(d: dict, k: str, v: torch.Tensor, accum: int) -> None:
    s, c = d.get(k, (0.0, 0))
    d[k] = (s + float(v), c + 1)


def _reduce(d: dict, ctx) -> dict:
    """Sum (total, count) pairs over ranks (every rank must hold the same keys)."""
    if ctx.world_size == 1:
        return dict(d)
    keys = sorted(d)
    if not keys:
        return {}
    t = torch.tensor([[d[k][0], d[k][1]] for k in keys], dtype=torch.float64)
    dist_utils.all_reduce_sum(t, ctx)
    return {k: (t[i, 0].item(), t[i, 1].item()) for i, k in enumerate(keys)}


@contextlib.contextmanager
def _seeded(seed: int):
    """Run a block under fixed torch/python/numpy RNG seeds, restoring the outer state afterwards."""
    state = _rng_state_portable()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    try:
        yield
    finally:
        _set_rng_state_portable(state)


def _rng_state_portable() -> dict:
    """RNG states as tensors/ints/lists only, so ``torch.load(weights_only=True)`` reads them back."""
    py = random.getstate()
    npst = np.random.get_state()
    s = {"python": [py[0], list(py[1]), py[2]],
         "numpy": [npst[0], torch.from_numpy(npst[1].astype(np.int64)), int(npst[2]), int(npst[3]),
                   float(npst[4])],
         "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        s["cuda"] = list(torch.cuda.get_rng_state_all())
    return s


def _set_rng_state_portable(s: dict) -> None:
    random.setstate((s["python"][0], tuple(s["python"][1]), s["python"][2]))
    n = s["numpy"]
    np.random.set_state((n[0], n[1].numpy().astype(np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(s["torch"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])
