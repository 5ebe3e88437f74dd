"""Where a sweep's tasks run: in this process one after another ("local"), or as Ray tasks
("ray": the running instance if this process has one, else the cluster at `address` or
RAY_ADDRESS, else a local instance started for the sweep and stopped after it).

Each executor yields the rows of every task as it finishes, in whatever order they finish, so
the driver appends them to the results file at once.  A Ray worker that dies mid-task (killed,
out of memory, its node lost) costs only that task, which Ray runs again (`max_retries`); the
rows already written stay.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

from stagec.errors import InputError

from .points import Settings, run_task

EXECUTORS = ("ray", "local")


def choose(executor: str | None) -> str:
    """The executor to use: Ray when installed and not told otherwise."""
    if executor is None:
        return "ray" if importlib.util.find_spec("ray") is not None else "local"
    if executor not in EXECUTORS:
        raise InputError(f"executor must be one of {EXECUTORS}, not {executor!r}")
    if executor == "ray" and importlib.util.find_spec("ray") is None:
        raise InputError("executor='ray' needs Ray: pip install 'stagec[distributed]' (or executor='local')")
    return executor


def run_local(graphs: dict, tasks: list[tuple], settings: Settings) -> Iterator[list[dict]]:
    """tasks: (graph key, points); graphs: key -> Graph."""
    for key, points in tasks:
        yield run_task(graphs[key], points, settings)


def run_ray(graphs: dict, tasks: list[tuple], settings: Settings, address: str | None = None,
            workers: int | None = None, max_retries: int = 3) -> Iterator[list[dict]]:
    """The tasks as Ray tasks, each graph put in the object store once."""
    import ray

    started = not ray.is_initialized()
    if started:
        cluster = address or os.environ.get("RAY_ADDRESS")   # None: a local instance of `workers` CPUs
        ray.init(address=cluster, num_cpus=None if cluster else workers, include_dashboard=False,
                 log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=1, max_retries=max_retries)(run_task)
        refs = {key: ray.put(graph) for key, graph in graphs.items()}
        settings_ref = ray.put(settings)
        pending = [remote.remote(refs[key], points, settings_ref) for key, points in tasks]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])
    finally:
        if started:
            ray.shutdown()
