"""A patch plan: which of speedlight.patch's kinds measured faster on this GPU at this
model's shapes, as data: its JSON form, its key, and where it is cached.

`speedlight plan` (speedlight/planning/, a composer) measures and writes a plan;
`speedlight.patch(model, plan=...)` (patching, a tool) reads one through this module and
never imports the composer. A plan is a JSON document:

  key        what it was measured for (key_for): the model's configuration (a digest of
             its config), the GPU (torch's device name), the versions of torch, triton,
             transformers and speedlight, the dtype and autocast, the batch x sequence
             bucket (powers of two), the compile mode and the attention implementation
  decisions  per kind: verdict (kept | dropped | unmeasured), why, and the numbers (the
             time ratio speedlight / original and its 95% interval, each side's median
             time and peak memory, whether it verified)
  timed      False when nothing was timed (no GPU): every kind is then unmeasured and
             patch applies today's defaults
  projected  without a GPU, the projected floors `profile --project` gives (labelled so)

A cached plan is used by patch(plan="auto") only when its identity (everything in the key
but the bucket and compile mode, which patch cannot see) matches the model and machine
patch runs on; a plan from other versions or another GPU is stale and ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from speedlight import hardware, results

SCHEMA = 1
VERDICTS = ("kept", "dropped", "unmeasured")
# what patch(plan="auto") can see of a key: the rest (bucket, compile) only the measurement
IDENTITY = ("model_type", "config", "gpu", "versions", "dtype", "attention")
HINT = ("speedlight: no measured plan for this model on this GPU; `speedlight plan MODEL` "
        "(or speedlight.plan(model, inputs)) keeps only the kinds that measure faster here")


class PlanHint(UserWarning):
    """patch(plan="auto") on a GPU found no measured plan for the model: the hint to make one."""


@dataclass
class Decision:
    """What a measurement decided for one kind of patch."""

    kind: str
    verdict: str  # kept | dropped | unmeasured
    reason: str
    purpose: str = "time"  # time | memory (kept unless slower by more than a margin)
    ratio: float | None = None  # speedlight's median time / the original's
    low: float | None = None  # 95% interval of the ratio
    high: float | None = None
    ours_s: float | None = None
    theirs_s: float | None = None
    ours_peak: int | None = None  # bytes; None where the allocator keeps no peak (CPU)
    theirs_peak: int | None = None
    verified: bool | None = None
    module: str | None = None  # the module (or unit) timed

    def detail(self) -> str:
        """The numbers behind the verdict, and why."""
        if self.ratio is None:
            return self.reason
        return (f"time x{self.ratio:.3f}, 95% [{self.low:.3f}, {self.high:.3f}]; "
                f"{self.reason}")


@dataclass
class Plan:
    key: dict
    decisions: dict[str, Decision]
    timed: bool
    note: str = ""
    shapes: dict = field(default_factory=dict)  # the captured inputs' shapes per unit timed
    projected: dict | None = None
    created: str = ""
    schema: int = SCHEMA

    def wanted(self) -> dict[str, bool]:
        """patch()'s keyword per kind decided: False for a kind the plan dropped."""
        return {k: d.verdict != "dropped" for k, d in self.decisions.items()}

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> "Plan":
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise ValueError(f"not a speedlight plan of schema {SCHEMA}: "
                             f"{str(doc)[:80] if not isinstance(doc, dict) else doc.get('schema')!r}")
        decisions = {k: Decision(**d) for k, d in doc["decisions"].items()}
        bad = [d.verdict for d in decisions.values() if d.verdict not in VERDICTS]
        if bad:
            raise ValueError(f"plan verdicts must be one of {VERDICTS}, got {bad}")
        return cls(doc["key"], decisions, bool(doc["timed"]), doc.get("note", ""),
                   doc.get("shapes", {}), doc.get("projected"), doc.get("created", ""))


# --- the key ---------------------------------------------------------------------------------

def versions() -> dict:
    """The versions a plan's numbers depend on."""
    import triton

    from speedlight import __version__
    try:
        import transformers
        hf = transformers.__version__
    except ImportError:
        hf = None
    return {"torch": torch.__version__, "triton": triton.__version__, "transformers": hf,
            "speedlight": __version__}


def gpu_name(device: torch.device) -> str:
    """The GPU a plan is measured on (torch's device name), or 'cpu'."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def bucket(n: int) -> int:
    """n rounded up to a power of two: shapes within one bucket share a plan."""
    return 1 << max(int(n) - 1, 0).bit_length()


# config fields that say nothing about one decoder layer's shapes: a plan times the first
# layer's units, so a plan measured on a 2-layer build applies to the 32-layer model
UNKEYED = ("transformers_version", "architectures", "attn_implementation", "torch_dtype", "dtype",
           "num_hidden_layers")


def _config_digest(config) -> str:
    raw = config.to_dict() if hasattr(config, "to_dict") else dict(vars(config))
    raw = {k: v for k, v in raw.items() if not k.startswith("_") and k not in UNKEYED}
    if isinstance(raw.get("layer_types"), list):  # one entry per layer: keep which types occur
        raw["layer_types"] = sorted(set(map(str, raw["layer_types"])))
    text = json.dumps(raw, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def identity(model: torch.nn.Module) -> dict:
    """What a plan for `model` on the machine here must match (see IDENTITY)."""
    config = getattr(model, "config", None)
    first = next(model.parameters(), None)
    device = first.device if first is not None else torch.device("cpu")
    return {"model_type": getattr(config, "model_type", None) or type(model).__name__,
            "config": _config_digest(config) if config is not None else type(model).__name__,
            "gpu": gpu_name(device), "versions": versions(),
            "dtype": str(first.dtype).replace("torch.", "") if first is not None else None,
            "attention": getattr(config, "_attn_implementation", None)}


def key_for(model: torch.nn.Module, *, batch: int, seq: int, compile_mode: str | None,
            autocast: str | None = None) -> dict:
    """The whole key of a plan measured on `model` at batch x seq."""
    return dict(identity(model), autocast=autocast, batch=bucket(batch), seq=bucket(seq),
                compile=compile_mode or "eager")


def mismatch(plan: Plan, model: torch.nn.Module) -> str | None:
    """Why `plan` does not apply to `model` here (another GPU, other versions, ...), or None."""
    here = identity(model)
    for name in IDENTITY:
        if plan.key.get(name) != here[name]:
            return f"{name} {plan.key.get(name)!r} != {here[name]!r} here"
    return None


def projected_estimate(doc: dict) -> dict:
    """The only estimate a plan has without a GPU: the step's floors, without and with
    speedlight's ops, from a `profile --project` document (projected_profile with patch),
    labelled projected."""
    ours = doc.get("with_speedlight") or {}
    target = doc.get("target") or {}
    run = doc.get("run") or {}
    return {"label": f"projected floors of {run.get('model')} ({run.get('mode')}, batch "
                     f"{run.get('batch')} x seq {run.get('seq')}) on {target.get('name')} (fake "
                     "tensors, no GPU): an estimate, not a measurement",
            "target": target.get("key"), "model": run.get("model"),
            "floor_s": (doc.get("summary") or {}).get("floor_s"),
            "with_speedlight_floor_s": ours.get("floor_s"),
            "saved_s": ours.get("saved_s"), "saved_bytes": ours.get("saved_bytes")}


# --- the cache -------------------------------------------------------------------------------

def folder() -> Path:
    return hardware.cache_dir() / "plans"


def path_for(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    safe = "".join(c if c.isalnum() else "_" for c in f"{key['model_type']}-{key['gpu']}")
    return folder() / f"{safe}-{digest}.json"


def save(plan: Plan, path: str | os.PathLike | None = None) -> Path:
    """Write the plan atomically (to its place in the cache unless path is given)."""
    return results.write_json(path or path_for(plan.key), plan.to_json())


def load_plan(path: str | os.PathLike) -> Plan:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"plan={str(path)!r}: cannot read a plan there ({e})") from None
    return Plan.from_json(doc)


def cached(model: torch.nn.Module) -> Plan | None:
    """The newest cached plan measured on a GPU for this model here, or None."""
    here = folder()
    if not here.is_dir():
        return None
    found = []
    for path in here.glob("*.json"):
        try:
            plan = load_plan(path)
        except (ValueError, KeyError, TypeError):
            continue
        if plan.timed and mismatch(plan, model) is None:
            found.append((plan.created, plan))
    return max(found, key=lambda t: t[0])[1] if found else None


def shared(plan: Plan | None) -> Plan | None:
    """Under torch.distributed, rank 0's plan on every rank (so replicas never diverge);
    else the plan as it is."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return plan
    box = [plan.to_json() if plan is not None else None]
    dist.broadcast_object_list(box, src=0)
    return Plan.from_json(box[0]) if box[0] is not None else None
