"""Replays of many levels, in worker processes when asked: each level is its own simulation."""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat

from sims.fit.replay import PHASE, LevelShape, Replayed, replay
from sims.profile import Profile


def _one(profile: Profile, shape: LevelShape, seed: int) -> Replayed:
    return replay(profile, shape, seed=seed, phase=PHASE)


class Replayer:
    """`run(profile, shapes, seeds)`: the replays in order; `jobs` > 1 spreads them over that
    many processes (worth it from a few dozen levels: each evaluation of the fit replays all)."""

    def __init__(self, jobs: int = 1) -> None:
        self.jobs = max(1, jobs)
        self._pool: ProcessPoolExecutor | None = None
        if self.jobs > 1:
            # Workers forked from a clean server process, not from this one and its threads.
            methods = multiprocessing.get_all_start_methods()
            context = multiprocessing.get_context(
                "forkserver" if "forkserver" in methods else "spawn"
            )
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=context)

    def run(
        self, profile: Profile, shapes: Sequence[LevelShape], seeds: Sequence[int]
    ) -> list[Replayed]:
        if self._pool is None:
            return [_one(profile, s, seed) for s, seed in zip(shapes, seeds, strict=True)]
        return list(self._pool.map(_one, repeat(profile), shapes, seeds))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def __enter__(self) -> Replayer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
