"""A sweep's results: a JSON-lines file of one row per point, appended as points finish, and what
is drawn from it (Pareto fronts as a table and a figure) -- from the file alone, so every figure
regenerates without rerunning anything.

    >>> results = load_results("sweep.jsonl")                     # doctest: +SKIP
    >>> print(results.pareto_table("area_mm2", "latency_s"))     # doctest: +SKIP
    >>> results.figure().savefig("pareto.png")                    # doctest: +SKIP
    >>> frame = results.to_pandas()                               # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

from stagec.errors import InputError

# the config fields a front's table shows (those that vary)
CONFIG_COLUMNS = ("array_rows", "array_cols", "dataflow", "scratchpad_bytes", "accumulator_bytes",
                  "dma_bandwidth_bytes_per_cycle")
FRONTS = (("area_mm2", "latency_s"), ("energy_pj", "latency_s"))   # what figure() draws by default
_LABELS = {"area_mm2": "area (mm$^2$)", "latency_s": "latency (s)", "energy_pj": "energy (pJ)", "cycles": "cycles"}


class ResultsFile:
    """The rows of one results file: read at open (a partial last line, from a run killed while
    writing it, is cut off), appended one flushed line per row."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.rows = _read(self.path, repair=True)

    def done(self) -> set[str]:
        return {r["id"] for r in self.rows}

    def append(self, rows: list[dict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.rows.extend(rows)


@dataclass(frozen=True)
class SweepResults:
    """The rows of a sweep (one per point: the file's, the first of any id written twice) and how
    many this run computed."""

    rows: list[dict]
    path: Path | None = None
    computed: int = 0

    def ok(self) -> list[dict]:
        """The rows without an error."""
        return [r for r in self.rows if r.get("error") is None]

    def pareto(self, x: str = "area_mm2", y: str = "latency_s", by: str | None = "model") -> list[dict]:
        """The rows no other row of their group (`by`'s value; None: all one group) beats in both
        `x` and `y` (lower is better), by group, then by `x`."""
        groups: dict = {}
        for r in self.ok():
            if r.get(x) is not None and r.get(y) is not None:
                groups.setdefault(r.get(by) if by else None, []).append(r)
        front = []
        for key in sorted(groups, key=str):
            best = float("inf")
            for r in sorted(groups[key], key=lambda r: (r[x], r[y])):
                if r[y] < best:
                    front.append(r)
                    best = r[y]
        return front

    def pareto_table(self, x: str = "area_mm2", y: str = "latency_s", by: str | None = "model",
                     columns: tuple[str, ...] = CONFIG_COLUMNS) -> str:
        """The front as a text table: group, x, y and the config `columns` that vary in the sweep."""
        varying = [c for c in columns if len({str(r.get(c)) for r in self.rows}) > 1] or list(columns[:2])
        head = [by or "", x, y, *varying]
        lines = [[str(r.get(by, "")) if by else "", _fmt(r[x]), _fmt(r[y]), *(_fmt(r.get(c)) for c in varying)]
                 for r in self.pareto(x, y, by)]
        widths = [max(len(s) for s in col) for col in zip(head, *lines, strict=True)]
        text = [" ".join(s.rjust(w) for s, w in zip(line, widths, strict=True)) for line in [head, *lines]]
        return "\n".join([text[0], "-" * len(text[0]), *text[1:]])

    def figure(self, fronts=FRONTS, by: str | None = "model") -> Figure:
        """A row of panels per group (`by`'s value), one per (x, y) pair: the group's feasible
        points, and its front as a step line."""
        keys = sorted({r.get(by) if by else None for r in self.ok()}, key=str) or [None]
        fig = Figure(figsize=(5.5 * len(fronts), 3.8 * len(keys)), layout="constrained")
        for row, key in enumerate(keys):
            mine = SweepResults([r for r in self.ok() if (r.get(by) if by else None) == key])
            for col, (x, y) in enumerate(fronts):
                ax = fig.add_subplot(len(keys), len(fronts), row * len(fronts) + col + 1)
                shown = [r for r in mine.rows if r.get(x) is not None and r.get(y) is not None]
                front = mine.pareto(x, y, None)
                ax.scatter([r[x] for r in shown], [r[y] for r in shown], s=12, alpha=0.35, color="C0",
                           label=f"{len(shown)} configs")
                ax.step([r[x] for r in front], [r[y] for r in front], where="post", color="C1", marker="o", ms=4,
                        label="Pareto front")
                ax.set(xlabel=_LABELS.get(x, x), ylabel=_LABELS.get(y, y), xscale=_scale(shown, x),
                       yscale=_scale(shown, y), title=str(key) if by else "")
                ax.grid(alpha=0.3, which="both")
                ax.legend(fontsize=7)
        return fig

    def to_pandas(self):
        """The rows as a pandas DataFrame (pandas is not a dependency of stagec: install it to use this)."""
        try:
            import pandas
        except ImportError as e:
            raise ImportError("to_pandas needs pandas: pip install pandas") from e
        return pandas.DataFrame(self.rows)


def load_results(path: str | Path) -> SweepResults:
    """A results file's rows (what `stagec.sweep` wrote, complete or not)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such results file")
    return SweepResults(_read(path, repair=False), path)


def _read(path: Path, repair: bool) -> list[dict]:
    """The file's rows, the first of each id; with `repair`, a partial last line is cut from the file."""
    if not path.exists():
        return []
    data = path.read_bytes()
    complete = data[:data.rfind(b"\n") + 1]
    if repair and len(complete) < len(data):
        with path.open("r+b") as f:
            f.truncate(len(complete))
    rows, seen = [], set()
    for number, line in enumerate(complete.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{number}: not a results row ({e})") from None
        if not isinstance(r, dict) or "id" not in r:
            raise InputError(f"{path}:{number}: not a results row (no id)")
        if r["id"] not in seen:
            seen.add(r["id"])
            rows.append(r)
    return rows


def _scale(rows: list[dict], column: str) -> str:
    """log when the values span more than a decade (a sweep's latencies often do), else linear."""
    values = [r[column] for r in rows if r.get(column) is not None and r[column] > 0]
    return "log" if values and max(values) > 10 * min(values) else "linear"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)
