"""The package's layers go one way (docs/architecture.py): a test of tfdist's own imports."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("architecture", ROOT / "docs" / "architecture.py")
architecture = importlib.util.module_from_spec(spec)
spec.loader.exec_module(architecture)


def test_every_import_goes_down_or_back_in_its_layer():
    upward = []
    for importer, imported in sorted(architecture.unit_edges()):
        if architecture.rank(imported) > architecture.rank(importer):
            upward.append(f"{importer} -> {imported}")
    assert upward == []


def test_nothing_imports_tfdist_inside_a_function():
    hidden = [f"{name}: {imported}" for name, path in architecture.modules().items()
              for imported, nested in architecture.imports(path) if nested]
    assert hidden == []


def test_the_leaves_import_nothing_from_tfdist():
    for name in ("tfdist.errors", "tfdist.limits", "tfdist.capabilities", "tfdist.regions"):
        path = architecture.modules()[name]
        allowed = {"tfdist.errors"}
        assert [m for m, _ in architecture.imports(path) if m not in allowed] == [], name


def test_the_check_can_fail():
    """An import of the Trainer from the core would be reported."""
    assert architecture.rank("training") > architecture.rank("core")
    assert architecture.unit_of("tfdist.strategies.kind") == "strategies"
    assert architecture.unit_of("tfdist.capabilities") == "capabilities"
    assert architecture.rank("capabilities") < architecture.rank("cluster")
