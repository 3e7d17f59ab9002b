"""Sphinx configuration of the documentation: the guides in this folder (Markdown, through
myst-parser) and an API reference from the docstrings (autodoc). `make docs` builds it,
warnings as errors, into build/docs/html."""

import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

project = "fastload"
extensions = ["sphinx.ext.autodoc", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Members in source order, with their base classes. The integrations' own dependencies
# are imported when present (make installs torch and jax in .venv) and stood in for when
# not.
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_mock_imports = [name for name in ("torch", "jax") if importlib.util.find_spec(name) is None]

# The guides link to their own sections by heading ("#decoding").
myst_heading_anchors = 3

html_theme = "alabaster"
html_title = "fastload"
html_show_sourcelink = False
