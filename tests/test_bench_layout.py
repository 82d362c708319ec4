"""The layout of benchmarks/ (benchmarks/README.md): no import circle between its modules, no file past the
house limit, and every module importable by its package name (the way the suites start workers)."""

import ast
import pathlib
import re

import pytest

pytestmark = pytest.mark.unit

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
MAX_LINES = 400  # STYLE.md: a file past ~400 lines is asking to be split
# Files allowed past MAX_LINES, each with its reason. Empty: keep it so.
LONG_FILES: dict[str, str] = {}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(BENCHMARKS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for p in sorted(BENCHMARKS.rglob("*.py")) if "results" not in p.parts}


def imports_of(path: pathlib.Path, known: set[str]) -> set[str]:
    """The benchmarks modules `path` imports anywhere in it (function-level imports count: they still make a
    circle, only a later one)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from benchmarks.x import y`: y is a module when it is one, else a name in benchmarks.x.
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                     for a in node.names]
        found |= {n for n in names if n in known}
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` as [a, b, ..., a], or None (depth-first search, colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    # A package's __init__ is not an edge: importing benchmarks.x.y runs benchmarks/x/__init__.py, which imports
    # nothing here.
    return {name: imports_of(path, known) - {name, "benchmarks"} for name, path in found.items()}


def test_find_cycle_finds_a_circle_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_benchmarks_modules_import_no_circle():
    graph = import_graph()
    assert len(graph) > 40, sorted(graph)  # the walk sees the package (emulation, workloads, suites, ...)
    assert "benchmarks.analysis.points" in graph["benchmarks.suites.sweeps"]  # and sees the imports
    cycle = find_cycle(graph)
    assert cycle is None, "import circle in benchmarks/: " + " -> ".join(cycle)


def test_package_inits_import_nothing_of_benchmarks():
    for name, path in modules().items():
        if path.name == "__init__.py":
            assert imports_of(path, set(modules())) == set(), name


def test_no_benchmarks_file_is_past_the_line_limit():
    too_long = {str(p.relative_to(BENCHMARKS)): n for p in BENCHMARKS.rglob("*.py")
                if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert {k: v for k, v in too_long.items() if k not in LONG_FILES} == {}, \
        f"split these (STYLE.md: one concept per file) or list them in LONG_FILES with the reason: {too_long}"


def test_python_m_benchmarks_lists_every_suite_with_a_command_that_exists():
    import subprocess
    import sys

    from benchmarks.suites.catalogue import SUITES

    root = BENCHMARKS.parent
    done = subprocess.run([sys.executable, "-m", "benchmarks"], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    targets = set(re.findall(r"^([\w-]+):", (root / "Makefile").read_text(), re.MULTILINE))
    for suite in SUITES:
        assert f"\n{suite.name} " in done.stdout, suite.name
        make = re.match(r"make ([\w-]+)", suite.command)
        module = re.search(r"-m (benchmarks[\w.]+)", suite.command)
        assert make or module, suite.command
        if make:
            assert make[1] in targets, f"{suite.name}: no make target {make[1]}"
        if module:
            assert (root / (module[1].replace(".", "/") + ".py")).is_file(), suite.command
    assert "bandwidth" in done.stdout and " h " in done.stdout  # the sweeps' estimates, one per sweep
