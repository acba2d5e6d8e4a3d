"""The user's own code, named on the command line: `package.module:function` or
`path/to/file.py:function` (a dataset's pipeline, a model's builder).

A user's project may have modules of its own named `tasks` or `flows` (Celery and Invoke
projects do): tfscale's code is `tfscale.tasks` and `tfscale.flows`, never imported as
`tasks` or `flows`, so it never takes the user's (docs/your-model.md says what an editable
install leaves on the path).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tfscale.tasks.core.errors import UsageError, UserError

FUNCTION = re.compile(r"^(?P<module>[^:]+):(?P<function>[A-Za-z_]\w*)$")


def is_function_ref(ref: str) -> bool:
    """`package.module:function` or `path/to/file.py:function`."""
    return FUNCTION.match(ref) is not None and not Path(ref).exists()


def load_function(
    ref: str, what: str = "dataset", error: type[UserError] = UserError
) -> tuple[Callable, str]:
    """The function `ref` names, and the file it is defined in.

    Raises:
        error: the module does not import, or has no such function (naming `--{what}`).
    """
    found = FUNCTION.match(ref)
    assert found is not None
    module_name, name = found.group("module"), found.group("function")
    try:
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
            _tensorflow_first(_source_of(module_name))
            with no_arguments(module_name):
                module = importlib.import_module(module_name)
    except UserError:
        raise
    except SystemExit as exc:  # a script's own argument parsing, a sys.exit at import
        raise error(
            f"{module_name} (from --{what} {ref}) exited while tfscale imported it ({exited(exc)})",
            "guard the script's own code with if __name__ == '__main__': (tfscale imports "
            "the module for its function; it sees no command-line arguments)",
        ) from exc
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
    return function, str(getattr(module, "__file__", "") or "")


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


def _import_file(path: Path) -> Any:
    """A Python file as a module of its own name, its folder importable for its siblings:
    the file as it is now (the name holds its contents' hash, so a long-lived process, a
    notebook's, imports an edited file again)."""
    where = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    name = f"tfscale_user_{where}_{hashlib.sha256(path.read_bytes()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    _tensorflow_first(path)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        with no_arguments(path):
            spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _source_of(module_name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None  # the import itself says why
    origin = getattr(spec, "origin", None)
    return Path(origin) if origin and origin.endswith(".py") else None


def _tensorflow_first(source: Path | None) -> None:
    """TensorFlow imported tfscale's way (`process.import_tensorflow`: its C++ start-up
    lines off the console) before a user's module that imports it or Keras does so itself;
    a module that names neither (a pandas table's function) costs no TensorFlow import."""
    if source is None or "tensorflow" in sys.modules:
        return
    try:
        text = source.read_text(errors="replace")
    except OSError:
        return
    if re.search(r"\b(tensorflow|keras)\b", text):
        from tfscale.tasks.core.process import import_tensorflow

        import_tensorflow()


def exited(exc: SystemExit) -> str:
    """`sys.exit(0)`, `sys.exit(2)`, `sys.exit('message')`: what a SystemExit was."""
    return f"sys.exit({exc.code!r})" if exc.code is not None else "sys.exit()"


@contextlib.contextmanager
def no_arguments(path: Path | str) -> Iterator[None]:
    """tfscale's own command line hidden from the user's module as it is imported: its
    `sys.argv` is the module's path alone, as `python file.py` with no arguments gives
    it, so an argument parser at import sees none of tfscale's flags."""
    saved = sys.argv
    sys.argv = [str(path)]
    try:
        yield
    finally:
        sys.argv = saved


def called(function: Callable, args: tuple, named: str, thing: str, error: type[UserError]) -> Any:
    """What the user's `function` returns for `args`; `named` is how the user named it
    (`--model mine.py:build`), `thing` what it returns (`model`, `dataset`).

    Raises:
        error: the function raised, or exited (never tfscale's own exit, in silence).
    """
    try:
        return function(*args)
    except SystemExit as exc:
        raise error(
            f"{named} exited ({exited(exc)}) instead of returning a {thing}",
            f"return the {thing} from the function; end nothing there",
        ) from exc
    except Exception as exc:  # noqa: BLE001 - the user's function: whatever it raises
        raise error(
            f"{named} raised {type(exc).__name__}: {one_line(exc)}",
            "fix the function (run again with --debug for the traceback)",
        ) from exc


def one_line(exc: BaseException) -> str:
    """An exception's message, its first line (at most 300 characters), without the
    terminal's colour codes Keras puts in some (`plain`)."""
    return (plain(exc).strip().splitlines() or [""])[0][:300]


def plain(exc: BaseException) -> str:
    """An exception's message without the terminal's colour codes Keras puts in some."""
    return re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
