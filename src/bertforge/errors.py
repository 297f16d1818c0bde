"""User-facing errors.

Every mistake a user can make (a wrong path, a malformed file, an incompatible recipe key…) raises a
subclass of :class:`BertforgeError` whose message says what to change. The CLI prints the message on
one line and exits with status 2; library users catch ``BertforgeError``.

An error raised below the CLI (the training engine, the core) states facts and advice in the library's
own terms (recipe keys, paths); where the CLI words the advice with its flags instead, the error carries a
machine-readable ``reason`` and the ``facts`` the CLI needs (see ``bertforge.pipelines.resume_policy``).
"""
from __future__ import annotations

import math


class BertforgeError(Exception):
    """Base class of every user-facing error (CLI exit code 2).

    Args:
        message: what is wrong and what to change.
        reason: optional machine-readable code of the situation (e.g. ``"non_finite_loss"``), for callers
            that word their own advice; None for errors whose message is final.
        **facts: the values the message states (paths, steps, sizes), kept in the dict ``facts``.
    """

    def __init__(self, message: str = "", *, reason: str | None = None, **facts):
        super().__init__(message)
        self.reason = reason
        self.facts = facts


class ConfigError(BertforgeError):
    """A recipe key, override or option value is invalid."""


class DataError(BertforgeError):
    """An input data file is missing, empty, unreadable or malformed."""


class CheckpointError(BertforgeError):
    """A checkpoint directory is missing, incomplete or of an unknown family."""


class TrainingError(BertforgeError):
    """Training cannot continue (e.g. the loss became NaN/inf)."""


def require_at_least(flag: str, value, minimum, note: str = "") -> None:
    """Raise :class:`ConfigError` ``"{flag} {value} must be ≥ {minimum} ({note})"`` when ``value`` is below
    ``minimum``; ``None`` (option not given) passes."""
    if value is not None and value < minimum:
        raise ConfigError(f"{flag} {value} must be ≥ {minimum}" + (f" ({note})" if note else ""))


def require_number(name: str, value, low=-math.inf, high=math.inf, *, open_low: bool = False,
                   open_high: bool = False, whole: bool = False, note: str = "") -> None:
    """Raise :class:`ConfigError` ``"{name}={value!r} must be a number in [low, high]"`` (``… ≥ low`` when
    unbounded above; ``a whole number`` with ``whole``) unless ``value`` is an int (``whole``) or a real
    number within the bounds. Text, bools, nan and ±inf fail; ``open_low``/``open_high`` exclude a bound."""
    kinds = int if whole else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool)
    ok = ok and (low < value if open_low else low <= value) and (
        value < high if open_high or high == math.inf else value <= high)
    if not ok:
        bound = (f"{'>' if open_low else '≥'} {low}" if high == math.inf else
                 f"in {'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}")
        raise ConfigError(f"{name}={value!r} must be {'a whole number' if whole else 'a number'} {bound}"
                          + (f" ({note})" if note else ""))
