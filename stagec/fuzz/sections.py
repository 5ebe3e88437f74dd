"""The kinds of job a fuzz campaign runs, by name: a job is (section, seed), its result a JSON-ready
record with at least "seed", "mode" (the column a campaign's table counts it under) and "outcome"."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .campaign import ACCEPTABLE_REJECTIONS, model_description, model_record
from .files import file_description, file_record


@dataclasses.dataclass(frozen=True)
class Section:
    """`run(seed)` is the record of a finished job, `describe(seed)` the record's description alone
    (for a job that hung or whose worker died); a worker is replaced after `jobs_per_worker` jobs
    (what its caches hold stays bounded; a cheap job runs many times on one worker's compiled bases).
    `acceptable_rejections`: the StagecError classes (by name) that are not failures, None for all."""

    run: Callable[[int], dict]
    describe: Callable[[int], dict]
    jobs_per_worker: int
    acceptable_rejections: frozenset[str] | None


SECTIONS = {
    # random models on random hardware: a rejection other than the hardware's or the data's limits is a gap
    "models": Section(model_record, model_description, jobs_per_worker=50, acceptable_rejections=ACCEPTABLE_REJECTIONS),
    # damaged program files: any StagecError is the right answer
    "files": Section(file_record, file_description, jobs_per_worker=1000, acceptable_rejections=None),
}


def run_job(job: tuple[str, int]) -> dict:
    section, seed = job
    return SECTIONS[section].run(seed)
