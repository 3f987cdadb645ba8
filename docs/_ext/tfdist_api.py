"""The generated parts of tfdist's documentation, and the checks that fail its build.

Directives (in MyST: ```{tfdist-api} tfdist.keras```):

- ``tfdist-api MODULE``: every name of MODULE's ``__all__`` whose home is MODULE (the first
  of `PUBLIC` that exports it), through autodoc; a name exported again later is listed
  with a link to its home. A public name without a docstring of its own is a warning
  (an error under ``sphinx-build -W``), as is a module of `PUBLIC` no page documents.
- ``tfdist-cli``: ``tfdist --help`` and each command's, from the parser itself.
- ``tfdist-config``: the config file's sections and keys, with defaults, from the schema.
"""

import contextlib
import dataclasses
import importlib
import inspect
import io
import os
import re

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

logger = logging.getLogger(__name__)

#: The public modules, in the order a name's home is chosen (conf: ``tfdist_api_public``).
PUBLIC = ("tfdist", "tfdist.keras", "tfdist.callbacks", "tfdist.compression",
          "tfdist.local_sgd", "tfdist.training", "tfdist.strategies", "tfdist.core",
          "tfdist.checkpoint", "tfdist.horovod.tensorflow.keras")


def exported(module_name):
    """[(name, object)] of a module's ``__all__`` that are classes or functions."""
    module = importlib.import_module(module_name)
    pairs = [(name, getattr(module, name)) for name in module.__all__]
    return [(name, obj) for name, obj in pairs if inspect.isclass(obj) or callable(obj)]


def homes(public):
    """{id(object): the first module of `public` exporting it}."""
    found = {}
    for module_name in public:
        for _, obj in exported(module_name):
            found.setdefault(id(obj), module_name)
    return found


def own_docstring(obj):
    """The docstring written for `obj` itself (a class's, not one inherited)."""
    doc = vars(obj).get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    return doc if isinstance(doc, str) and doc.strip() else None


class PublicApi(SphinxDirective):
    """``tfdist-api MODULE``: the module's public names (see the module docstring)."""

    required_arguments = 1

    def run(self):
        module_name, public = self.arguments[0], self.config.tfdist_api_public
        if module_name not in public:
            raise self.error(f"{module_name} is not among the conf's tfdist_api_public")
        self.env.tfdist_api_documented = getattr(self.env, "tfdist_api_documented", set())
        self.env.tfdist_api_documented.add(module_name)
        home = homes(public)
        lines = [f".. py:module:: {module_name}", ""]
        elsewhere = []
        for name, obj in exported(module_name):
            if home[id(obj)] != module_name:
                elsewhere.append(f":py:obj:`{module_name}.{name} <{home[id(obj)]}.{name}>`")
                continue
            if own_docstring(obj) is None:
                logger.warning(f"{module_name}.{name} is public and has no docstring",
                               location=self.get_location())
            kind = "autoclass" if inspect.isclass(obj) else "autofunction"
            lines += [f".. {kind}:: {module_name}.{name}",
                      *(["   :members:"] if kind == "autoclass" else []), ""]
        if elsewhere:
            lines += ["Also exported here: " + ", ".join(elsewhere) + ".", ""]
        return self.parse_rst(lines)

    def parse_rst(self, lines):
        """`lines` of reStructuredText parsed in place (in a MyST page: as ``eval-rst``)."""
        if "myst" in type(self.state).__module__.lower() or "myst" in type(
                self.state_machine).__module__.lower():
            lines = ["```{eval-rst}", *lines, "```"]
        holder = nodes.section()
        nested_parse_with_titles(self.state, StringList(lines, source=self.get_source_info()[0]),
                                 holder)
        return holder.children


class CommandLine(PublicApi):
    """``tfdist-cli``: the help of ``tfdist`` and of each of its commands."""

    required_arguments = 0

    def run(self):
        from tfdist import cli

        parser = cli._parser()
        commands = next(a for a in parser._actions if a.dest == "command_name").choices
        lines = []
        for title, each in [("tfdist", parser), *((f"tfdist {n}", p) for n, p in commands.items())]:
            lines += [f".. rubric:: {title}", "", "::", "",
                      *("   " + line for line in help_text(each).splitlines()), ""]
        return self.parse_rst(lines)


def help_text(parser):
    """A parser's --help at a fixed width (the page does not depend on the terminal)."""
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "88"
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            parser.print_help()
        return out.getvalue()
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


class ConfigKeys(PublicApi):
    """``tfdist-config``: each section's keys and defaults, from `tfdist.config.schema`."""

    required_arguments = 0

    def run(self):
        from tfdist.config import schema
        from tfdist.config.load import SLURM_KEYS, STRATEGY_OPTIONS

        lines = []
        sections = [("cluster", schema.ClusterConfig, "job types: a count (local ports) or "
                     "a list of host:port; under ``scheduler: slurm`` also "
                     + ", ".join(f"``{k}``" for k in SLURM_KEYS)),
                    ("compression", schema.CompressionConfig, "a name, or a mapping"),
                    ("local_sgd", schema.LocalSGDConfig, "a mapping"),
                    ("elastic", schema.ElasticConfig, "a mapping")]
        for section, shape, given in sections:
            lines += [f".. rubric:: {section}:", "", f"{given}. {own_docstring(shape)}", "",
                      ".. list-table::", "   :header-rows: 1", "", "   * - key", "     - default"]
            for field in dataclasses.fields(shape):
                lines += [f"   * - ``{field.name}``", f"     - ``{default_of(field)}``"]
            lines.append("")
        lines += [".. rubric:: strategy:", "", "A name, or ``{name: ..., options}``; "
                  "each strategy's options:", "", ".. list-table::", "   :header-rows: 1", "",
                  "   * - strategy", "     - options"]
        for name, options in STRATEGY_OPTIONS.items():
            lines += [f"   * - ``{name}``",
                      "     - " + (", ".join(f"``{o}``" for o in options) or "(none)")]
        return self.parse_rst(lines + [""])


def default_of(field):
    if field.default is not dataclasses.MISSING:
        return repr(field.default)
    if field.default_factory is not dataclasses.MISSING:
        return repr(dict(field.default_factory()))
    return "(required)"


#: Napoleon's section headers: what is indented under one is the section, not code.
SECTION = re.compile(r"^\s*(Args|Arguments|Attributes|Example|Examples|Keyword Args|Note|Notes|"
                     r"Other Parameters|Parameters|Raises|References|Returns|Warning|Warnings|"
                     r"Yields|See Also):\s*$")


#: A quoted name with a suffix glued on ("`TrainingHook`s"), which rst cannot end.
GLUED = re.compile(r"(`[^`]+`)(\w)")


def house_style_to_rst(app, what, name, obj, options, lines):
    """tfdist's docstrings as reStructuredText, in place: a block indented under a
    paragraph is code (a literal block), and ``|`` is text (not a substitution).
    Single backquotes are `default_role` (a reference where one resolves, else code)."""
    out, in_code, section, last_text = [], None, None, None
    for line in lines:
        indent = len(line) - len(line.lstrip())
        blank = not line.strip()
        if in_code is not None and (blank or indent > in_code):
            out.append(line)
            continue
        in_code = None
        if not blank and section is not None and indent <= section:
            section = None
        if SECTION.match(line):
            section = indent
        elif (not blank and section is None and last_text is not None and out
              and not out[-1].strip() and indent > last_text[1]):
            start = last_text[0]
            if out[start].rstrip().endswith("::"):
                pass
            elif out[start].rstrip().endswith(":"):
                out[start] = out[start].rstrip() + ":"
            else:
                out.append(" " * last_text[1] + "::")
                out.append("")
            in_code = last_text[1]
            out.append(line)
            continue
        if not blank:
            last_text = (len(out), indent)
            line = GLUED.sub(r"\1\\ \2", line.replace("|", "\\|"))
        out.append(line)
    lines[:] = out


def check_every_module_documented(app, env):
    """A public module that no page documents is a warning."""
    documented = getattr(env, "tfdist_api_documented", set())
    for module_name in app.config.tfdist_api_public:
        if module_name not in documented:
            logger.warning(f"{module_name} is public and no page documents it "
                           f"(a ```{{tfdist-api}} {module_name}``` block)")


def merge(app, env, docnames, other):
    env.tfdist_api_documented = (getattr(env, "tfdist_api_documented", set())
                                 | getattr(other, "tfdist_api_documented", set()))


def setup(app):
    app.add_config_value("tfdist_api_public", PUBLIC, "env")
    app.connect("autodoc-process-docstring", house_style_to_rst, priority=400)  # before napoleon
    app.add_directive("tfdist-api", PublicApi)
    app.add_directive("tfdist-cli", CommandLine)
    app.add_directive("tfdist-config", ConfigKeys)
    app.connect("env-check-consistency", check_every_module_documented)
    app.connect("env-merge-info", merge)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
