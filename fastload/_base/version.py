"""The version of fastload (``fastload.__version__``), written in this one place: the
build (pyproject.toml) and the Makefile read it from here."""

__version__ = "0.3.0"
