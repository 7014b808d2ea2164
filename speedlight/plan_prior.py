"""The plan prior shipped in the package: per GPU architecture and kind of patch, whether
speedlight's kernel measured faster than what the model runs without it.

speedlight/tuned/plan-prior.json, written by speedlight.planning.prior from the rows under
benchmarks/results/ (never by hand; a test holds the file to what the code writes):
  {"format": 1, "written_by": "...", "archs": {"sm_90": {
      "device": "NVIDIA H200", "sku": "h200", "runs": [...], "date": "2026-12-04",
      "git": [...], "kinds": {"attention": {"verdict": "dropped", "ratio": 1.2,
          "against": "sdpa-flash", "fastest": "sdpa-cudnn", "cases": 1, "mode": "fwd+bwd",
          "candidates": {"sdpa-cudnn": 0.53, ...}, "reason": "..."}, ...}}}}
patch(plan="auto") on a GPU with no cached plan applies the prior of its architecture, or
of the nearest measured one (said so): a kind speedlight measured slower there is not
applied unless asked for by name (patch(model, attention="speedlight")) or plan=None.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch

from speedlight.plans import KINDS, VERDICTS, Decision, Plan, PlanWarning, identity

PRIOR_PATH = Path(__file__).resolve().parent / "tuned" / "plan-prior.json"
PRIOR_FORMAT = 1


def arch_of(device: torch.device) -> str | None:
    """The architecture a prior is keyed by: sm_90 for compute capability 9.0, the gfx name
    on an AMD GPU; None on a CPU."""
    if device.type != "cuda":
        return None
    if getattr(torch.version, "hip", None):
        return torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def load_prior(path: str | os.PathLike = PRIOR_PATH) -> dict | None:
    """The shipped prior, or None (with a PlanWarning naming what is wrong) when the file is
    missing or not a prior of PRIOR_FORMAT."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        warnings.warn(f"speedlight: the plan prior {str(path)!r} cannot be read ({e}); no prior "
                      "applies", PlanWarning, stacklevel=2)
        return None
    ok = (isinstance(doc, dict) and doc.get("format") == PRIOR_FORMAT
          and isinstance(doc.get("archs"), dict)
          and all(isinstance(a, dict) and isinstance(a.get("kinds"), dict)
                  and all(isinstance(k, dict) and k.get("verdict") in VERDICTS
                          and kind in KINDS for kind, k in a["kinds"].items())
                  for a in doc["archs"].values()))
    if not ok:
        warnings.warn(f"speedlight: the plan prior {str(path)!r} is not a prior of format "
                      f"{PRIOR_FORMAT}; no prior applies", PlanWarning, stacklevel=2)
        return None
    return doc


def _sm(arch: str) -> int | None:
    return int(arch[3:]) if arch.startswith("sm_") and arch[3:].isdigit() else None


def nearest_arch(arch: str, measured) -> str | None:
    """`arch` if measured, else the nearest measured NVIDIA architecture by compute
    capability (the lower one on a tie); None for an AMD arch none of whose kind is
    measured."""
    if arch in measured:
        return arch
    here = _sm(arch)
    if here is None:
        return None
    known = [(abs(_sm(a) - here), _sm(a), a) for a in measured if _sm(a) is not None]
    return min(known)[2] if known else None


def prior_summary(doc: dict | None) -> str:
    """Where the prior comes from, for a note: each architecture's device, date and runs."""
    if not doc:
        return "no prior is shipped"
    return "; ".join(f"{arch}: {a.get('device')}, {a.get('date')} ({', '.join(a.get('runs', []))})"
                     for arch, a in sorted(doc["archs"].items()))


def prior_plan(model: torch.nn.Module, arch: str | None,
               doc: dict | None = None) -> tuple[Plan | None, str]:
    """The plan the shipped prior gives `model` on a GPU of `arch` (the nearest measured
    architecture's when `arch` has none), and a note saying whose; (None, why) without."""
    doc = load_prior() if doc is None else doc
    if arch is None or not doc:
        return None, "no prior applies" if doc else "no prior is shipped"
    used = nearest_arch(arch, doc["archs"])
    if used is None:
        return None, f"the prior measured no architecture near {arch} ({prior_summary(doc)})"
    entry = doc["archs"][used]
    where = f"{used}: {entry.get('device')}, {entry.get('date')}"
    note = (f"the prior measured on {where}" if used == arch else
            f"the prior of the nearest measured architecture, {where} (none measured on {arch})")
    decisions = {}
    for kind, k in entry["kinds"].items():
        choice = None if k["verdict"] == "unmeasured" else (
            "speedlight" if k["verdict"] == "kept" else "model")
        decisions[kind] = Decision(kind, k["verdict"], f"{k.get('reason', '')} ({note})",
                                   ratio=k.get("ratio"), choice=choice, module="prior")
    key = dict(identity(model), autocast=None, batch=1, seq=1, compile="eager")
    return Plan(key, decisions, True, note, origin="prior"), note
