"""Bring a depth's acceptance evidence up to date with the depth that is running now.

After a change of workload the batch keeps changing for a while: requests that arrived before
the change finish first, a queue drains, a blend of two workloads moves. The change-point test
cuts the evidence at the start of the change, but a depth that ran early in the transition and
then stopped (the table moved away from it, or it was only probed since) keeps a large block of
evidence from that moment: its accept length is the workload's of two minutes ago, and with
hundreds of thousands of request-steps it outweighs the chain prior that the running depth
keeps current. The table then judges that depth on a workload that is gone (h100 x double-drift:
depth 4 kept the accept length of the blend, 4% below the code workload's, and the table stayed
on depth 3 for six minutes after the load spike).

The fix uses the chain model's own structure: a workload changes the level q of the per-position
acceptance, the decay rho much less. The running depth r, measured in every scrape interval,
gives q at every moment: solve chain_accepted(q, rho, r) = its accepted drafts per request-step
(a few intervals pooled). A sample of another depth d taken when the level was q_then is then
rescaled to the level now:

    accepted_d  *=  chain_accepted(q_now, rho, d) / chain_accepted(q_then, rho, d)

so evidence from early in a transition counts as what it implies about depth d today. Depth 0
has no drafts; samples from before the running depth's first interval are left as they are.
"""

from __future__ import annotations

import numpy as np

from models.acceptance import chain_accepted
from models.drift import interval_series

_Q_GRID = np.linspace(0.005, 0.995, 397)
SMOOTH_S = 30.0  # pool the running depth's intervals over this long (one interval is noisy)
MAX_FACTOR = 2.0  # a rescaling beyond x2 (or /2) is not a level shift: leave it bounded


def level_at(rate: np.ndarray, depth: int, rho: float) -> np.ndarray:
    """The chain level q whose depth-`depth` chain accepts `rate` drafts per request-step."""
    curve = chain_accepted(_Q_GRID, rho, depth)  # increasing in q
    return np.interp(rate, curve, _Q_GRID)


def rescale_to_now(
    arrays: dict[str, np.ndarray],
    reference: int,
    rho: float,
    now: float,
) -> dict[str, np.ndarray]:
    """`arrays` (see models.evidence.sample_arrays) with the accepted drafts of every depth but
    `reference` rescaled to the acceptance level the reference depth shows now."""
    times, accepted, steps = interval_series(
        arrays["t_end"], arrays["depth"], arrays["tokens"], arrays["request_steps"], reference
    )
    if times.size < 2 or reference <= 0:
        return arrays
    # Pool each interval with the ones before it within SMOOTH_S: a rate per moment, less noisy,
    # and never mixed with what came after (a sample from just before a shift keeps its level).
    lo = np.searchsorted(times, times - SMOOTH_S, side="right")
    hi = np.searchsorted(times, times, side="right")
    c_acc = np.concatenate([[0.0], np.cumsum(accepted)])
    c_steps = np.concatenate([[0.0], np.cumsum(steps)])
    pooled_steps = c_steps[hi] - c_steps[lo]
    ok = pooled_steps > 0
    if not np.any(ok):
        return arrays
    rates = (c_acc[hi] - c_acc[lo])[ok] / pooled_steps[ok]
    t_ok = times[ok]
    q_then_ref = level_at(rates, reference, rho)
    recent = times > now - 2 * SMOOTH_S
    if not np.any(recent) or steps[recent].sum() <= 0:
        return arrays
    q_now = float(
        level_at(np.asarray([accepted[recent].sum() / steps[recent].sum()]), reference, rho)[0]
    )
    out = dict(arrays)
    tokens = arrays["tokens"].astype(float).copy()
    depth = arrays["depth"]
    others = (depth != reference) & (depth > 0) & (arrays["t_end"] >= t_ok[0])
    if not np.any(others):
        return arrays
    q_then = np.interp(arrays["t_end"][others], t_ok, q_then_ref)
    for d in np.unique(depth[others]):
        m = depth[others] == d
        factor = chain_accepted(q_now, rho, int(d)) / np.maximum(
            chain_accepted(q_then[m], rho, int(d)), 1e-6
        )
        factor = np.clip(factor, 1.0 / MAX_FACTOR, MAX_FACTOR)
        idx = np.flatnonzero(others)[m]
        drafts = tokens[idx] - arrays["request_steps"][idx]
        # A request-step accepts at most d drafts: keep the sample valid.
        tokens[idx] = arrays["request_steps"][idx] + np.minimum(
            drafts * factor, arrays["request_steps"][idx] * d
        )
    out["tokens"] = tokens
    return out
