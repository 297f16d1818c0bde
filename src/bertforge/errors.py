"""User-facing errors.

Every mistake a user can make (a wrong path, a malformed file, an incompatible recipe key…) raises a
subclass of :class:`BertforgeError` whose message says what to change. The CLI prints the message on
one line and exits with status 2; library users catch ``BertforgeError``.
"""


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
