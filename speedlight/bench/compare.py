"""`bench compare OLD NEW`: which cases got slower, and only where the data says so.

A case is a regression when both
  * its median latency grew by more than the threshold (default 5%), and
  * the growth is significant: a one-sided Mann-Whitney U test on the raw samples of the
    two runs gives p < alpha (default 0.01: at most a 1-in-100 chance per case that noise
    alone flags it).
Either alone is not enough: a 6% median shift inside noisy samples is not a regression,
and a significant 1% shift is below what a team would act on. Improvements are judged by
the mirror rule. Rows are matched on (op, implementation, case, mode); when a file holds
several runs, the last row of each key is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from speedlight import results
from speedlight.bench import stats

DEFAULT_THRESHOLD = 0.05
DEFAULT_ALPHA = 0.01


@dataclass
class Comparison:
    op: str
    implementation: str
    case_id: str
    mode: str
    verdict: str  # regression | improvement | unchanged | not comparable | only in old | only in new
    old_us: float | None = None
    new_us: float | None = None
    change: float | None = None  # new median / old median - 1
    p_value: float | None = None  # of the one-sided test in the direction of the change
    note: str = ""


def bench_files(path: str | Path) -> list[Path]:
    """A results file, or the bench*.jsonl files under a folder."""
    path = Path(path)
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*.jsonl") if p.name.startswith("bench"))
    raise FileNotFoundError(f"no results file or folder at {str(path)!r}")


def load_bench_rows(paths: str | Path | Iterable[str | Path]) -> list[dict]:
    if isinstance(paths, (str, Path)):
        paths = [paths]
    rows = []
    for p in paths:
        for f in bench_files(p):
            rows += [r for r in results.read_jsonl(f) if r.get("tool") == "bench"]
    return rows


def _key(r: dict) -> tuple:
    return (r["op"], r["implementation"], r["case_id"], r["mode"])


def latest(rows: Sequence[dict]) -> dict[tuple, dict]:
    """The newest row of each (op, implementation, case, mode), by timestamp (files of
    several runs are read in path order, which says nothing of when they ran)."""
    out: dict[tuple, dict] = {}
    for r in sorted(rows, key=lambda r: r.get("timestamp") or ""):
        out[_key(r)] = r
    return out


def compare(old_rows: Sequence[dict], new_rows: Sequence[dict], *,
            threshold: float = DEFAULT_THRESHOLD, alpha: float = DEFAULT_ALPHA,
            implementations: Sequence[str] | None = ("speedlight",)) -> list[Comparison]:
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    old, new = latest(old_rows), latest(new_rows)
    keys = [k for k in dict.fromkeys([*old, *new])
            if implementations is None or k[1] in implementations]
    out = []
    for key in keys:
        o, n = old.get(key), new.get(key)
        if o is None or n is None:
            out.append(Comparison(*key, "only in new" if o is None else "only in old"))
            continue
        out.append(_judge(key, o, n, threshold, alpha))
    return out


def _judge(key: tuple, o: dict, n: dict, threshold: float, alpha: float) -> Comparison:
    if o.get("status") != "ok" or n.get("status") != "ok":
        why = "; ".join(f"{side} {r.get('status')}: {r.get('reason')}"
                        for side, r in (("old", o), ("new", n)) if r.get("status") != "ok")
        return Comparison(*key, "not comparable", o.get("median_us"), n.get("median_us"), note=why)
    a, b = o.get("samples_us") or [], n.get("samples_us") or []
    if not a or not b:
        return Comparison(*key, "not comparable", o["median_us"], n["median_us"],
                          note="raw samples missing")
    change = n["median_us"] / o["median_us"] - 1.0
    c = Comparison(*key, "unchanged", o["median_us"], n["median_us"], change)
    if change > 0:
        c.p_value = stats.slower_p_value(a, b)
        if change > threshold:
            if c.p_value < alpha:
                c.verdict = "regression"
            else:
                c.note = f"slower, but not significant at alpha={alpha:g}"
    else:
        c.p_value = stats.faster_p_value(a, b)
        if -change > threshold and c.p_value < alpha:
            c.verdict = "improvement"
    if o.get("device") != n.get("device"):
        c.note = (c.note + "; " if c.note else "") + f"devices differ: {o.get('device')} vs {n.get('device')}"
    return c


def regressions(comparisons: Sequence[Comparison]) -> list[Comparison]:
    return [c for c in comparisons if c.verdict == "regression"]
