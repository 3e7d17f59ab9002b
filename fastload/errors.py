"""Exceptions raised by fastload."""


class LoadError(ValueError):
    """An observation could not be loaded: a corrupt or truncated input, or a user
    function that raised while loading it.

    ``index`` is the observation's index in the container being loaded (None when unknown)
    and ``source`` names the file or field when there is one. The original exception is
    chained as ``__cause__``, with its traceback.
    """

    def __init__(self, message, *, index=None, source=None):
        super().__init__(message)
        self.index = index
        self.source = source
