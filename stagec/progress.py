"""Progress bars for the long operations (compiling stage by stage, tuning, accuracy_target's
search, co-design), through tqdm on stderr: shown only when stderr is a terminal, never when the
caller says progress=False (the CLI's --quiet).  Imports nothing of stagec, so every stage may use it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable


def _tqdm():
    # NOTE: imported on first use: `stagec --help` stays fast
    from tqdm.auto import tqdm
    return tqdm


def shown(enabled: bool = True) -> bool:
    """Whether a bar would be drawn: asked for, and stderr a terminal."""
    return enabled and sys.stderr.isatty()


def bar(iterable: Iterable | None = None, total: int | None = None, desc: str = "", enabled: bool = True):
    """A tqdm bar over `iterable` (or one updated by hand), drawn only when shown(enabled)."""
    return _tqdm()(iterable, total=total, desc=desc, disable=not shown(enabled), leave=False, file=sys.stderr,
                   dynamic_ncols=True)


def note(message: str, enabled: bool = True) -> None:
    """A line between the bars, under the same condition."""
    if shown(enabled):
        _tqdm().write(message, file=sys.stderr)


class Reporter:
    """A progress callback (step, total, best, seconds), as the tuner and accuracy_target's search
    call it, drawn as one bar per search: the bar opens on the first call and closes at the last step."""

    def __init__(self, desc: str, what: str = "best", digits: str = ".4g"):
        self.desc, self.what, self.digits, self._bar = desc, what, digits, None

    def __call__(self, step: int, total: int, best: float, seconds: float) -> None:
        if self._bar is None:
            self._bar = bar(total=total, desc=self.desc)
        self._bar.n = step
        self._bar.set_postfix_str(f"{self.what} {best:{self.digits}}", refresh=True)
        if step >= total:
            self._bar.close()
            self._bar = None
