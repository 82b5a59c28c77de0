"""Sphinx configuration for npydask's documentation.

Sphinx with numpydoc (as numpy, dask, xarray and kvikio use) renders the numpydoc docstrings the
code already has; MyST-Parser reads the Markdown pages; pydata-sphinx-theme is the theme of numpy,
xarray and dask. Nothing is fetched while building: no intersphinx inventories, no remote assets.
Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

import npydask  # noqa: E402

project = "npydask"
author = "the npydask developers"
release = npydask.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "numpydoc",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
root_doc = "index"

myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]
suppress_warnings = ["myst.xref_missing"] if os.environ.get("NPYDASK_DOCS_LAX") else []

autodoc_typehints = "none"  # numpydoc's Parameters sections carry the types
autodoc_member_order = "bysource"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

html_theme = "pydata_sphinx_theme"
html_title = f"npydask {release}"
html_theme_options = {
    "navigation_depth": 2,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_show_sourcelink = False
