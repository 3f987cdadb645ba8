"""The documentation site is a test (issue 59): `make docs`' build (warnings are errors)
passes on the checkout, and fails on a public name without a docstring, a public module
no page documents, a broken internal link or heading anchor, and a quoted figure that no
benchmark file gives; docstring examples run as doctests, the guides' code blocks run."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from paths import ROOT

DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

from tfdist_api import house_style_to_rst  # noqa: E402


#: TensorFlow's own C++ log lines (importing tfdist imports it), not Sphinx's.
TF_NATIVE = ("WARNING: All log messages before absl::InitializeLog()", "I0000 ", "E0000 ", "W0000 ")


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
    sphinx_says = [line for line in run.stderr.splitlines()
                   if ("WARNING" in line or "ERROR" in line) and not line.startswith(TF_NATIVE)]
    assert not sphinx_says, run.stderr[-4000:]
    page = (tmp_path / "html" / "api" / "keras.html").read_text()
    assert "DistributedOptimizer" in page and "optimizer_from_config" in page
    assert "tfdist launch" in (tmp_path / "html" / "api" / "cli.html").read_text()


def test_a_missing_docstring_page_or_link_fails_the_build(tmp_path):
    """A copy of the site with a real public function's docstring deleted (by the conf,
    before the build), a public module's page removed, a link to no page and to no
    heading, and a figure no benchmark file gives: the build fails naming each."""
    copy = tmp_path / "docs"
    shutil.copytree(DOCS, copy, ignore=shutil.ignore_patterns("_build"))
    for entry in ROOT.iterdir():  # what the pages reach outside docs/ (../benchmarks/...)
        if entry.name not in ("docs", ".git", ".venv"):
            (tmp_path / entry.name).symlink_to(entry)
    (copy / "api" / "checkpoint.md").unlink()
    index = copy / "api" / "index.md"
    index.write_text(index.read_text().replace("checkpoint\n", "")
                     + "\nSee [nothing](no-such-page.md) and [this](tfdist.md#no-such-heading)."
                     "\nIt took {{ no_such_figure }}.\n")
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
                 "no-such-page.md", "no-such-heading", "no_such_figure"):
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


def test_the_docstring_examples_of_public_names_run(tmp_path):
    """Every `>>>` example in a public name's docstring (and its methods') runs as a
    doctest, with `tfdist`, `tf` and a temporary directory `tmp` at hand."""
    import doctest

    import tensorflow as tf

    from tfdist_api import PUBLIC, exported

    import tfdist

    seen, tests = set(), []
    finder = doctest.DocTestFinder(exclude_empty=True)
    for module_name in PUBLIC:
        for name, obj in exported(module_name):
            if id(obj) not in seen:
                seen.add(id(obj))
                tests += finder.find(obj, f"{module_name}.{name}", module=False,
                                     globs={"tfdist": tfdist, "tf": tf, "tmp": tmp_path})
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test)
    examples = sum(len(t.examples) for t in tests)
    assert runner.failures == 0, f"{runner.failures} of {examples} docstring examples failed"
    assert examples >= 10, [t.name for t in tests]  # the examples are there


#: What a Python block of a guide that cannot run here is preceded by (a MyST comment).
NOT_RUNNABLE = "% not runnable here:"


def python_blocks(page):
    """[(line, code, reason)] of a page's ```python blocks; `reason` is why it cannot run
    here (the `NOT_RUNNABLE` comment just above it), or None."""
    lines, blocks = page.read_text().splitlines(), []
    for i, line in enumerate(lines):
        if line.strip() != "```python":
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        above = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        reason = above[len(NOT_RUNNABLE):].strip() if above.startswith(NOT_RUNNABLE) else None
        blocks.append((i + 1, "\n".join(lines[i + 1:end]), reason))
    return blocks


GUIDES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts and p.parent.name != "api")


def test_every_python_block_of_the_guides_runs_or_says_why_not():
    """A block marked not runnable gives a reason of a few words; at least the logs guide
    has blocks that run."""
    runnable = 0
    for page in GUIDES:
        for line, _, reason in python_blocks(page):
            assert reason is None or len(reason.split()) >= 3, f"{page}:{line}: {reason!r}"
            runnable += reason is None
    assert runnable >= 1


@pytest.mark.parametrize("page", [p for p in GUIDES if any(r is None for *_, r in python_blocks(p))],
                         ids=lambda p: str(p.relative_to(DOCS)))
def test_the_python_blocks_of_a_guide_run(tmp_path, page):
    """A page's runnable blocks, in order, as one script (a block may use the ones above
    it), in a directory of its own: it exits 0."""
    script = "\n\n".join(code for _, code, reason in python_blocks(page) if reason is None)
    (tmp_path / "guide.py").write_text(script)
    run = subprocess.run([sys.executable, "guide.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert run.returncode == 0, f"{page}:\n{run.stderr[-3000:]}"


def readme_blocks():
    """The README's ```python blocks: its `fit` example and its own-loop example."""
    blocks = [code for _, code, _ in python_blocks(ROOT / "README.md")]
    assert len(blocks) == 2, "the README shows one fit example and one own loop"
    return blocks


def test_the_readme_shows_code_early_and_stays_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, len(lines)
    assert lines.index("```python") < 60


#: Appended to the README's examples: what each replica and worker ended with.
REPORT = '''
import json as _json
_weights = [[float(tf.reduce_sum(t)) for t in strategy.experimental_local_results(v.value)]
            for v in model.weights]
print("REPORT " + _json.dumps({"weights": _weights, "history": HISTORY}))
'''


def report_of(stdout, prefix=""):
    """The REPORT line(s) of a run: [{"weights": [[per replica] per variable], ...}]."""
    return [json.loads(line.split("REPORT ", 1)[1]) for line in stdout.splitlines()
            if line.startswith(prefix + "REPORT ")]


@pytest.mark.multiprocess
def test_the_readme_fit_example_trains_one_model_on_two_launched_workers(tmp_path):
    """`tfdist launch -n 2 -- python train.py` on the README's fit example, as written
    (the report appended): the loss falls, both workers end with the same weights."""
    fit = readme_blocks()[0].replace("model.fit(", "HISTORY = model.fit(", 1)
    (tmp_path / "train.py").write_text(
        "import tensorflow as tf\n" + fit.replace(
            "callbacks=[", "verbose=2, callbacks=[", 1)
        + "\nHISTORY = HISTORY.history['loss']\n" + REPORT)
    run = subprocess.run([sys.executable, "-m", "tfdist", "launch", "-n", "2", "--", sys.executable,
                          "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    reports = [report_of(run.stdout, f"[worker:{i}] ") for i in range(2)]
    assert all(len(r) == 1 for r in reports), run.stdout[-3000:]
    (first,), (second,) = reports
    assert first["weights"] == second["weights"], "the workers ended with different weights"
    losses = first["history"]
    assert len(losses) == 3 and losses[-1] < 0.95 * losses[0], losses


def test_the_readme_own_loop_example_learns_with_one_model_on_both_replicas(tmp_path):
    """The README's own loop, as written, on 2 logical CPUs: every variable equal on both
    replicas after `before_read`, and the model better than chance on its data."""
    loop = readme_blocks()[1] + (
        "\nHISTORY = float(keras.metrics.BinaryAccuracy()(tf.cast(features[:, 0] > 0, tf.float32),"
        " tf.nn.softmax(model(features))[:, 1]))\n")
    (tmp_path / "loop.py").write_text(loop + REPORT)
    run = subprocess.run([sys.executable, "loop.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (report,) = report_of(run.stdout)
    assert all(len(v) == 2 and v[0] == v[1] for v in report["weights"]), report["weights"]
    assert report["history"] > 0.8, report["history"]  # chance: 0.5


def test_every_results_file_and_script_a_page_cites_exists():
    """A figure a page quotes names where it comes from (`benchmarks/results/X.md`, the
    `benchmarks/X.py` that writes it); each named file is there, so no source dangles."""
    pages = [ROOT / "README.md", *(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)]
    cited = {(page.name, path) for page in pages for path in re.findall(
        r"\b(benchmarks/(?:results/)?[\w./-]+\.(?:md|json|csv|py|png))", page.read_text())}
    assert len(cited) >= 20, cited
    missing = sorted((page, path) for page, path in cited if not (ROOT / path).exists())
    assert not missing, missing
