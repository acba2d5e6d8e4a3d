"""tfscale's one import name: its code is `tfscale.tasks` (the steps) and `tfscale.flows`
(the flows and the command line), so a project's own `tasks` or `flows` never meets it.

The repository keeps both folders at its top (the project's layout). A wheel puts them
inside this package (pyproject.toml's `sources`); an editable install, which puts the
repository itself on the path, leaves them beside it, and this package's path takes in
the repository's top so that `tfscale.tasks` is the repository's `tasks/`.
"""

from pathlib import Path as _Path

_here = _Path(__file__).resolve().parent
if not (_here / "tasks").is_dir():  # the repository (editable), not a wheel
    __path__.append(str(_here.parent))
