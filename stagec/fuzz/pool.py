"""Jobs in worker processes with a time limit each: a job over its limit kills its worker.

JAX and torch take seconds to start, so a worker runs many jobs; one that hangs (or dies) is
replaced, and its job comes back as "hang" (or "died").  `run_jobs` yields each job as it finishes:

    >>> for job, status, value in run_jobs(range(4), square, workers=2, timeout_s=60):  # doctest: +SKIP
    ...     print(job, status, value)   # status "done" (value: work(job)), "hang" (value: what it
    ...                                 # took) or "died" (value: the worker's exit code)

The limit is on the CPU time the worker spends on the job (where /proc tells it), with a wall-clock
limit WALL_FACTOR times longer for a job that blocks: on a shared machine, a job's wall-clock time
says more about the neighbours than about the job.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection, wait
from pathlib import Path

_READY = "ready"
WALL_FACTOR = 5.0
POLL_S = 1.0


def _serve(conn: Connection, work: Callable, init: Callable | None) -> None:
    if init is not None:
        init()
    conn.send(_READY)
    while (job := conn.recv()) is not None:
        conn.send(work(job))


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a process (Linux /proc), None where unknown."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process and its threads (Linux /proc), None where unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")   # utime, stime


class _Worker:
    def __init__(self, ctx, work: Callable, init: Callable | None):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, work, init), daemon=True)
        self.process.start()
        child.close()
        self.job, self.started, self.cpu_start, self.ready, self.done = None, 0.0, None, False, 0

    def send(self, job) -> None:
        self.job, self.started, self.cpu_start = job, time.monotonic(), cpu_seconds(self.process.pid)
        self.conn.send(job)

    def spent(self) -> tuple[float | None, float]:
        """(CPU seconds, wall-clock seconds) spent on the current job."""
        cpu = cpu_seconds(self.process.pid)
        return (None if cpu is None or self.cpu_start is None else cpu - self.cpu_start,
                time.monotonic() - self.started)

    def stop(self, kill: bool = False) -> None:
        if kill:
            self.process.kill()
        else:
            try:
                self.conn.send(None)
            except OSError:
                pass
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def run_jobs(jobs: Iterable, work: Callable, workers: int, timeout_s: float, init: Callable | None = None,
             jobs_per_worker: int = 50, max_rss_bytes: int | None = None,
             start_method: str = "spawn") -> Iterator[tuple[object, str, object]]:
    """Yield (job, status, value) for every job, in the order they finish.  `work` and `init` must be
    importable module-level functions.  Workers are spawned by default: JAX's threads do not survive a
    fork ("fork" serves work that does not touch JAX, in a fraction of a spawn's start-up).  A worker
    is replaced after `jobs_per_worker` jobs or once it holds over `max_rss_bytes`, so what its caches
    hold (compiled functions of every shape met) stays bounded."""
    ctx = mp.get_context(start_method)
    pending = deque(jobs)
    pool = [_Worker(ctx, work, init) for _ in range(min(workers, len(pending)))]
    try:
        while pool:
            for w in pool:
                if w.ready and w.job is None and pending:
                    w.send(pending.popleft())
            busy = any(w.job is not None for w in pool)
            ready = set(wait([w.conn for w in pool], timeout=POLL_S if busy else None))
            kept = []
            for w in pool:
                finished = _collect(w, w.conn in ready, timeout_s)
                if finished is not None and finished[0] is not None:   # not a worker that died idle
                    yield finished
                lost = finished is not None and finished[1] in ("hang", "died")
                if lost or _spent(w, jobs_per_worker, max_rss_bytes) or (w.ready and w.job is None and not pending):
                    w.stop(kill=lost)
                    if pending:
                        kept.append(_Worker(ctx, work, init))
                else:
                    kept.append(w)
            pool = kept
    finally:
        for w in pool:
            w.stop(kill=True)


def _spent(w: _Worker, jobs_per_worker: int, max_rss_bytes: int | None) -> bool:
    """An idle worker that has run its share of jobs or holds too much memory."""
    if w.job is not None or not w.done:
        return False
    rss = rss_bytes(w.process.pid) if max_rss_bytes else None
    return w.done >= jobs_per_worker or (rss is not None and rss > max_rss_bytes)


def _collect(w: _Worker, readable: bool, timeout_s: float):
    """A finished job of a worker, as (job, status, value), or None (busy, idle, or just started)."""
    if readable:
        try:
            message = w.conn.recv()
        except (EOFError, OSError):
            if not w.ready:
                raise RuntimeError(f"a worker died while starting (exit code {w.process.exitcode})") from None
            job, w.job = w.job, None
            w.process.join(timeout=10)
            return job, "died", w.process.exitcode
        if message == _READY:
            w.ready = True
            return None
        job, w.job = w.job, None
        w.done += 1
        return job, "done", message
    if w.job is None:
        return None
    cpu, wall = w.spent()
    if (wall if cpu is None else cpu) > timeout_s or wall > WALL_FACTOR * timeout_s:
        job, w.job = w.job, None
        return job, "hang", f"{wall:.0f} s" if cpu is None else f"{cpu:.0f} s of CPU in {wall:.0f} s"
    return None
