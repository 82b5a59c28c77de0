"""Sphinx configuration for npydask's documentation.

Sphinx with numpydoc (as numpy, dask, xarray and kvikio use) renders the numpydoc docstrings the
code already has; MyST-Parser reads the Markdown pages; pydata-sphinx-theme is the theme of numpy,
xarray and dask. Nothing is fetched while building: no intersphinx inventories, no remote assets.
Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html``.
"""

from __future__ import annotations

import os
import sys

from sphinx.util import logging

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
    # The top bar names the four sections (short titles: one row); the left sidebar lists the pages
    # of the section the reader is in, then this page's headings ("On this page"). A third column
    # would leave the examples too narrow to show their lines whole (docs/_static/npydask.css).
    "navigation_depth": 2,
    "show_toc_level": 2,
    "header_links_before_dropdown": 4,
    "secondary_sidebar_items": [],
    # A page without a section (the home page, Getting started) shows no empty sidebar.
    "sidebar_includehidden": False,
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_sidebars = {"**": ["sidebar-nav-bs", "page-toc"]}
html_static_path = ["_static"]
html_css_files = ["npydask.css"]
html_show_sourcelink = False


_logger = logging.getLogger("npydask.docs")


def _page_links_resolve(app, env, node, contnode):
    """A role in a page (``{func}`npydask.from_npy```) that names nothing in the API reference is a warning.

    Sphinx says nothing of an unresolved Python reference unless ``nitpicky`` is on, and nitpicky would
    also report every docstring's mention of an internal name. Pages' roles are the links from the guide
    to the API reference: with ``-W`` (as ``tests/test_docs.py`` builds) a broken one fails the build.
    """
    source = node.source or ""
    if node.get("refdomain") == "py" and source.endswith(".md"):
        _logger.warning(
            "%s: no API reference entry for %r (list it in docs/api.md)",
            node.get("reftype"),
            node.get("reftarget"),
            location=node,
        )


def setup(app):
    app.connect("missing-reference", _page_links_resolve)
