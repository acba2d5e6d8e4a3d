"""The house's plan against the code: docs/architecture.md lists every module of `tasks/`
and `flows/` with its layer, and no module imports from a layer above its own, at the top
of a file or inside a function."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from helpers import ROOT

pytestmark = pytest.mark.unit

ROW = re.compile(r"^\| (\d+) \| `((?:tasks|flows)/\w+\.py)` \|")
PACKAGES = ("tasks", "flows")


def planned_layers() -> dict[str, int]:
    """{module path: layer} from the modules table of docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    return {m[2]: int(m[1]) for line in text.splitlines() if (m := ROW.match(line))}


def modules_in_tree() -> set[str]:
    return {
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in (ROOT / package).glob("*.py")
        if path.name != "__init__.py"
    }


def imported_modules(path: Path) -> set[str]:
    """The project modules `path` imports anywhere in it, as paths (`tasks/run.py`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
            if node.module in PACKAGES:  # from tasks import runs
                names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found.update(n.replace(".", "/") + ".py" for n in names if n.split(".")[0] in PACKAGES)
    return found


def test_the_plan_lists_every_module_and_no_other():
    planned, present = set(planned_layers()), modules_in_tree()
    assert present - planned == set(), "add these to docs/architecture.md"
    assert planned - present == set(), "remove these from docs/architecture.md"


def test_no_module_imports_from_a_higher_layer():
    layers = planned_layers()
    upward = [
        f"{module} (layer {layers[module]}) imports {target} (layer {layers[target]})"
        for module in sorted(layers)
        for target in sorted(imported_modules(ROOT / module))
        if target in layers and layers[target] > layers[module]
    ]
    assert upward == []


def test_no_import_circle():
    graph = {m: imported_modules(ROOT / m) & set(planned_layers()) for m in planned_layers()}
    circles = []

    def visit(module: str, path: list[str]) -> None:
        for target in sorted(graph[module]):
            if target == path[0]:
                circles.append(" -> ".join([*path, target]))
            elif target not in path and target > path[0]:  # each circle once, from its least
                visit(target, [*path, target])

    for module in sorted(graph):
        visit(module, [module])
    assert circles == []


def test_the_checks_see_an_upward_import(tmp_path):
    """The import reader finds a function-level import of a higher layer's module."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from tasks.tracking import Tracker\n    import flows.cli\n")
    assert imported_modules(module) == {"tasks/tracking.py", "flows/cli.py"}
    assert planned_layers()["tasks/tracking.py"] > planned_layers()["tasks/training.py"]
