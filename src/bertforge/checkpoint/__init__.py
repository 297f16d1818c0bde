"""Checkpoint dirs: Hugging Face ``transformers`` checkpoint directories in and out (core layer).

A bertforge checkpoint *is* a ``transformers`` checkpoint dir: ``config.json`` (with ``model_type`` and
``architectures``), ``model.safetensors``, ``tokenizer.json`` + ``tokenizer_config.json``.

* :mod:`~bertforge.checkpoint.write` — the format: per-family weight-name maps, ``config.json`` both ways,
  and :func:`save_pretrained`. It sits *below* :class:`~bertforge.task_model.TaskModel`, which calls it.
* :mod:`~bertforge.checkpoint.read` — weight files, shards, hub names, :func:`resolve_model_dir` and
  :func:`load_pretrained`. It sits *above* ``TaskModel``, since loading builds a model with the head a dir
  was saved with.

The public names of both are offered here (``from bertforge.checkpoint import load_pretrained``), imported
on first use (PEP 562): importing ``read`` here would make ``task_model → checkpoint.write → checkpoint →
read → task_model`` a cycle. Inside bertforge, import from ``read`` / ``write`` themselves.
"""
_READ = ("load_pretrained", "read_config", "read_state_dict", "weight_files", "shard_index", "read_weight_file",
         "deployed_format", "token_positions", "check_seq_len", "saved_head_name", "require_saved_head",
         "resolve_model_dir", "split_prefix", "EMBEDDED")
_WRITE = ("save_pretrained", "hf_state_dict", "config_from_hf", "config_to_hf", "encoder_key_map",
          "albert_num_groups", "FAMILY_CLASS", "PREFIX")

__all__ = list(_READ + _WRITE)


def __getattr__(name: str):
    if name in _READ or name in _WRITE:
        import importlib
        value = getattr(importlib.import_module(".read" if name in _READ else ".write", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bertforge.checkpoint' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
