"""The house's plan against the code: `tasks/` is one subpackage per layer, each says what it
owns, and no module imports from a higher layer, at the top of a file, inside a function,
or by a name bound late (a module named in a string). docs/architecture.md draws the
layers as this test generates them (`python tests/test_layout.py` prints the drawing) and
lists every module with what it owns."""

from __future__ import annotations

import ast
import importlib
import re
import textwrap
from pathlib import Path

import pytest
from helpers import ROOT

pytestmark = pytest.mark.unit

# lowest first: a package imports only from itself and the packages before it
LAYERS = (
    "tasks.core",
    "tasks.settings",
    "tasks.data",
    "tasks.distribute",
    "tasks.train",
    "tasks.measure",
    "tasks.execute",
    "tasks.report",
    "tasks.track",
    "flows",
)
ROOTS = ("tasks", "flows")
PACKAGE = "tfscale"  # the one import name: tfscale.tasks, tfscale.flows (tfscale/__init__.py)
ROW = re.compile(r"^\| `((?:tasks|flows)/[\w/]+\.py)` \|")
DIAGRAM = re.compile(r"<!-- layers -->\n```\n(.*?)```\n", re.S)


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def modules_in_tree() -> dict[str, Path]:
    """{dotted module name: path} of every module of `tasks/` and `flows/`."""
    return {
        module_name(path): path
        for root in ROOTS
        for path in sorted((ROOT / root).rglob("*.py"))
        if path.name != "__init__.py"
    }


def layer_of(module: str) -> int:
    """The index in LAYERS of the package holding `module` (-1: none)."""
    package = module.rpartition(".")[0]
    return LAYERS.index(package) if package in LAYERS else -1


def in_tree(name: str) -> str:
    """A module's name as the tree's paths read it: `tfscale.tasks.x` is `tasks.x`."""
    return name.removeprefix(PACKAGE + ".")


def imported_names(path: Path) -> list[str]:
    """Every module `path` imports anywhere in it (dotted, as written), and those it binds
    late: `_later("tfscale.tasks.x.y", name)` calls and `*_MODULE = "tfscale.flows.x"`
    constants."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
            if in_tree(node.module) in (*ROOTS, *LAYERS):  # from tfscale.tasks.execute import x
                names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            names = late_bound(node)
        found += names
    return found


def imported_modules(path: Path, roots: tuple[str, ...] = ROOTS) -> set[str]:
    """The modules of `roots` (the project's: `tasks.x`, `flows.y`, as `in_tree` names
    them) that `path` imports or binds late (`imported_names`)."""
    names = [in_tree(n) if n.startswith(PACKAGE + ".") else n for n in imported_names(path)]
    return {n for n in names if n.split(".")[0] in roots}


def late_bound(node: ast.AST) -> list[str]:
    """A module named in a string: `_later("module", "name")`, `X_MODULE = "module"`."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_later":
        return [node.args[0].value]
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
        targets = [getattr(t, "id", "") for t in node.targets]
        if any(t.endswith("_MODULE") for t in targets):
            return [node.value.value]
    return []


def late_bound_names() -> list[tuple[str, str, str]]:
    """(module that names it, module, attribute or '') of every late-bound name."""
    found = []
    for module, path in modules_in_tree().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_later":
                found.append((module, in_tree(node.args[0].value), node.args[1].value))
            elif late_bound(node):
                found.append((module, in_tree(late_bound(node)[0]), ""))
    return found


def diagram() -> str:
    """The layers, top down: number, package, its modules."""
    modules = modules_in_tree()
    lines = []
    for index in reversed(range(len(LAYERS))):
        package = LAYERS[index]
        names = [m.rpartition(".")[2] for m in modules if m.rpartition(".")[0] == package]
        wrapped = textwrap.wrap(", ".join(names), 68) or [""]
        lines.append(f"{index + 1} {package.replace('.', '/') + '/':<18}{wrapped[0]}")
        lines += [" " * 20 + more for more in wrapped[1:]]
    return "\n".join(lines) + "\n"


def architecture() -> str:
    return (ROOT / "docs" / "architecture.md").read_text()


def test_every_module_is_in_a_layer_package_that_says_what_it_owns():
    outside = [m for m in modules_in_tree() if layer_of(m) < 0]
    assert outside == [], f"put these in one of {LAYERS}"
    for package in LAYERS:
        init = ROOT / package.replace(".", "/") / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert 0 < len(doc.splitlines()) <= 8, f"{init}: say in a few lines what it owns"


def test_no_module_imports_from_a_higher_layer():
    modules = modules_in_tree()
    upward = [
        f"{module} ({LAYERS[layer_of(module)]}) imports {target} ({LAYERS[layer_of(target)]})"
        for module, path in modules.items()
        for target in sorted(imported_modules(path))
        if target in modules
        and layer_of(target) > layer_of(module)
        and (module, target) not in late_bound_pairs()
    ]
    assert upward == []


def test_no_module_of_tasks_imports_prefect():
    """Prefect is the flows' engine: a step of `tasks/` runs without it, and the flows
    install what a step says into a run's log (`tasks.core.progress.log_runs_with`)."""
    found = {
        name: sorted(prefect)
        for name, path in modules_in_tree().items()
        if name.startswith("tasks.") and (prefect := imported_modules(path, ("prefect",)))
    }
    assert found == {}
    planted = ROOT / "flows" / "prefect_api.py"  # the check sees an import where there is one
    assert imported_modules(planted, ("prefect",))


def late_bound_pairs() -> set[tuple[str, str]]:
    """The upward names allowed: a strategy kind's builders and runners, which the table
    in `tasks.settings.kinds` names for the train layer, and the worker process's entry
    point, which `tasks.distribute.launch` runs."""
    allowed = {"tasks.settings.kinds", "tasks.distribute.launch"}
    return {(by, module) for by, module, _ in late_bound_names() if by in allowed}


def test_every_late_bound_name_resolves_and_only_the_allowed_modules_bind_late():
    names = late_bound_names()
    assert {by for by, _, _ in names} == {"tasks.settings.kinds", "tasks.distribute.launch"}
    for _, module, attribute in names:
        assert module in modules_in_tree(), module
        if attribute:
            imported = importlib.import_module(f"{PACKAGE}.{module}")
            assert hasattr(imported, attribute), (module, attribute)
        else:  # a process entry point: `python -m module`
            assert "__main__" in (ROOT / (module.replace(".", "/") + ".py")).read_text()


def test_no_import_circle():
    modules = modules_in_tree()
    late = late_bound_pairs()  # bound at run time, by name: no import
    graph = {
        m: {t for t in imported_modules(p) & set(modules) if (m, t) not in late}
        for m, p in modules.items()
    }
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


def test_the_architecture_draws_the_layers_of_the_tree_and_lists_every_module():
    drawn = DIAGRAM.search(architecture())
    assert drawn, "docs/architecture.md: put the drawing after a '<!-- layers -->' line"
    assert drawn[1] == diagram(), "run `python tests/test_layout.py` and paste its drawing"
    listed = {m[1] for line in architecture().splitlines() if (m := ROW.match(line))}
    present = {str(p.relative_to(ROOT)) for p in modules_in_tree().values()}
    assert present - listed == set(), "add these to docs/architecture.md's modules table"
    assert listed - present == set(), "remove these from docs/architecture.md's modules table"


def test_the_code_version_reads_every_module_of_every_layer():
    """Cached results know the code (`tasks/core/provenance.py`): its digest covers every
    module of the tree, in every package."""
    from tfscale.tasks.core.provenance import source_files

    read = {module_name(path) for path in source_files() if path.name != "__init__.py"}
    assert read == set(modules_in_tree())


def test_the_checks_see_an_upward_import(tmp_path):
    """The import reader finds a function-level import of a higher layer's module, and a
    module bound late by name."""
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    from tfscale.tasks.track.tracking import Tracker\n"
        "    import tfscale.flows.cli\n"
        "X = _later('tfscale.tasks.train.steps', 'make_epoch_runner')\n"
        "WORKER_MODULE = 'tfscale.flows.worker'\n"
    )
    assert imported_modules(module) == {
        "tasks.track.tracking",
        "flows.cli",
        "tasks.train.steps",
        "flows.worker",
    }


def test_tfscales_code_is_imported_as_tfscale_tasks_and_flows_never_as_tasks_or_flows():
    """A project's own `tasks` or `flows` (Celery's, Invoke's) never meets tfscale's: no file
    of the repository imports or names a module `tasks.x` or `flows.x` but as
    `tfscale.tasks.x`, `tfscale.flows.x` (a module imported as both would be two)."""
    files = [p for part in (*ROOTS, "tests", "benchmarks") for p in (ROOT / part).rglob("*.py")]
    bare = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted(files)
        for name in imported_names(path)
        if name.split(".")[0] in ROOTS
    ]
    assert bare == [], "import tfscale.tasks... / tfscale.flows...:\n" + "\n".join(bare)


def test_the_bare_name_check_sees_a_bare_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from tasks.core import errors\nimport tfscale.flows.cli\n")
    assert [n for n in imported_names(module) if n.split(".")[0] in ROOTS] == ["tasks.core.errors"]


MOST_LINES = 50  # a function's, its signature and docstring included
MOST_PARAMETERS = 8  # beyond: a value object


def oversized(path: Path) -> list[str]:
    """The functions in `path` over either limit: `module.py:12 name: 63 lines`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        lines = node.end_lineno - node.lineno + 1
        given = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        parameters = len([a for a in given if a.arg not in ("self", "cls")])
        if lines > MOST_LINES:
            found.append(f"{path}:{node.lineno} {node.name}: {lines} lines")
        if parameters > MOST_PARAMETERS:
            found.append(f"{path}:{node.lineno} {node.name}: {parameters} parameters")
    return found


def test_no_function_is_over_50_lines_or_8_parameters():
    """The size limits, held as the layers are: a function that outgrows them is split,
    its parameters gathered into a value object."""
    found = [line for path in modules_in_tree().values() for line in oversized(path)]
    assert not found, "over the limits (split it, or gather its parameters):\n" + "\n".join(found)


def test_the_size_check_sees_a_long_function_and_a_long_signature(tmp_path):
    module = tmp_path / "m.py"
    body = "".join(f"    x{i} = {i}\n" for i in range(50))
    module.write_text(
        f"def long():\n{body}\n\ndef wide(self, a, b, c, d, e, f, g, h, i):\n    pass\n"
    )
    assert oversized(module) == [f"{module}:1 long: 51 lines", f"{module}:54 wide: 9 parameters"]


def test_the_readme_is_a_front_door_of_at_most_200_lines():
    """What a new user reads first: the set-up, the answer, where the rest is."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move detail to docs/"


if __name__ == "__main__":
    print(diagram(), end="")
