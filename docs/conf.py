"""Sphinx configuration for te's documentation (nox -s docs; warnings are errors)."""

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
# te_core.recipe is pure Python and imports no compiled code, so autodoc reads it from source.
sys.path.insert(0, os.path.join(ROOT, "packages", "te-core", "src"))

project = "te"
author = "te developers"
copyright = "2026, te developers (Apache-2.0)"
release = "0.1.0"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
html_theme = "alabaster"
exclude_patterns = ["_build"]
nitpicky = False
napoleon_use_ivar = True
