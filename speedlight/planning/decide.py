"""The plan's rule: which kinds to keep, from their timings and their verification.

A kind's time ratio is speedlight's median time over the original's on the same unit (a
module's forward and backward as the model runs it). Its 95% interval comes from bench's
statistics: each median's relative standard error (the order-statistic interval,
stats.median_rse), combined on the log scale, ratio * exp(+-1.96 * sqrt(rse_a^2 + rse_b^2)).

  time kinds    kept when they verified and the interval lies below 1 with a gain of at
                least GAIN (2%); otherwise the original stays: slower with confidence, or
                a tie (an interval holding 1, or a gain too small to matter)
  memory kinds  (the fused loss, whose point is the logits it never makes) kept when they
                verified unless the interval lies above 1 + MEMORY_MARGIN: slower by more
                than 10% with confidence
  dependents    decoder_layer is timed as the whole layer with rms_norm and the fusion
                against the layer with rms_norm alone, and is dropped with rms_norm;
                linear_cross_entropy is timed against the loss that stays (speedlight's
                cross_entropy when that was kept, else the original)
A kind that failed verification is dropped whatever its time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from speedlight.bench.stats import Z95, summarize
from speedlight.plans import Decision

GAIN = 0.02
MEMORY_MARGIN = 0.10
MEMORY_KINDS = ("linear_cross_entropy",)
DEPENDS = {"decoder_layer": "rms_norm"}  # kind -> the kind it is timed on top of
AGAINST = {"linear_cross_entropy": "cross_entropy"}  # kind -> the kind its baseline follows


@dataclass
class Timing:
    """One side of a trial: seconds per call (forward and backward), and the peak memory."""

    samples: list[float]
    peak: int | None = None

    @property
    def median(self) -> float:
        return summarize(self.samples).median


@dataclass
class Trial:
    """A kind measured: speedlight (ours) against what it replaces (theirs)."""

    kind: str
    ours: Timing
    theirs: Timing
    verified: bool
    why: str = ""  # the verification's failure, if any
    module: str = ""


def ratio_interval(ours: Timing, theirs: Timing) -> tuple[float, float, float]:
    """(ratio, low, high): ours / theirs by medians, and its 95% interval."""
    a, b = summarize(ours.samples), summarize(theirs.samples)
    ratio = a.median / b.median
    spread = Z95 * math.sqrt(a.rse_median ** 2 + b.rse_median ** 2)
    return ratio, ratio * math.exp(-spread), ratio * math.exp(spread)


def decide(trial: Trial) -> Decision:
    """The verdict on one trial (see the module docstring)."""
    purpose = "memory" if trial.kind in MEMORY_KINDS else "time"
    base = Decision(trial.kind, "dropped", "", purpose, verified=trial.verified,
                    module=trial.module, ours_peak=trial.ours.peak,
                    theirs_peak=trial.theirs.peak)
    if not trial.verified:
        return replace(base, reason=f"failed verification: {trial.why}")
    ratio, low, high = ratio_interval(trial.ours, trial.theirs)
    base = replace(base, ratio=ratio, low=low, high=high, ours_s=trial.ours.median,
                   theirs_s=trial.theirs.median)
    if purpose == "memory":
        if low > 1 + MEMORY_MARGIN:
            return replace(base, reason=f"slower by more than {MEMORY_MARGIN:.0%} with "
                                        "confidence, which its memory saving does not buy")
        return replace(base, verdict="kept", reason=f"kept for memory{_peaks(base)} (dropped "
                                                    f"only when slower by > {MEMORY_MARGIN:.0%})")
    if high < 1 and ratio <= 1 - GAIN:
        return replace(base, verdict="kept", reason=f"faster with confidence, {1 - ratio:.1%} "
                                                    "gain")
    if low > 1:
        return replace(base, reason="slower with confidence: the original stays")
    return replace(base, reason=f"no confident gain of at least {GAIN:.0%} (a tie keeps the "
                                "original)")


def _peaks(d: Decision) -> str:
    if d.ours_peak is None or d.theirs_peak is None:
        return ""
    return f", peak {d.ours_peak / 2**20:.0f} MiB against {d.theirs_peak / 2**20:.0f} MiB"


def decide_all(trials: dict[str, Trial]) -> dict[str, Decision]:
    """Every trial's verdict, dependent kinds decided after the kinds they depend on."""
    out: dict[str, Decision] = {}
    for kind, trial in trials.items():
        if kind in AGAINST:
            other = AGAINST[kind]
            if other in trials:
                first = out.get(other) or decide(trials[other])
                if first.verdict == "kept":
                    trial = replace(trial, theirs=trials[other].ours)
        decision = decide(trial)
        needs = DEPENDS.get(kind)
        if needs is not None and needs in trials and decision.verdict == "kept":
            first = out.get(needs) or decide(trials[needs])
            if first.verdict != "kept":
                decision = replace(decision, verdict="dropped",
                                   reason=f"it fuses the norm {needs} patches, which was "
                                          f"dropped ({decision.reason})")
        out[kind] = decision
    return out
