"""``distill(method="static")``: a teacher's vocabulary → a static embedding dir (one table + mean pooling;
:mod:`bertforge.distillation.static`, the model2vec recipe: Tulkens & van Dongen 2024; SIF weights, Arora et al.
2017 §4.1; common-component removal, Mu & Viswanath 2018). No training: no student, data or recipe.

Loads without torch; :func:`run_static` imports what it needs.
"""
from __future__ import annotations

import os

from ..checkpoint.modeldir import resolve
from ..errors import ConfigError
from .rundir import RunDir


def check_static_options(opts) -> None:
    """ConfigError for a static option without ``method="static"`` (``--dim``, ``--sif-coefficient``,
    ``--remove-top``): they would be ignored by the training methods."""
    for flag, value in (("--dim", opts.dim), ("--sif-coefficient", opts.sif_coefficient),
                        ("--remove-top", opts.remove_top)):
        if value is not None:
            raise ConfigError(f"{flag} is an option of --method static; drop it or add --method static")


def _check_static_only(opts) -> None:
    """One teacher, and no option of the training methods (student, data, recipe, resume, loss tuning)."""
    if not opts.teacher or len(opts.teacher) != 1:
        raise ConfigError("--method static distils one teacher; pass --teacher DIR once")
    training = {"--student": opts.student, "--stage": opts.stage, "--task": opts.task, "--train": opts.train,
                "--eval": opts.eval, "--corpus": opts.corpus, "--augment": opts.augment, "--recipe": opts.recipe,
                "--resume": opts.resume, "--layer-map": opts.layer_map, "--temperature": opts.temperature}
    used = [f for f, v in training.items() if v]
    if used or opts.overrides:
        raise ConfigError(f"{(used or ['KEY=VALUE overrides'])[0]} is an option of the training methods; "
                          f"--method static takes --teacher, --dim, --sif-coefficient, --remove-top, --batch-size "
                          f"and --out")


def run_static(opts) -> tuple:
    """The static embedding table of ``opts.teacher[0]`` into ``opts.out`` (a :class:`RunDir`). Every check
    — one teacher with a tokenizer, ``dim`` within its width, no option of the training methods — runs
    before anything is written.

    Returns:
        (the out dir, the record: ``method``, ``teacher``, ``table`` shape ``[V, dim]``, ``teacher_params``
        and what :func:`bertforge.distillation.static.distill_static` reports).
    """
    _check_static_only(opts)
    teacher_dir = resolve(opts.teacher[0])
    if not teacher_dir.is_dir():
        raise ConfigError(f"--teacher {opts.teacher[0]} is not a checkpoint directory; pass the dir of a "
                          f"sentence encoder (config.json, weights, tokenizer) or 'minilm'")
    from ..distillation.static import REMOVE_TOP, check_teacher_tokenizer, distill_static
    from ..checkpoint.read import load_pretrained
    from ..models.static import save_static, static_config
    from ..checkpoint.modeldir import ModelDir
    from ..tokenizer import pad_id
    check_teacher_tokenizer(teacher_dir)
    dim = 256 if opts.dim is None else opts.dim
    a = 1e-4 if opts.sif_coefficient is None else opts.sif_coefficient
    if not 0 < a < 1:
        raise ConfigError(f"--sif-coefficient {a}: pass a value in (0, 1) (model2vec: 1e-4)")
    remove_top = REMOVE_TOP if opts.remove_top is None else opts.remove_top
    if remove_top < 0:
        raise ConfigError(f"--remove-top {remove_top}: pass a number of components ≥ 0 (0: none removed)")
    teacher = load_pretrained(teacher_dir, notes=False)
    if not 1 <= dim <= teacher.config.hidden_size:
        raise ConfigError(f"--dim {dim} is not in 1 … {teacher.config.hidden_size} (the teacher's "
                          f"{teacher.config.hidden_size} dimensions); pass a dimension in that range")
    tok = ModelDir.open(teacher_dir).tokenizer()
    run_dir = RunDir(opts.out, inputs=(teacher_dir,), overwrite=opts.overwrite)
    if opts.seed is not None:
        import torch
        torch.manual_seed(opts.seed)
    with run_dir as work:
        table, rec = distill_static(teacher, tok, dim, a, batch_size=opts.batch_size or 1024,
                                    progress=not (opts.no_progress or os.environ.get("BERTFORGE_NO_PROGRESS")),
                                    remove_top=remove_top)
        rec["teacher"] = str(teacher_dir)
        save_static(work, table, teacher_dir, static_config(table.shape[0], dim, pad_id(tok), rec))
    return run_dir.out, {"method": "static", "teacher": str(teacher_dir), "table": list(table.shape),
                         "teacher_params": sum(p.numel() for p in teacher.parameters()),
                         **{k: v for k, v in rec.items() if k not in ("method", "teacher")}}


__all__ = ["check_static_options", "run_static"]
