"""The plan's rule: which candidate serves each kind, from their verification and timings.

Every candidate of a kind (speedlight/candidates: speedlight's kernels, torch's fused
functions, Liger's, SDPA's backends, the compiled region...) that the model's variant
admits is run on the kind's unit at the model's shapes and judged against float64 (verify's
rule, the model's own error as yardstick); one that fails is excluded with its error ratio.
Each admitted candidate's time ratio is its median time over the model's own on the same
unit; its 95% interval comes from bench's statistics: each median's relative standard error
(the order-statistic interval, stats.median_rse), combined on the log scale,
ratio * exp(+-1.96 * sqrt(rse_a^2 + rse_b^2)).

  time kinds    the fastest admitted candidate whose interval lies below 1 with a gain of
                at least GAIN (2%); none such: the model's own stays (every candidate slower
                with confidence, or a tie: an interval holding 1, or a gain too small)
  memory kinds  (the fused loss, whose point is the logits it never makes) the fastest
                admitted candidate unless its interval lies above 1 + MEMORY_MARGIN: slower
                by more than 10% with confidence
  dependents    decoder_layer is timed as the whole layer with speedlight's rms_norm and the
                fusion against the layer with speedlight's rms_norm alone, and is dropped
                unless rms_norm chose speedlight; linear_cross_entropy is timed against the
                loss that stays (cross_entropy's choice)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from speedlight.bench.stats import Z95, summarize
from speedlight.plans import Decision

GAIN = 0.02
MEMORY_MARGIN = 0.10
MEMORY_KINDS = ("linear_cross_entropy",)
DEPENDS = {"decoder_layer": "rms_norm"}  # kind -> the kind it is timed on top of
AGAINST = {"linear_cross_entropy": "cross_entropy"}  # kind -> the kind its baseline follows
MODEL = "model"
SPEEDLIGHT = "speedlight"
# a candidate's status in a plan (plans.CANDIDATE_STATUSES); offered: installable, not run
ADMITTED, EXCLUDED, NOT_OFFERED, CHOSEN = "admitted", "excluded", "not offered", "chosen"
OFFERED = "offered"


@dataclass
class Timing:
    """One side of a trial: seconds per call (forward and backward), and the peak memory."""

    samples: list[float]
    peak: int | None = None

    @property
    def median(self) -> float:
        return summarize(self.samples).median


@dataclass
class Tried:
    """One candidate of a kind, as the trial left it: admitted (verified, and timed when a
    timer ran), excluded (failed verification or raised, with why and its error ratio) or
    not offered (it has no form of the model's variant, or cannot run here)."""

    name: str
    status: str
    reason: str = ""
    timing: Timing | None = None
    error_ratio: float | None = None


@dataclass
class KindTrial:
    """A kind measured: the model's own (timed, the yardstick) and every candidate."""

    kind: str
    model: Timing | None
    tried: list[Tried] = field(default_factory=list)
    module: str = ""
    ran: bool = False  # the model's own unit ran (the yardstick of verification)


def ratio_interval(ours: Timing, theirs: Timing) -> tuple[float, float, float]:
    """(ratio, low, high): ours / theirs by medians, and its 95% interval."""
    a, b = summarize(ours.samples), summarize(theirs.samples)
    ratio = a.median / b.median
    spread = Z95 * math.sqrt(a.rse_median ** 2 + b.rse_median ** 2)
    return ratio, ratio * math.exp(-spread), ratio * math.exp(spread)


def _rows(trial: KindTrial, base: Timing | None) -> list[dict]:
    """Every candidate as the plan records it, with its ratio to `base` where timed."""
    rows = []
    if trial.model is not None or trial.ran:
        timed = trial.model is not None
        rows.append({"name": MODEL, "status": ADMITTED, "reason": "the model's own",
                     "median_s": trial.model.median if timed else None, "ratio": None,
                     "low": None, "high": None, "peak": trial.model.peak if timed else None,
                     "error_ratio": None})
    for t in trial.tried:
        row = {"name": t.name, "status": t.status, "reason": t.reason, "median_s": None,
               "ratio": None, "low": None, "high": None, "peak": None,
               "error_ratio": t.error_ratio}
        if t.timing is not None and base is not None:
            ratio, low, high = ratio_interval(t.timing, base)
            row |= {"median_s": t.timing.median, "ratio": ratio, "low": low, "high": high,
                    "peak": t.timing.peak}
        rows.append(row)
    return rows


def decide(trial: KindTrial, against: Timing | None = None, against_name: str = "") -> Decision:
    """The verdict on one kind (see the module docstring); `against`: the timing the
    candidates are held to when it is not the model's own unit (the loss that stays, named
    against_name)."""
    purpose = "memory" if trial.kind in MEMORY_KINDS else "time"
    base = against or trial.model
    rows = _rows(trial, base)
    if against is not None and rows and rows[0]["name"] == MODEL:
        rows[0]["reason"] += f"; ratios are to the loss that stays ({against_name})"
    admitted = [r for r in rows if r["status"] == ADMITTED and r["name"] != MODEL]
    out = Decision(trial.kind, "dropped", "", purpose, module=trial.module,
                   choice=MODEL, candidates=rows)
    if base is None or not all(r["ratio"] is not None for r in admitted):
        counts = {s: sum(r["status"] == s for r in rows if r["name"] != MODEL)
                  for s in (ADMITTED, EXCLUDED, OFFERED, NOT_OFFERED)}
        said = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        return replace(out, verdict="unmeasured", choice=None,
                       reason=f"nothing timed; candidates: {said or 'none'}")
    if not admitted:
        failed = [r for r in rows if r["status"] == EXCLUDED]
        return _set(out, rows, MODEL, f"no candidate passed verification{_first(failed)}: the "
                                      "model's own stays")
    fastest = min(admitted, key=lambda r: r["median_s"])
    numbers = _numbers(fastest, base)
    if purpose == "memory":
        if fastest["low"] > 1 + MEMORY_MARGIN:
            return _set(replace(out, **numbers), rows, MODEL,
                        f"the fastest fused loss ({fastest['name']}) is slower by more than "
                        f"{MEMORY_MARGIN:.0%} with confidence, which its memory saving does "
                        "not buy")
        return _set(replace(out, verdict="kept", **numbers), rows, fastest["name"],
                    f"{fastest['name']} kept for memory{_peaks(fastest, base)} (dropped only "
                    f"when slower by > {MEMORY_MARGIN:.0%})")
    faster = [r for r in admitted if r["high"] < 1 and r["ratio"] <= 1 - GAIN]
    if faster:
        best = min(faster, key=lambda r: r["median_s"])
        return _set(replace(out, verdict="kept", **_numbers(best, base)), rows, best["name"],
                    f"{best['name']} faster with confidence, {1 - best['ratio']:.1%} gain")
    if all(r["low"] > 1 for r in admitted):
        return _set(replace(out, **numbers), rows, MODEL, "every candidate slower with "
                                                          "confidence: the model's own stays")
    return _set(replace(out, **numbers), rows, MODEL,
                f"no candidate with a confident gain of at least {GAIN:.0%} (a tie keeps the "
                "model's own)")


def _numbers(row: dict, base: Timing) -> dict:
    return {"ratio": row["ratio"], "low": row["low"], "high": row["high"],
            "ours_s": row["median_s"], "theirs_s": base.median, "ours_peak": row["peak"],
            "theirs_peak": base.peak, "verified": True}


def _set(decision: Decision, rows: list[dict], choice: str, reason: str) -> Decision:
    for r in rows:
        if r["name"] == choice:
            r["status"] = CHOSEN
    return replace(decision, choice=choice, reason=reason)


def _first(failed: list[dict]) -> str:
    return f" ({failed[0]['name']}: {failed[0]['reason']})" if failed else ""


def _peaks(row: dict, base: Timing) -> str:
    if row["peak"] is None or base.peak is None:
        return ""
    return f", peak {row['peak'] / 2**20:.0f} MiB against {base.peak / 2**20:.0f} MiB"


def chosen_timing(trial: KindTrial, decision: Decision) -> Timing | None:
    """The timing of the candidate a decision chose (the model's own when it chose none)."""
    for t in trial.tried:
        if t.name == decision.choice:
            return t.timing
    return trial.model


def decide_all(trials: dict[str, KindTrial]) -> dict[str, Decision]:
    """Every trial's verdict, dependent kinds decided after the kinds they depend on."""
    out: dict[str, Decision] = {}
    order = sorted(trials, key=lambda k: k in DEPENDS or k in AGAINST)
    for kind in order:
        trial = trials[kind]
        against, against_name = None, ""
        if kind in AGAINST and AGAINST[kind] in out:
            other = AGAINST[kind]
            against = chosen_timing(trials[other], out[other])
            against_name = f"{other}: {out[other].choice}"
        decision = decide(trial, against, against_name)
        needs = DEPENDS.get(kind)
        if needs in out and decision.verdict == "kept" and out[needs].choice != SPEEDLIGHT:
            decision = replace(decision, verdict="dropped", choice=MODEL,
                               reason=f"it fuses speedlight's {needs}, and {needs} chose "
                                      f"{out[needs].choice} ({decision.reason})")
            for r in decision.candidates:
                r["status"] = CHOSEN if r["name"] == MODEL else (
                    ADMITTED if r["status"] == CHOSEN else r["status"])
        out[kind] = decision
    return {k: out[k] for k in trials}
