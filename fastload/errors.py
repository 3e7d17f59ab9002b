"""Exceptions raised by fastload."""

from __future__ import annotations

from enum import IntEnum


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


class MisfitError(ValueError):
    """An observation that does not fit the buffer given for it: ``what`` says how, as
    "shape", "dtype" (a cast would lose information) or "members" (another structure)."""

    def __init__(self, what: str, message: str) -> None:
        super().__init__(message)
        self.what = what

    def __reduce__(self) -> tuple[type[MisfitError], tuple[str, str]]:
        return type(self), (self.what, str(self))


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


class Status(IntEnum):
    """The codes of the C core's failures (``csrc/status.h``, whose values they mirror)."""

    OK = 0
    EINVAL = -1  # bad argument: null pointer, size, channel count, range
    ESCRATCH = -2  # scratch smaller than needed (a fastload bug)
    ETOOSMALL = -3  # RandomCrop: the (padded) image is smaller than the crop
    ESHAPE = -4  # not the size the caller or the destination expects
    ENOMEM = -5  # out of memory
    EFORMAT = -6  # not in the expected format: bad magic or header
    ELIMIT = -7  # over a size limit (pixels, bytes)
    ETRUNCATED = -8  # the data ends too early
    ECORRUPT = -9  # the data is damaged
    ECAPACITY = -10  # an output buffer is too small
    EUNSUPPORTED = -11  # not decoded here: the caller decodes another way
    EFAILED = -12  # failed: the message says why (I/O, a Python exception)
    EINTERRUPT = -13  # interrupted (Ctrl-C)
    ETIMEOUT = -14  # nothing ready within the time given
    ECANCELLED = -15  # the run was cancelled
    EFORKED = -16  # the object was made before this process forked
    ETHREADS = -17  # no thread could start
    DONE = -18  # not an error: nothing more


class CoreError(ValueError):
    """A call of the C core that failed on its input: ``code`` (a ``Status``) says how,
    the message says with what. Callers that treat one failure apart test the code, never
    the message's text."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        try:
            self.code = Status(code)
        except ValueError:  # a code status.h does not list: the message is all there is
            self.code = Status.EFAILED

    def __reduce__(self) -> tuple[type[CoreError], tuple[int, str]]:
        return type(self), (int(self.code), str(self))
