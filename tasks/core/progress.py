"""What a user sees while work runs: a status line per step of the work, a progress bar per
training.

`status(name, text)` writes one line to the console (quiet mode shows it; see
`tasks.core.process`) and, inside a Prefect flow run, to that run's log on the server, so a
deployment's page shows the same steps (`flows` installs the run's logger:
`log_runs_with`). `EpochWatcher` follows a training's
`history.json`, which the process that trains (this one, or the chief of a multi-worker
job) rewrites after every epoch: a progress bar on a terminal, a line per epoch
elsewhere (in a Prefect run: its log on the server), and each epoch handed to a callback
(live MLflow metrics).
"""

from __future__ import annotations

import json
import logging
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tfscale.tasks.core.label_kinds import SCORES  # what an epoch reports, by the label's kind
from tfscale.tasks.core.process import STATUS_MARK

log = logging.getLogger("tfscale")


COLUMNS = 100  # a terminal's common width: a status line longer wraps under its text
NAME_WIDTH = 11


def fitted(text: str, room: int, indent: str = "") -> list[str]:
    """`text` in lines of at most `room` columns, each after the first led by `indent`; a
    word is never split, so an interval (`0.65-1.39`), a path or a link stays whole (and
    may pass `room` alone on its line)."""
    return textwrap.wrap(
        text, room, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )


def status_line(name: str, text: str) -> str:
    """`name` padded to `NAME_WIDTH`, then `text` within `COLUMNS`, each continuation line
    under the text's column (`fitted`)."""
    room = COLUMNS - NAME_WIDTH - 1
    # a line the text breaks itself stays broken
    parts = [part for line in text.split("\n") for part in fitted(line, room)] or [""]
    indent = "\n" + " " * (NAME_WIDTH + 1)
    return f"{name:<{NAME_WIDTH}} " + indent.join(parts)


def wrapped(label: str, value: str, width: int) -> list[str]:
    """`label` padded to `width`, then `value` over as many lines as it takes to fit
    `COLUMNS`, each continuation under the value's column (`fitted`): the summary's rows,
    the plan's sources."""
    parts = fitted(value, COLUMNS - width - 2) or [""]
    indent = " " * (width + 2)
    return [f"{label:<{width}}  {parts[0]}".rstrip()] + [indent + p for p in parts[1:]]


def status(name: str, text: str) -> None:
    """`name  text` on the console (`status_line`), and in the current Prefect run's log if
    there is one."""
    line = status_line(name, text)
    run_logger = _run_logger()
    if run_logger is None:
        log.info(line, extra={STATUS_MARK: True})
    else:  # it reaches the console through the root handler, and the server
        run_logger.info(line, extra={STATUS_MARK: True})


def _no_run() -> Any:
    return None


_run_logger: Callable[[], Any] = _no_run  # the current run's logger, or None


def log_runs_with(find: Callable[[], Any]) -> None:
    """Status lines and epochs go also to the logger `find()` returns at the time (None:
    no run now). `flows` installs Prefect's run logger here when it is imported, so the
    foundation never imports Prefect."""
    global _run_logger
    _run_logger = find


def epoch_score(epoch: dict[str, float]) -> tuple[str, float]:
    """The epoch's score and its name: `accuracy`, or a real-valued label's
    `mean_absolute_error` (`tasks.train.objectives`)."""
    name = next((n for n in SCORES if n in epoch), "accuracy")
    return name, epoch.get(name, float("nan"))


def held_out_text(epoch: dict[str, float]) -> str:
    """`held-out 0.9472` (the epoch's score), `held-out auc 0.9901` (another target metric):
    the epoch's last evaluation (`tasks.train.to_target`); empty without one."""
    name, _ = epoch_score(epoch)
    for key, value in epoch.items():
        if key.startswith("heldout_"):
            metric = key.removeprefix("heldout_")
            shown = "" if metric == name else metric.replace("_", " ") + " "
            return f"held-out {shown}{value:.4f}"
    return ""


def format_epoch(epoch: dict[str, float], epochs: int) -> str:
    """`epoch 3/10  loss 0.2586  accuracy 0.9219  held-out 0.9472  11,922 ex/s`: the
    held-out score is the epoch's last evaluation (`tasks.train.to_target`), if any."""
    name, score = epoch_score(epoch)
    held_out = held_out_text(epoch)
    return (
        f"epoch {int(epoch['epoch'])}/{epochs}  loss {epoch['loss']:.4f}  "
        f"{name.replace('_', ' ')} {score:.4f}  "
        + (f"{held_out}  " if held_out else "")
        + f"{epoch['examples_per_s']:,.0f} ex/s"
    )


class EpochWatcher:
    """Follows `run_dir/history.json` while a training runs (a context manager).

    Each epoch not seen before goes to `on_epoch` (errors there are logged, never
    raised: a tracking hiccup must not stop a training) and to the progress display.
    """

    def __init__(
        self,
        run_dir: str | Path,
        epochs: int,
        label: str,
        on_epoch: Callable[[dict[str, float]], None] | None = None,
        interval_s: float = 0.5,
        lines: bool = False,
    ):
        self.path = Path(run_dir) / "history.json"
        self.epochs, self.label, self.on_epoch = epochs, label, on_epoch
        self.lines = lines  # off a terminal: a console line per epoch (a lone training)
        self.interval_s = interval_s
        self.seen = 0
        self._stamp: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True, name="epochs")
        self._bar: Any = None
        # the Prefect run this training belongs to, taken here: the thread that follows
        # the epochs has no run context of its own, and its lines would miss the run's log
        self._run_logger: Any = None

    def __enter__(self) -> EpochWatcher:
        self._run_logger = _run_logger()
        if self.path.exists():  # a resumed run: its earlier epochs are not news
            self.seen = len(self._read())
        if sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.epochs,
                initial=self.seen,
                desc=self.label,
                unit="epoch",
                leave=False,
                file=sys.stderr,
            )
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()
        if self._bar is not None:
            self._bar.close()

    def _follow(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def poll(self) -> None:
        """Hands on the epochs written since the last look."""
        history = self._read()
        for epoch in history[self.seen :]:
            self.seen += 1
            if self.on_epoch is not None:
                try:
                    self.on_epoch(epoch)
                except Exception as exc:  # noqa: BLE001 - reported, training goes on
                    log.warning("could not record epoch %s: %s", epoch.get("epoch"), exc)
            if self._bar is not None:
                name, score = epoch_score(epoch)
                held_out = held_out_text(epoch)
                short = "acc" if name == "accuracy" else "mae"
                self._bar.set_postfix_str(
                    f"loss {epoch['loss']:.4f} {short} {score:.4f}"
                    + (f" {held_out}" if held_out else ""),
                    refresh=False,
                )
                self._bar.update(1)
            elif self.lines:
                status(self.label, format_epoch(epoch, self.epochs))
            else:  # not a terminal: the Prefect run's log (the console with --verbose)
                self._log(f"{self.label:<11} {format_epoch(epoch, self.epochs)}")

    def _log(self, line: str) -> None:
        if self._run_logger is not None:
            self._run_logger.info(line)  # the server's log; the console only with --verbose
        else:
            log.debug(line)

    def _read(self) -> list[dict[str, float]]:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return []
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return []
        try:
            history = json.loads(self.path.read_text())
        except (OSError, ValueError):  # caught mid-write: the next look reads it whole
            return []
        self._stamp = stamp
        return history


class RoundsProgress:
    """Measuring rounds as they run (a context manager): a line saying what is timed and
    until when as they start, then after each round the rounds done against the most
    allowed and how well the watched figure is known so far. A bar on a terminal; elsewhere
    (a log, a Prefect run's page) a line every `every` rounds."""

    def __init__(self, what: str, figure: str, cap: int, aim: float, every: int = 5):
        self.what, self.figure, self.cap, self.aim, self.every = what, figure, cap, aim, every
        self._bar: Any = None

    @property
    def until(self) -> str:
        if not self.aim:
            return f"{self.cap} rounds"
        return f"until {self.figure} is known to +-{self.aim:.0%} (at most {self.cap} rounds)"

    def __enter__(self) -> RoundsProgress:
        status("measuring", f"{self.what}, alternating, {self.until}")
        if sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.cap, desc="measuring", unit="round", leave=False, file=sys.stderr
            )
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.close()

    def round(self, done: int, half_width: float | None) -> None:
        """Round `done` ended with the figure known to +-`half_width` (None: too few rounds
        for an interval yet)."""
        known = (
            f"{self.figure} known to +-{half_width:.1%}"
            if half_width is not None
            else f"too few rounds yet for {self.figure}'s interval"
        )
        if self._bar is not None:
            self._bar.set_postfix_str(known, refresh=False)
            self._bar.update(1)
        elif done % self.every == 0 and done < self.cap:
            status("measuring", f"round {done} of at most {self.cap}: {known}")
