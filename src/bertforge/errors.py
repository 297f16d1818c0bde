"""User-facing errors.

Every mistake a user can make (a wrong path, a malformed file, an incompatible recipe key…) raises a
subclass of :class:`BertforgeError` whose message says what to change. The CLI prints the message on
one line and exits with status 2; library users catch ``BertforgeError``.
"""
import math


class BertforgeError(Exception):
    """Base class of every user-facing error (CLI exit code 2)."""


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
