"""The simulator profile of the run's server: `specctl sim fit`'s fit of its bench (or a profile
given), with an acceptance phase per dataset of the trace at the accept lengths the server
showed on that prompt family."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from benchmarks.gpu.sim_trace.inputs import SimTraceError
from sims.fit.bench_file import BenchRun
from sims.fit.fitting import CANDIDATES, FitError, fit_profile
from sims.fit.framing import acceptance_rates
from sims.fit.pool import Replayer
from sims.fit.profile_file import with_provenance, write_profile
from sims.profile import Profile, ProfileError, load_profile

# The fit splits its search budget over an outlier's candidates and its two passes.
MIN_EVALUATIONS = 2 * CANDIDATES
SOURCE_LINE = "Acceptance phases of the trace's datasets"


def _load(name: str, option: str) -> Profile:
    try:
        return load_profile(name)
    except ProfileError as err:
        raise SimTraceError(f"{option}: {err}") from None


def fitted(
    run: BenchRun, base: str, name: str, evaluations: int, jobs: int,
    say: Callable[[str], None],
) -> Profile:  # fmt: skip
    """`specctl sim fit` of the bench, as it writes it (provenance included)."""
    base_profile = _load(base, "--base")
    with Replayer(jobs) as replayer:
        try:
            result = fit_profile([run], base_profile, name, budget=evaluations,
                                 replayer=replayer, progress=say)  # fmt: skip
        except FitError as err:
            raise SimTraceError(f"fitting {run.path}: {err}") from None
    for note in result.notes:
        say(f"note: {note}")
    for outlier in result.outliers:
        say(f"outlier: {outlier.level.label}: {outlier.reason}")
    return with_provenance(result, base_profile, [run])


def given(path: str) -> Profile:
    return _load(path, "--profile")


def with_datasets(profile: Profile, lengths: dict[str, dict[int, float]], source: str) -> Profile:
    """`profile` with acceptance phase NAME for each dataset: the per-position rates whose
    chain gives its accept lengths (`specctl sim fit`'s reading of a bench's)."""
    deepest = max(max(profile.captured_depths), 1)
    phases = dict(profile.acceptance.phases)
    for name, per_depth in lengths.items():
        phases[name] = acceptance_rates(per_depth, deepest)
    described = ", ".join(
        f"{n} ({', '.join(f'd{d} {v:.3f}' for d, v in sorted(lengths[n].items()))})"
        for n in sorted(lengths)
    )
    data = profile.model_dump()
    data["acceptance"] = {"phases": phases, "default_phase": profile.acceptance.default_phase}
    # a profile this wrote before (given again with --profile) keeps one such line
    kept = [line for line in profile.sources if not line.startswith(SOURCE_LINE)]
    data["sources"] = [*kept, f"{SOURCE_LINE}, from the accept lengths per depth in {source}: "
                       f"{described}"]
    try:
        return Profile.model_validate(data)
    except ValueError as err:
        raise SimTraceError(f"the accept lengths of {source}: {err}") from None


def written(profile: Profile, path: Path) -> Profile:
    """`profile` written to `path` as `specctl sim fit` writes one, and read back."""
    try:
        write_profile(profile, path)
    except OSError as err:
        raise SimTraceError(f"{path}: cannot write it ({err.strerror or err})") from None
    return _load(str(path), "the profile written")
