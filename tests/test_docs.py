"""The documentation site is a test (issue 59): `make docs`' build (warnings are errors)
passes on the checkout, and fails on a public name without a docstring, a public module
no page documents, and a broken internal link or heading anchor."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

from tfdist_api import house_style_to_rst  # noqa: E402


def build(source, out, conf_dir=None):
    """`make docs`' sphinx-build (-E -W --keep-going) of `source` into `out`."""
    conf = ["-c", str(conf_dir)] if conf_dir else []
    return subprocess.run([sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-q",
                           "-b", "html", *conf, str(source), str(out)],
                          capture_output=True, text=True, timeout=900)


def test_the_makefile_builds_the_site_as_this_test_does():
    makefile = (ROOT / "Makefile").read_text()
    assert "-m sphinx -E -W --keep-going -q -b html docs docs/_build/html" in makefile


def test_the_site_builds_without_a_warning(tmp_path):
    run = build(DOCS, tmp_path / "html")
    assert run.returncode == 0, run.stderr[-4000:]
    assert "WARNING" not in run.stderr and "ERROR" not in run.stderr, run.stderr[-4000:]
    page = (tmp_path / "html" / "api" / "keras.html").read_text()
    assert "DistributedOptimizer" in page and "optimizer_from_config" in page
    assert "tfdist launch" in (tmp_path / "html" / "api" / "cli.html").read_text()


def test_a_missing_docstring_page_or_link_fails_the_build(tmp_path):
    """A copy of the site with a real public function's docstring deleted (by the conf,
    before the build), a public module's page removed, and a link to no page and to no
    heading: the build fails naming each."""
    copy = tmp_path / "docs"
    shutil.copytree(DOCS, copy, ignore=shutil.ignore_patterns("_build"))
    (copy / "api" / "checkpoint.md").unlink()
    index = copy / "api" / "index.md"
    index.write_text(index.read_text().replace("checkpoint\n", "")
                     + "\nSee [nothing](no-such-page.md) and [this](tfdist.md#no-such-heading).\n")
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "conf.py").write_text(
        "import runpy\n"
        f"globals().update(runpy.run_path({str(copy / 'conf.py')!r}))\n"
        "import tfdist.keras\n"
        "tfdist.keras.optimizer_from_config.__doc__ = None\n")
    run = build(copy, tmp_path / "html", conf_dir=conf)
    assert run.returncode != 0
    for says in ("tfdist.keras.optimizer_from_config is public and has no docstring",
                 "tfdist.checkpoint is public and no page documents it",
                 "no-such-page.md", "no-such-heading"):
        assert says in run.stderr, (says, run.stderr[-4000:])


@pytest.mark.parametrize("given, rst", [
    (["Makes one:", "", "    x = f()", "", "Then more."],
     ["Makes one::", "", "    x = f()", "", "Then more."]),
    (["Makes one", "", "    x = f(a | b)", ""],
     ["Makes one", "", "::", "", "    x = f(a | b)", ""]),
    (["Args:", "    x: the `TrainingHook`s to run,", "        max |x| of them."],
     ["Args:", "    x: the `TrainingHook`\\ s to run,", "        max \\|x\\| of them."]),
    (["Already::", "", "    code"], ["Already::", "", "    code"]),
])
def test_house_style_docstrings_become_rst(given, rst):
    """Code indented under a paragraph becomes a literal block (not inside Napoleon's
    sections), a glued suffix and a bar are escaped outside code."""
    lines = list(given)
    house_style_to_rst(None, "function", "f", None, {}, lines)
    assert lines == rst
