"""User-facing errors: the CLI prints their message and exits, without a traceback."""


class EdgespecError(Exception):
    """Base class for errors caused by user input or environment, not by a bug."""

    exit_code = 1


class ModelError(EdgespecError):
    """A model file is missing, unreadable, corrupt, or cannot be loaded."""


class DownloadError(EdgespecError):
    """No source of a catalog model could deliver a verified file."""


class IncompatibleDraftError(EdgespecError):
    """The draft model's vocabulary does not match the target's."""


class ContextOverflowError(EdgespecError):
    """The prompt does not fit in the context window."""


class ConfigError(EdgespecError):
    """An option value is out of range or unknown."""

    exit_code = 2


class LogitsError(EdgespecError, ValueError):
    """A model produced logits nothing can be sampled from (NaN, or every token at -inf)."""
