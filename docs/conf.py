"""Sphinx configuration of tfdist's documentation site (`make docs`).

Markdown pages through MyST; the API reference is generated from the docstrings of every
public name (`_ext/tfdist_api.py`, which also fails the build on a public name without a
docstring); warnings are errors (`make docs` runs sphinx-build -W)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the checkout's tfdist, as `pip install -e`
sys.path.insert(0, os.path.join(HERE, "_ext"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

project = "tfdist"
author = "the tfdist authors"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon",
              "sphinx.ext.doctest", "tfdist_api"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "substitution"]

import benchmark_figures  # noqa: E402  (docs/_ext)

myst_substitutions = dict(benchmark_figures.figures())  # {{ name }}: benchmarks/results
myst_heading_anchors = 3  # [text](page.md#a-heading) is checked
suppress_warnings = ["ref.python"]  # `keras` in a docstring may name more than one module
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the docstrings say the types, in words
autodoc_inherit_docstrings = False  # TensorFlow's and Keras' docstrings are theirs to render
napoleon_google_docstring, napoleon_numpy_docstring = True, False
html_theme = "alabaster"
html_title = "tfdist"
default_role = "py:obj"  # `name`: a link where tfdist documents it, else code
