"""The Python API's options: one checked way from keyword arguments to a pipeline's options dataclass.

Every job callable from Python (``bertforge.finetune(model, task, train, out, **options)`` …) takes its options
as keyword arguments named after the fields of its options dataclass (``FinetuneOptions`` …), which are the
command line's flags with ``_`` for ``-``. :func:`options_from` turns them into the dataclass and refuses, in
one :class:`~bertforge.errors.ConfigError` line naming the Python option, an unknown name or a value of the
wrong type (``overwrite="no"``, ``lr="fast"``, ``max_steps=1.5``) — before anything is read or written.

The checks below the API word their errors for the command line (``--max-steps``); :func:`python_names`
rewrites such a message for a Python caller (``max_steps``, ``overwrite=True``), so the same check serves both.
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import typing
from dataclasses import fields

from ..errors import BertforgeError, ConfigError

_KINDS = {bool: "True or False", int: "a whole number", float: "a number", str: "a string or a path",
          list: "a list", dict: "a dict", tuple: "a tuple"}


def _accepts(kind, value):
    """``(True, converted value)`` when ``value`` is of ``kind`` (a plain type), else ``(False, None)``."""
    if kind is bool:
        return (True, bool(value)) if type(value).__name__ in ("bool", "bool_") else (False, None)
    if type(value).__name__ in ("bool", "bool_"):
        return False, None  # True is an int to Python, never a size or a rate here
    if kind is int:
        if isinstance(value, int) or type(value).__module__ == "numpy" and hasattr(value, "is_integer"):
            return True, int(value)
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return True, int(value)  # 1e4 steps
        return False, None
    if kind is float:
        return (True, float(value)) if isinstance(value, (int, float)) or (
            type(value).__module__ == "numpy" and hasattr(value, "dtype")) else (False, None)
    if kind is str:
        return (True, os.fspath(value)) if isinstance(value, (str, os.PathLike)) else (False, None)
    if kind is list:  # a list option also takes one item (a path) or a tuple, as the pipelines do
        return (True, value) if isinstance(value, (list, tuple, str, os.PathLike)) else (False, None)
    return (True, value) if isinstance(value, kind) else (False, None)


def check_option(fn: str, name: str, value, annotation):
    """``value`` converted to ``annotation`` (``Optional[int]``, ``bool``, ``str`` …), or ConfigError naming
    ``fn``'s option ``name``. Annotations other than plain types and their Optional/Union are not checked."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) is typing.Union else (annotation,)
    kinds = [a for a in args if a is not type(None)]
    if value is None:
        if type(None) in args:
            return None
        raise ConfigError(f"{fn}(): {name}=None; pass {_KINDS.get(kinds[0], kinds[0])}" if kinds else
                          f"{fn}(): {name}=None is not allowed")
    plain = [k for k in (typing.get_origin(k) or k for k in kinds) if isinstance(k, type)]
    if not plain or object in plain:
        return value
    for kind in plain:
        ok, converted = _accepts(kind, value)
        if ok:
            return converted
    want = " or ".join(_KINDS.get(k, k.__name__) for k in plain)
    raise ConfigError(f"{fn}(): {name}={value!r:.60} is a {type(value).__name__}; pass {want}")


def options_from(cls, fn: str, options: dict, **given):
    """``cls(**given, **options)`` with ``options`` checked: an unknown name or a value of the wrong type raises
    ConfigError (one line naming the option and what to pass). ``given``: fields the function fills itself
    from its positional arguments (already converted)."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise ConfigError(f"{fn}() got unknown option(s) {', '.join(unknown)}; see {cls.__name__} "
                          f"(bertforge.pipelines)")
    hints = typing.get_type_hints(cls)
    checked = {k: check_option(fn, k, v, hints[k]) for k, v in options.items()}
    return cls(**given, **checked)


_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")


def python_message(message: str, cls) -> str:
    """``message`` (worded for the command line) with each ``--flag`` that is a field of ``cls`` written as the
    Python option: ``--max-steps`` → ``max_steps``, a switch ``--overwrite`` → ``overwrite=True``."""
    hints = typing.get_type_hints(cls)

    def repl(m):
        name = m.group(1).replace("-", "_")
        if name not in hints:
            return m.group(0)
        return f"{name}=True" if hints[name] is bool else name
    return _FLAG.sub(repl, message)


@contextlib.contextmanager
def python_names(cls):
    """Within this block, a :class:`~bertforge.errors.BertforgeError` worded with command-line flags is re-raised
    with the Python option names of ``cls`` (:func:`python_message`); its type, ``reason`` and facts kept."""
    try:
        yield
    except BertforgeError as e:
        text = str(e)
        new = python_message(text, cls)
        if new == text:
            raise
        e.args = (new,) + tuple(e.args[1:])
        raise


__all__ = ["check_option", "options_from", "python_message", "python_names"]
