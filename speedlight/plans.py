"""A patch plan: which of speedlight.patch's kinds measured faster on this GPU at this
model's shapes, as data: its JSON form, its key, and where it is cached.

`speedlight plan` (speedlight/planning/, a composer) measures and writes a plan;
`speedlight.patch(model, plan=...)` (patching, a tool) reads one through this module and
never imports the composer. A plan is a JSON document:

  key        what it was measured for (key_for): the model's configuration (a digest of
             its config), the GPU (torch's device name), the versions of torch, triton,
             transformers and speedlight, the dtype and autocast, the batch x sequence
             bucket (powers of two), the compile mode and the attention implementation
  decisions  per kind: verdict (kept: a candidate replaces the model's own | dropped: the
             model's own stays | unmeasured), the choice (a candidate's name from
             speedlight/candidates, "model" for the model's own), why, the numbers of the
             choice (its time ratio to the model's own and its 95% interval, each side's
             median time and peak memory), and every candidate with its status (chosen,
             admitted, excluded with its error ratio, offered but not run, not offered with
             the reason), time, ratio, interval and peak
  timed      False when nothing was timed (no GPU): every kind is then unmeasured and
             patch applies today's defaults
  projected  without a GPU, the projected floors `profile --project` gives (labelled so)

Every reader checks a document whole (check_document: the schema, every field's presence
and type, known kinds and verdicts) and refuses it with a PlanError naming the file and
what is wrong. A cached plan is used by patch(plan="auto") only when its identity (everything in
the key but the bucket and compile mode, which patch cannot see) matches the model and
machine patch runs on; a cached file that is not a valid plan, or a plan of this model
from other versions or another GPU, is named in a PlanWarning and ignored, so the default
path never fails because of a file in the cache.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from speedlight import hardware, results

SCHEMA = 2
VERDICTS = ("kept", "dropped", "unmeasured")
# the kinds speedlight.patch swaps: the built-in OpSpecs' `patches`, in the registry's order
# (patching.patcher.kinds(), which a test holds this to: this floor reads no OpSpec);
# candidates and plan files read it from here
KINDS = ("rms_norm", "rope", "cross_entropy", "decoder_layer", "mlp", "attention",
         "linear_cross_entropy")
# what patch(plan="auto") can see of a key: the rest (bucket, compile) only the measurement
IDENTITY = ("model_type", "config", "gpu", "versions", "dtype", "attention")
HINT = ("speedlight: no measured plan for this model on this GPU; `speedlight plan --model "
        "MODEL` (or speedlight.plan(model, inputs)) keeps only the kinds that measure faster "
        "here")


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
    choice: str | None = None  # the candidate installed ("model": none); None: unmeasured
    candidates: list = field(default_factory=list)  # one dict per candidate (CANDIDATE_FIELDS)

    def detail(self) -> str:
        """The numbers behind the verdict, and why."""
        if self.ratio is None:
            return self.reason
        interval = "" if self.low is None else f", 95% [{self.low:.3f}, {self.high:.3f}]"
        return f"time x{self.ratio:.3f}{interval}; {self.reason}"


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
    origin: str = "measured"  # measured (speedlight.plan) | prior (the package's, prior_plan)

    def wanted(self) -> dict[str, bool | str]:
        """patch()'s keyword per kind decided: False for a kind the plan dropped, the
        chosen candidate's name for one it kept, True for one unmeasured."""
        return {k: False if d.verdict == "dropped" else (d.choice or True) if
                d.verdict == "kept" else True for k, d in self.decisions.items()}

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc, source: str = "the plan given") -> "Plan":
        """The plan a JSON document holds, validated whole (check_document): PlanError, a
        ValueError naming `source` and what is wrong, for anything else."""
        check_document(doc, source)
        decisions = {k: Decision(**d) for k, d in doc["decisions"].items()}
        return cls(doc["key"], decisions, doc["timed"], doc["note"], doc["shapes"],
                   doc["projected"], doc["created"], doc["schema"], doc.get("origin", "measured"))


# --- reading a plan: every field checked ---------------------------------------------------

class PlanError(ValueError):
    """A document that is not a plan this speedlight reads; the message names where it came
    from (the file) and what is wrong with it."""


class PlanWarning(UserWarning):
    """A plan file was ignored (not a valid plan, or measured for another GPU or versions),
    or the plan given does not apply to the model: patch goes on without it."""


PURPOSES = ("time", "memory")
_OPTIONAL = type(None)
_NUMBER = (int, float)
# field -> (accepted JSON types, required); a plan document and its key are checked against
# these exactly: a missing field, a field of another type or an unknown field is refused
PLAN_FIELDS = {"schema": ((int,), True), "key": ((dict,), True), "decisions": ((dict,), True),
               "timed": ((bool,), True), "note": ((str,), True), "shapes": ((dict,), True),
               "projected": ((dict, _OPTIONAL), True), "created": ((str,), True),
               "origin": ((str,), False)}
KEY_FIELDS = {"model_type": ((str,), True), "config": ((str,), True), "gpu": ((str,), True),
              "versions": ((dict,), True), "dtype": ((str, _OPTIONAL), True),
              "attention": ((str, _OPTIONAL), True), "autocast": ((str, _OPTIONAL), True),
              "batch": ((int,), True), "seq": ((int,), True), "compile": ((str,), True)}
DECISION_FIELDS = {"kind": ((str,), True), "verdict": ((str,), True), "reason": ((str,), True),
                   "purpose": ((str,), False), "ratio": ((*_NUMBER, _OPTIONAL), False),
                   "low": ((*_NUMBER, _OPTIONAL), False), "high": ((*_NUMBER, _OPTIONAL), False),
                   "ours_s": ((*_NUMBER, _OPTIONAL), False),
                   "theirs_s": ((*_NUMBER, _OPTIONAL), False),
                   "ours_peak": ((int, _OPTIONAL), False), "theirs_peak": ((int, _OPTIONAL), False),
                   "verified": ((bool, _OPTIONAL), False), "module": ((str, _OPTIONAL), False),
                   "choice": ((str, _OPTIONAL), False), "candidates": ((list,), False)}
CANDIDATE_STATUSES = ("chosen", "admitted", "excluded", "offered", "not offered")
CANDIDATE_FIELDS = {"name": ((str,), True), "status": ((str,), True), "reason": ((str,), True),
                    "median_s": ((*_NUMBER, _OPTIONAL), True),
                    "ratio": ((*_NUMBER, _OPTIONAL), True), "low": ((*_NUMBER, _OPTIONAL), True),
                    "high": ((*_NUMBER, _OPTIONAL), True), "peak": ((int, _OPTIONAL), True),
                    "error_ratio": ((*_NUMBER, _OPTIONAL), True)}


def _what(value) -> str:
    """A JSON value's kind, as a message names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (true/false)"
    for types, name in ((dict, "an object"), (list, "a list"), (str, "a string"),
                        ((int, float), "a number")):
        if isinstance(value, types):
            shown = repr(value) if not isinstance(value, (dict, list)) else ""
            return f"{name} {shown[:40]}".rstrip()
    return type(value).__name__


def _expected(types: tuple) -> str:
    names = {dict: "an object", list: "a list", str: "a string", int: "an integer",
             float: "a number", bool: "true or false", _OPTIONAL: "null"}
    shown = list(dict.fromkeys(names[t] for t in types if not (t is int and float in types)))
    return " or ".join(shown)


def _fields(doc: dict, table: dict, where: str) -> None:
    """PlanError text (a ValueError without its source) unless doc holds table's fields."""
    for name, (types, required) in table.items():
        if name not in doc:
            if required:
                raise ValueError(f"{where}has no {name!r}")
            continue
        value = doc[name]
        ok = isinstance(value, tuple(t for t in types if t is not _OPTIONAL)) or (
            value is None and _OPTIONAL in types)
        if isinstance(value, bool) and bool not in types:
            ok = False
        if ok and isinstance(value, float) and not math.isfinite(value):
            ok = False
        if not ok:
            raise ValueError(f"{where}{name} is {_what(value)}, expected {_expected(types)}")
    unknown = [k for k in doc if k not in table]
    if unknown:
        raise ValueError(f"{where}has unknown field(s) {', '.join(map(repr, unknown))}")


def _kind_problem(kind: str) -> str | None:
    if kind in KINDS:
        return None
    near = difflib.get_close_matches(kind, KINDS, n=1)
    return (f"an unknown kind {kind!r}{f' (did you mean {near[0]!r}?)' if near else ''}; a "
            f"plan decides {', '.join(KINDS)}")


def _check_candidates(kind: str, d: dict) -> None:
    """ValueError unless a decision's candidates are records of CANDIDATE_FIELDS and its
    choice, where it records candidates, is among them (or the model's own)."""
    names = set()
    for i, row in enumerate(d.get("candidates", [])):
        where = f"decisions: {kind}: candidates[{i}]: "
        if not isinstance(row, dict):
            raise ValueError(f"{where[:-2]} is {_what(row)}, expected an object")
        _fields(row, CANDIDATE_FIELDS, where)
        if row["status"] not in CANDIDATE_STATUSES:
            raise ValueError(f"{where}status is {row['status']!r}, expected one of "
                             f"{', '.join(CANDIDATE_STATUSES)}")
        names.add(row["name"])
    choice = d.get("choice")
    if names and choice is not None and choice != "model" and choice not in names:
        raise ValueError(f"decisions: {kind}: choice {choice!r} is none of its candidates "
                         f"({', '.join(sorted(names)) or 'none recorded'})")


def check_document(doc, source: str = "the plan given") -> None:
    """PlanError (a ValueError) naming `source` and the first thing wrong, unless doc is a
    plan of this schema: every field present and of its type, no unknown field, decisions
    an object of known kinds with known verdicts."""
    try:
        if not isinstance(doc, dict):
            raise ValueError(f"the document is {_what(doc)}, expected an object")
        schema = doc.get("schema")
        if schema != SCHEMA:
            raise ValueError(f"its schema is {_what(schema)}, this speedlight reads schema "
                             f"{SCHEMA} (written by another speedlight version: measure it "
                             "again with `speedlight plan`)")
        _fields(doc, PLAN_FIELDS, "")
        _fields(doc["key"], KEY_FIELDS, "key: ")
        for name in ("batch", "seq"):
            if doc["key"][name] < 1:
                raise ValueError(f"key: {name} is {doc['key'][name]}, expected at least 1")
        if not doc["decisions"]:
            raise ValueError("decisions is empty: a plan decides at least one kind")
        for kind, d in doc["decisions"].items():
            problem = _kind_problem(kind)
            if problem is not None:
                raise ValueError(f"decisions holds {problem}")
            if not isinstance(d, dict):
                raise ValueError(f"decisions: {kind} is {_what(d)}, expected an object (its "
                                 "verdict, reason and numbers)")
            _fields(d, DECISION_FIELDS, f"decisions: {kind}: ")
            if d["kind"] != kind:
                raise ValueError(f"decisions: {kind}: its kind is {d['kind']!r}")
            for name, allowed in (("verdict", VERDICTS), ("purpose", PURPOSES)):
                if name in d and d[name] not in allowed:
                    raise ValueError(f"decisions: {kind}: {name} is {d[name]!r}, expected one "
                                     f"of {', '.join(allowed)}")
            _check_candidates(kind, d)
    except ValueError as e:
        raise PlanError(f"{source}: {e}") from None


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
    """The plan in a file, validated whole (check_document); PlanError (a ValueError) naming the
    file and what is wrong: unreadable, not UTF-8, not JSON, or not a plan of this schema."""
    source = f"plan file {str(path)!r}"
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise PlanError(f"{source}: cannot be read ({e.strerror or e})") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise PlanError(f"{source}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    except json.JSONDecodeError as e:
        raise PlanError(f"{source}: not JSON ({e.msg} at line {e.lineno}, column "
                        f"{e.colno})") from None
    return Plan.from_json(doc, source)


def _same_model(plan: Plan, model: torch.nn.Module) -> bool:
    here = identity(model)
    return all(plan.key.get(k) == here[k] for k in ("model_type", "config"))


def cached(model: torch.nn.Module) -> Plan | None:
    """The newest cached plan measured on a GPU for this model here, or None. It never
    raises for a file: one that is not a valid plan is named, with what is wrong, in a
    PlanWarning and ignored; when no plan applies, the plans of this model measured on
    another GPU or with other versions are named in a PlanWarning too."""
    here = folder()
    try:
        paths = sorted(here.glob("*.json")) if here.is_dir() else []
    except OSError as e:
        warnings.warn(f"speedlight: the plan cache {str(here)!r} cannot be read ({e}); no "
                      "cached plan is used", PlanWarning, stacklevel=2)
        return None
    found, stale = [], []
    for path in paths:
        try:
            plan = load_plan(path)
        except PlanError as e:
            warnings.warn(f"speedlight: ignoring {e}", PlanWarning, stacklevel=2)
            continue
        if not plan.timed:
            continue
        why = mismatch(plan, model)
        if why is None:
            found.append((plan.created, plan))
        elif _same_model(plan, model):
            stale.append(f"{str(path)!r} ({why})")
    if not found and stale:
        warnings.warn(f"speedlight: the cached plans of this model do not apply here and are "
                      f"ignored: {'; '.join(stale)}; `speedlight plan` measures one for this "
                      "GPU and these versions", PlanWarning, stacklevel=2)
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
