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


def read_text_file(path, label: str, hint: str = "") -> str:
    """A file the user named, as UTF-8 text, or one :class:`ConfigError` starting with
    ``label`` that says what is wrong (``hint``: added where there is no such file)."""
    from pathlib import Path

    file = Path(path).expanduser()
    try:
        return file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{label}: no such file {str(path)!r}"
                          + (f" ({hint})" if hint else "")) from None
    except IsADirectoryError:
        raise ConfigError(f"{label}: {path} is a directory, not a file") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{label}: {path} is not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise ConfigError(f"{label}: cannot read {path}: {err.strerror or err}") from None
