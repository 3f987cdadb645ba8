"""tfdist's layers, from its own import graph: `python docs/architecture.py` draws
docs/concepts/architecture.png; `tests/unit/project/test_layers.py` checks the same graph
against `LAYERS`.

A module may import from its own layer's earlier packages and from lower layers, never
from a higher one; nothing imports tfdist inside a function (no hidden cycle).
"""

import ast
import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: Bottom to top; within a layer, a package may import the ones listed before it.
LAYERS = (
    ("errors", "limits", "versions", "capabilities", "regions", "step_times_line",
     "resize_signal", "report"),  # leaves
    ("cluster", "config", "checkpoint"),    # YAML, TF_CONFIG, checkpoint files; no TensorFlow
    ("strategies",),                        # get_strategy and the subclasses
    ("step", "seam", "loop", "core"),       # one step; Keras' optimizer internals; between
                                            # steps; the face of the names core documented
    ("compression", "local_sgd"),           # features, as hooks
    ("keras", "callbacks", "horovod"),      # thin Keras adapters; Horovod's API
    ("training",),                          # the Trainer
    ("launch", "cli", "__main__", "__init__"),  # the command line
)


def unit_of(module):
    """The layer unit of a dotted module name ('tfdist.strategies.kind' -> 'strategies')."""
    parts = module.split(".")[1:] or ["__init__"]
    dotted = ".".join(parts[:2])
    units = [u for layer in LAYERS for u in layer]
    return dotted if dotted in units else parts[0]


def rank(unit):
    """(layer, position in layer) of a unit."""
    for i, layer in enumerate(LAYERS):
        if unit in layer:
            return i, layer.index(unit)
    raise KeyError(f"{unit} is in no layer of docs/architecture.py")


def modules():
    """{dotted module name: path} of every tfdist module."""
    found = {}
    for path in sorted((ROOT / "tfdist").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name if name != "tfdist" else "tfdist.__init__"] = path
    return found


def imports(path):
    """[(imported tfdist module, inside a function?)] of one file."""
    tree = ast.parse(path.read_text())
    nested = {id(n) for f in ast.walk(tree)
              if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
              for n in ast.walk(f) if n is not f}
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module == "tfdist" and node.level == 0:
            names = [f"tfdist.{a.name}" for a in node.names]  # from tfdist import limits
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        found += [(n, id(node) in nested) for n in names if n.split(".")[0] == "tfdist"]
    return found


def unit_edges():
    """{(importer unit, imported unit)} between different units."""
    edges = set()
    for name, path in modules().items():
        for imported, _ in imports(path):
            a, b = unit_of(name), unit_of(imported if imported != "tfdist" else "tfdist.__init__")
            if a != b:
                edges.add((a, b))
    return edges


def draw(path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 7))
    where = {}
    for i, layer in enumerate(LAYERS):
        for j, unit in enumerate(layer):
            where[unit] = (j - (len(layer) - 1) / 2, i)
    for a, b in sorted(unit_edges()):
        if b in LAYERS[0][:2]:
            continue  # every layer raises tfdist's errors: not drawn
        (x0, y0), (x1, y1) = where[a], where[b]
        ax.annotate("", (x1, y1 + 0.15), (x0, y0 - 0.15),
                    arrowprops=dict(arrowstyle="->", color="0.6", lw=0.8,
                                    connectionstyle="arc3,rad=0.12"))
    for unit, (x, y) in where.items():
        ax.text(x, y, unit, ha="center", va="center", fontsize=10,
                bbox=dict(boxstyle="round",
                          fc="#dbe9f6" if unit in ("step", "seam", "loop") else "white"))
    ax.set_xlim(-2.5, 2.5)
    ax.set_ylim(-0.7, len(LAYERS) - 0.3)
    ax.axis("off")
    ax.set_title("tfdist's import graph: arrows point from importer to imported, lower is "
                 "more basic (imports of the errors not drawn)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    draw(os.path.join(os.path.dirname(os.path.abspath(__file__)), "concepts", "architecture.png"))
