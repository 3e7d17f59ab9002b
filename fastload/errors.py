"""Exceptions raised by fastload."""

from __future__ import annotations


class LoadError(ValueError):
    """An observation could not be loaded: a corrupt or truncated input, or a user
    function that raised while loading it.

    ``index`` is the observation's index in the container being loaded (None when unknown)
    and ``source`` names the file or field when there is one. The original exception is
    chained as ``__cause__``, with its traceback.
    """

    def __init__(
        self, message: str, *, index: int | None = None, source: str | None = None
    ) -> None:
        super().__init__(message)
        self.index = index
        self.source = source


def load_error(index: int | None, error: BaseException, source: str | None = None) -> LoadError:
    """``error`` (raised while loading observation ``index``) as a ``LoadError`` to raise
    ``from error``; a ``LoadError`` already names its observation and is kept as it is."""
    if isinstance(error, LoadError):
        return error
    where = f" ({source})" if source else ""
    return LoadError(
        f"could not load observation {index}{where}: {type(error).__name__}: {error}",
        index=index,
        source=source,
    )
