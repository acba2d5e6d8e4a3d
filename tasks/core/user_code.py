"""The user's own code, named on the command line: `package.module:function` or
`path/to/file.py:function` (a dataset's pipeline, a model's builder).

A user's project may have modules of its own named as tfscale's packages (`tasks`,
`flows`: Celery and Invoke projects do). Its code is imported, and its function called,
with its own modules of those names in place of tfscale's (`own_modules`), so that both
work in one process.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tasks.core.errors import UsageError, UserError

FUNCTION = re.compile(r"^(?P<module>[^:]+):(?P<function>[A-Za-z_]\w*)$")
# tfscale's own top-level packages, which a user's project may also have
OURS = ("tasks", "flows")


def is_function_ref(ref: str) -> bool:
    """`package.module:function` or `path/to/file.py:function`."""
    return FUNCTION.match(ref) is not None and not Path(ref).exists()


def load_function(
    ref: str, what: str = "dataset", error: type[UserError] = UserError
) -> tuple[Callable, str]:
    """The function `ref` names (called with the user's modules in place: `own_modules`),
    and the file it is defined in.

    Raises:
        error: the module does not import, or has no such function (naming `--{what}`).
    """
    found = FUNCTION.match(ref)
    assert found is not None
    module_name, name = found.group("module"), found.group("function")
    folder = Path(module_name).resolve().parent if module_name.endswith(".py") else Path.cwd()
    try:
        with own_modules(folder):
            if module_name.endswith(".py"):
                path = Path(module_name).resolve()
                if not path.is_file():
                    raise error(
                        f"{module_name}: no such file (from --{what} {ref})",
                        "give the path of the Python file, relative to where tfscale runs",
                    )
                module = _import_file(path)
            else:
                cwd_importable()
                module = importlib.import_module(module_name)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's module: whatever it raises
        raise error(
            f"{module_name} (from --{what} {ref}) did not import: "
            f"{type(exc).__name__}: {one_line(exc)}",
            "fix the module (run again with --debug for the traceback), or check that it "
            "is importable from where tfscale runs",
        ) from exc
    function = getattr(module, name, None)
    if not callable(function):
        public = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        raise error(
            f"{module_name} has no function {name!r} (from --{what} {ref}); it defines "
            f"{', '.join(sorted(public)[:10]) or 'none'}",
            "name a function the module defines",
        )

    @functools.wraps(function)
    def in_place(*args: Any, **kwargs: Any) -> Any:
        with own_modules(folder):
            return function(*args, **kwargs)

    return in_place, str(getattr(module, "__file__", "") or "")


def file_of(ref: str) -> Path | None:
    """The file a function reference's module is defined in (None: not found)."""
    found = FUNCTION.match(ref)
    if found is None:
        return None
    module = found.group("module")
    if module.endswith(".py"):
        return Path(module)
    if module == REGISTRY:
        return None
    cwd_importable()
    with own_modules(Path.cwd()):
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return None
    return Path(spec.origin) if spec is not None and spec.origin else None


def fingerprint(ref: str) -> str:
    """The sha256 of the file a function reference's module is in (else the module's
    name): what a cache keys on, so that a changed file is run again."""
    if ref in _made_of:
        return _made_of[ref]
    path = file_of(ref)
    if path is None or not path.is_file():
        return ref.partition(":")[0]
    return hashlib.sha256(path.read_bytes()).hexdigest()


# objects handed over in this process (a notebook's function or dataset: `register`), as
# the attributes of a module of this name, each with what it is made of
REGISTRY = "tfscale_notebook"
_made_of: dict[str, str] = {}


def register(name: str, value: Any, made_of: str) -> str:
    """`value` as the function `REGISTRY:name` returns (a function is itself), reachable
    by reference in this process only; `made_of` is its fingerprint (what a cache keys
    on). Returns the reference."""
    import types

    module = sys.modules.setdefault(REGISTRY, types.ModuleType(REGISTRY))
    setattr(module, name, value if callable(value) else (lambda: value))
    ref = f"{REGISTRY}:{name}"
    _made_of[ref] = made_of
    return ref


def is_registered(ref: str) -> bool:
    return ref.startswith(REGISTRY + ":")


def model_fingerprint(ref: str) -> str:
    """What a model reference is made of, for caches and run directories to key on: a
    function's module file's sha256 (`fingerprint`), a saved `.keras` file's, else the
    reference itself (a built-in's name)."""
    if is_function_ref(ref) or ref in _made_of:
        return fingerprint(ref)
    path = Path(ref)
    if ref.endswith(".keras") and path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    return ref


def own_path(ref: str) -> Path | None:
    """The file or folder of the project's that a dataset or model reference reads: the
    path itself where it exists (a table, an .npz, an image folder, a .keras file), a
    function's module file within the project; None for a built-in's or an installed
    package's name."""
    if Path(ref).exists():
        return Path(ref)
    path = file_of(ref) if is_function_ref(ref) else None
    if path is None or not path.resolve().is_relative_to(Path.cwd().resolve()):
        return None
    return path


def check_dvc_dep(ref: str, key: str, files: str, files_key: str) -> None:
    """Under `dvc repro`, that DVC hashes what `ref` (the value of `key`) reads: dvc.yaml's
    stages name the user's files through `files` (the value of `files_key`), since DVC
    cannot tell a file from a built-in's name in `ref` itself. A file outside it would
    leave the stage unchanged to DVC when the file changes.

    Raises:
        UsageError: `files` does not exist, or `ref`'s file is not it nor in it.
    """
    named = Path(files)
    if not named.exists():
        raise UsageError(
            f"{files_key}: {files} does not exist",
            f"name the file or folder {key} reads in params.yaml (DVC's stages depend on it)",
        )
    own = own_path(ref)
    if own is None or own.resolve().is_relative_to(named.resolve()):
        return
    raise UsageError(
        f"{key} {ref} reads {own}, which is not in {files_key} ({files}): "
        "dvc repro would not rerun its stages when it changes",
        f"set {files_key}: {own} in params.yaml (or a folder holding it)",
    )


def cwd_importable() -> None:
    """`package.module` resolves from where tfscale runs, as `python -m` would."""
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))


@contextlib.contextmanager
def own_modules(folder: Path) -> Iterator[None]:
    """Within it, `import tasks` (or `flows`) gives the user's module of that name where
    `folder` has one, not tfscale's; after it, tfscale's are back, and the user's kept
    apart for the next time (their code holds its own references either way)."""
    names = [n for n in OURS if _theirs(folder, n)]
    if not names:
        yield
        return
    ours = _take(names)
    sys.modules.update(_kept.get(str(folder), {}))
    added = str(folder) not in sys.path
    if added:
        sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        _kept[str(folder)] = _take(names)
        sys.modules.update(ours)
        if added:
            sys.path.remove(str(folder))


_kept: dict[str, dict[str, Any]] = {}  # the user's modules named as ours, by their folder


def _theirs(folder: Path, name: str) -> bool:
    """`folder` has a module `name` that is not tfscale's own."""
    here = folder / name
    if not (here.is_dir() or here.with_suffix(".py").is_file()):
        return False
    mine = Path(__file__).resolve().parents[1] if name == "tasks" else None
    ours = sys.modules.get(name)
    origin = Path(getattr(ours, "__file__", "") or "").resolve().parent if ours else mine
    return origin is None or origin != here.resolve()


def _take(names: list[str]) -> dict[str, Any]:
    """Removes the modules `names` and their submodules from `sys.modules`; returns them."""
    taken = {
        key: module
        for key, module in sys.modules.items()
        if any(key == n or key.startswith(n + ".") for n in names)
    }
    for key in taken:
        del sys.modules[key]
    return taken


def _import_file(path: Path) -> Any:
    """A Python file as a module of its own name, its folder importable for its siblings."""
    name = "tfscale_user_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def one_line(exc: BaseException) -> str:
    """An exception's message, its first line (at most 300 characters)."""
    return (str(exc).strip().splitlines() or [""])[0][:300]
