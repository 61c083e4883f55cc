"""Write a fitted profile as a YAML file `load_profile` reads back (comments say where from)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from sims.fit.bench_file import BenchRun
from sims.fit.fitting import FitResult
from sims.fit.params import PARAMS
from sims.fit.replay import PHASE
from sims.fit.shape_fit import ShapeFit
from sims.fit.shape_folder import ShapeBench
from sims.profile import Profile


def _tidy(value: Any) -> Any:
    """Floats to 4 significant digits (a fit is not more precise), recursively; what a bound
    held at zero ends as (1e-9) to 0."""
    if isinstance(value, float) and math.isfinite(value):
        return 0.0 if abs(value) < 1e-6 else float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _tidy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tidy(v) for v in value]
    return value


def with_provenance(result: FitResult, base: Profile, runs: Sequence[BenchRun]) -> Profile:
    """The fitted profile with a description and sources that say what was fitted to what."""
    spec = runs[0].spec
    server = spec.model or "the server"
    version = f" (SGLang {spec.version})" if spec.version else ""
    benches = ", ".join(run.path for run in runs)
    fitted = ", ".join(result.keys)
    kept = sorted(k for k in PARAMS if k not in result.keys)
    sources = [
        f"Fitted by specctl sim fit to {benches}: {server}{version}, {len(result.levels)} levels",
        f"Fitted fields: {fitted}",
        "From the servers' /server_info: running-request caps, KV pool, prefill budget, context "
        "length, captured depths",
        f"Acceptance phase '{PHASE}': the accept length per depth the bench measured; the other "
        f"phases and every field not fitted ({', '.join(kept)}, and the rest) keep the base "
        f"profile {base.name}'s values",
    ]
    return result.profile.model_copy(
        update={
            "description": f"{server}{version}, fitted to a specctl bench run",
            "sources": sources,
        }
    )


def with_shape_provenance(fit: ShapeFit, bench: ShapeBench, base: Profile) -> Profile:
    """The profile with shapes fitted in, its sources saying what they were fitted to."""
    spec = next(f for s, f in bench.facts.items() if s != "plain")
    server = spec.model or "the server"
    version = f" (SGLang {spec.version})" if spec.version else ""
    sources = [
        *base.sources,
        f"Draft shapes fitted by specctl sim fit --shapes to {bench.folder}: {server}{version}, "
        f"shapes {', '.join(bench.shapes)}, families {', '.join(bench.families)}, "
        f"{len(fit.fitted)} levels ({len(fit.left_out)} the bench flagged or left unfinished "
        "left out)",
        "Per shape: fixed_ms and us_per_position, its iteration beyond the cost model at the "
        "shape, fitted to the servers' inter-token latency replayed with the bench's protocol; "
        "accept_length per family as SGLang counted it",
        "From the shapes' servers' /server_info: running-request caps, KV pool, prefill budget, "
        f"context length; every other field keeps {base.name}'s values",
    ]
    return fit.profile.model_copy(update={
        "description": f"{base.description.rstrip('.')}; draft shapes fitted to {bench.folder}",
        "sources": sources,
    })  # fmt: skip


def write_profile(profile: Profile, path: Path) -> None:
    data = _tidy(profile.model_dump(mode="json"))
    for key in ("shapes", "static_shape"):  # a depth-only profile reads as it always did
        if data.get(key) is None:
            data.pop(key, None)
    header = (
        f"# {profile.name}: a simulator profile fitted by `specctl sim fit`.\n"
        "# Use it like any profile: specctl sim sweep --profile THIS_FILE, specctl sim serve ...\n"
    )
    path.write_text(header + yaml.safe_dump(data, sort_keys=False, width=100))
