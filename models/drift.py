"""Change-point detection on measured acceptance: when did the workload last change?

The acceptance posterior keeps a memory of its evidence (`acceptance_half_life_s`). A memory
long enough to make the depths the server rarely runs certain (and so to stop probing them) is
far too long to follow a change of workload: the stale evidence of those depths would outvote
the fresh evidence of the running one for several half-lives, and the table would swing between
depths while it all decays. So the memory is cut instead: a change of the accepted drafts per
request-step of any depth, detected from the counters themselves, makes the acceptance fit
forget everything before it (`Learner.fit`), and depths without fresh evidence fall back to the
cross-depth chain prior, which the running depth's fresh counters move at once.

The test, per depth, on the series of scrape intervals (accepted drafts A_i over request-steps
N_i): for every split of the series, the difference of the pooled rates before and after in
units of its standard error, the per-interval variance estimated from the series itself
(`s^2 / N_i`, s^2 the pooled within-side dispersion: it absorbs the over-dispersion of
requests whose difficulty persists across intervals). A split counts when that z exceeds
`z_threshold` and the rates differ by at least `min_shift` of the accept length (smaller shifts
do not move a table). Splits are searched left to right (binary segmentation of the right
part): the result is the start of the last segment, the time since which acceptance has been
stationary (`t`: the depth's last interval before the split). A depth that did not run for a
while (the table moved away from it, or the load did) says only that the change came somewhere
in that gap, up to the scrape before its first interval after the split (`gap_end`); the other
depths' evidence from the gap may be the old workload's or the new one's, and the learner
judges it depth by depth (`Learner.fit`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_SIDE_INTERVALS = 3  # scrape intervals each side of a split needs (one interval is noise)
MAX_SPLITS = 8  # segments searched from the left; more changes in one history are merged


@dataclass(frozen=True)
class ChangePoint:
    t: float  # acceptance evidence with t_end > t is current
    depth: int  # the depth whose counters showed it
    before: float  # accepted drafts per request-step before / after
    after: float
    z: float
    # the scrape before the depth's first interval after the change: the change came in
    # (t, gap_end]; None (a state stored before it existed): t
    gap_end: float | None = None


def interval_series(
    t_end: np.ndarray, depth: np.ndarray, tokens: np.ndarray, request_steps: np.ndarray, d: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(interval end times, accepted drafts, request-steps) of depth `d`, summed over buckets."""
    m = depth == d
    if not np.any(m):
        return np.zeros(0), np.zeros(0), np.zeros(0)
    times, inv = np.unique(t_end[m], return_inverse=True)
    accepted = np.bincount(inv, weights=tokens[m] - request_steps[m], minlength=times.size)
    steps = np.bincount(inv, weights=request_steps[m], minlength=times.size)
    return times, accepted, steps


def best_split(
    accepted: np.ndarray, steps: np.ndarray, min_shift: float
) -> tuple[int, float, float, float] | None:
    """(index of the first interval after the split, z, rate before, rate after) of the most
    significant material split, or None when there are too few intervals."""
    n = steps.size
    if n < 2 * MIN_SIDE_INTERVALS:
        return None
    rate = np.divide(accepted, steps, out=np.zeros(n), where=steps > 0)
    c_n = np.cumsum(steps)
    c_a = np.cumsum(accepted)
    c_q = np.cumsum(steps * rate**2)  # sum N_i r_i^2, for the within-side dispersion
    k = np.arange(MIN_SIDE_INTERVALS, n - MIN_SIDE_INTERVALS + 1)  # split before interval k
    nb, ab, qb = c_n[k - 1], c_a[k - 1], c_q[k - 1]
    na, aa, qa = c_n[-1] - nb, c_a[-1] - ab, c_q[-1] - qb
    ok = (nb > 0) & (na > 0)
    if not np.any(ok):
        return None
    k, nb, ab, qb, na, aa, qa = (x[ok] for x in (k, nb, ab, qb, na, aa, qa))
    rb, ra = ab / nb, aa / na
    # Pooled dispersion: sum N_i (r_i - mean_side)^2 over both sides, per degree of freedom.
    ss = np.maximum(qb - nb * rb**2, 0.0) + np.maximum(qa - na * ra**2, 0.0)
    s2 = ss / max(n - 2, 1)
    floor = 1e-6 * np.maximum(rb, ra)  # a noise-free series still needs a finite z
    se = np.sqrt(np.maximum(s2, floor) * (1.0 / nb + 1.0 / na))
    z = np.abs(ra - rb) / se
    # Accept length L = 1 + m: a shift must move it by min_shift to matter for a table.
    material = np.abs(ra - rb) >= min_shift * (1.0 + np.maximum(rb, ra))
    z = np.where(material, z, 0.0)
    i = int(np.argmax(z))
    if z[i] <= 0.0:
        return None
    return int(k[i]), float(z[i]), float(rb[i]), float(ra[i])


def last_change(
    t_end: np.ndarray,
    depth: np.ndarray,
    tokens: np.ndarray,
    request_steps: np.ndarray,
    depths: list[int],
    z_threshold: float,
    min_shift: float,
) -> ChangePoint | None:
    """The latest acceptance change over all depths (None: stationary over the history)."""
    scrapes = np.unique(t_end)  # every interval end of any depth: the scrapes
    found: ChangePoint | None = None
    for d in depths:
        if d == 0:
            continue
        times, accepted, steps = interval_series(t_end, depth, tokens, request_steps, d)
        start = 0
        for _ in range(MAX_SPLITS):
            split = best_split(accepted[start:], steps[start:], min_shift)
            if split is None or split[1] < z_threshold:
                break
            k, z, before, after = split
            start += k
            # the gap: up to the scrape before this depth's first interval after the split
            i = int(np.searchsorted(scrapes, times[start], side="left"))
            cp = ChangePoint(float(times[start - 1]), d, before, after, z,
                             gap_end=float(max(scrapes[i - 1], times[start - 1])))
            if found is None or cp.t > found.t:
                found = cp
    return found
