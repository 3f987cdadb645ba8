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


#: The names `tfdist.core` documented before the step core was split into step/, seam/
#: and loop/, each with the module that holds it now.
CORE_FACE = {
    "tfdist.loop.driver": ["HookDriver", "before_read"],
    "tfdist.loop.function": ["StepFunction", "function"],
    "tfdist.seam.optimizer": ["pipeline_of", "with_gradient_pipeline", "with_hook"],
    "tfdist.seam.replica_state": ["SyncReplicaState", "sync_replica_state"],
    "tfdist.step.hooks": ["GradientPipeline", "TrainingHook", "all_reduce_sum"],
    "tfdist.step.transaction": ["Decision", "decide"],
}


def test_tfdist_core_still_offers_every_name_it_documented():
    """Code written against `tfdist.core` keeps working: each name is the very object of
    its new home, and the face offers nothing else."""
    import importlib

    import tfdist.core

    names = [name for found in CORE_FACE.values() for name in found]
    assert sorted(tfdist.core.__all__) == sorted(names)
    for module, found in CORE_FACE.items():
        for name in found:
            assert getattr(tfdist.core, name) is getattr(importlib.import_module(module), name)


def benchmark_imports():
    """{benchmark module: the benchmark modules it imports, anywhere in the file}."""
    import ast
    import pathlib

    folder = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
    names = {path.stem for path in folder.glob("*.py")}
    graph = {}
    for path in folder.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
        graph[path.stem] = found & names - {path.stem}
    return graph


def cycle_in(graph):
    """One import cycle of `graph` as a list of modules, or None."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node, [node])):
            return found
    return None


def test_the_benchmarks_import_each_other_without_a_cycle():
    """The measuring library (e.g. overhead_pairs.py) is imported by the benchmarks, never
    the other way round: no benchmark module imports one that imports it back."""
    assert cycle_in(benchmark_imports()) is None, cycle_in(benchmark_imports())
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # it can fail
