"""What to fuse: each chain a speedlight op replaces, with the time and memory it saves.

Each op says what it replaces and what it costs: its OpSpec's `recognise` finds its
chains (profile.patterns), each with the Case of the call that replaces it, and its `cost`
counts that call. Estimates, per step, on the target's roof:
- time saved: for a fusion (a memory-bound op), the bytes the chain moves less the op's
  (forward, and backward when training), over the bandwidth: the intermediate traffic the
  fusion removes. An op that computes (attention, a mixture of experts' block, the loss
  with its logits matmul) replaces the chain's matmuls too: the chain's op floors less the
  op's own floor (its cost on the roof), both counting the matmuls at the sizes the model
  ran them (an expert's GEMMs at the rows routing gave it). Launches removed are counted
  too; their time is part of the launch-gap figure, reported separately, since CUDA
  graphs recover it without fusing;
- memory saved: the bytes of the chain's intermediates (not its outputs) autograd kept for
  backward (measured), with what else the chain holds that the op never makes (the
  logits linear_cross_entropy never writes), less what the op holds (`Cost.saved`: rstd,
  logsumexp, a schedule's chunk of logits).
"""

from __future__ import annotations

from speedlight import registry
from speedlight.hardware import Roof
from speedlight.profile.patterns import find_chains
from speedlight.spec import Chain, OpSpec
from speedlight.target import TENSOR_CORE_FAMILIES, peak_key


def describe_op(op: str, specs=None) -> tuple[str, str]:
    """(what the op does, its status: available | not in this install). `specs`: the
    OpSpecs of this run (built-in and --spec files); an op among them is available, a
    team's own op too."""
    for spec in specs or ():
        if spec.name == op:
            return spec.fuses or op, "available"
    if op in registry.BUILTIN_OPS:
        return registry.builtin_spec(op).fuses, "available"
    return op, "not in this install"


def replacement(spec: OpSpec, c: Chain, roof: Roof, train: bool) -> tuple[int, float, int]:
    """(bytes, floor seconds, bytes it holds) of the one call of `spec`'s op replacing
    chain `c`: its OpSpec's cost of the chain's Case, forward and backward when training,
    the floor at the peak of the Case's dtype (on the tensor cores for an op that computes
    on them)."""
    costs = [spec.cost(c.case, "fwd")] + ([spec.cost(c.case, "bwd")] if train else [])
    costs = [x for x in costs if x is not None]
    key = peak_key(c.case.dtype, tensor_core=spec.family in TENSOR_CORE_FAMILIES)
    floor = sum(roof.floor_seconds(x.flops, x.bytes, key) for x in costs)
    return sum(int(x.bytes) for x in costs), floor, int(costs[0].saved) if costs else 0


def savings(spec: OpSpec, c: Chain, rows: list[dict], roof: Roof, train: bool) -> dict:
    """Time and memory one chain instance would save. A fusion saves the traffic it
    removes; an op that computes, which replaces matmuls too, the chain's summed floors
    less its own floor (every op's floor on the roof)."""
    members = [rows[i] for i in sorted(c.fwd)]
    members += [r for r in rows if r["phase"] == "backward" and r["fwd_index"] in c.fwd]
    counted = [r for r in members if r["bytes"] is not None]
    unfused = sum(r["bytes"] for r in counted)
    fused, fused_floor, kept = replacement(spec, c, roof, train)
    floors = {}
    if spec.family != "memory-bound":
        floors = {"unfused_floor_s": sum(r["floor_s"] for r in counted
                                         if r["floor_s"] is not None),
                  "fused_floor_s": fused_floor}
    removed = max(unfused - fused, 0)
    # what autograd kept of the chain's intermediates (its outputs stay kept when fused),
    # and what the chain holds that the op never makes
    saved_acts = sum(rows[i]["saved_bytes"] for i in c.fwd if i not in c.external) + c.unstored
    return {
        "module": c.module, "ops": len(members),
        "kernels": sum(1 for r in members if r["launches_kernel"]),
        "unfused_bytes": unfused, "fused_bytes": fused, "bytes_removed": removed,
        "time_saved_s": (max(floors["unfused_floor_s"] - floors["fused_floor_s"], 0.0) if floors
                         else removed / roof.bandwidth),
        "memory_saved_bytes": max(saved_acts - kept, 0),
        "measured_time_s": sum(r["time_s"] for r in members),
        "uncounted_ops": len(members) - len(counted),
        **floors,
    }


def advise(rows: list[dict], calls, roof: Roof, specs=None) -> list[dict]:
    """One entry per speedlight op with what its instances save, best first. `specs`: the
    OpSpecs of this run (built-in and --spec files); an op among them is available. The
    chains looked for are the built-in ops' and those of `specs` that declare a recogniser
    (one replacing a built-in op's of its name)."""
    finders = {s.name: s for s in registry.builtin_specs()}
    finders.update({s.name: s for s in specs or () if s.recognise is not None})
    train = any(r["phase"] == "backward" for r in rows)
    grouped: dict[str, list] = {}
    for c in find_chains(rows, calls, finders.values()):
        grouped.setdefault(c.op, []).append((c, savings(finders[c.op], c, rows, roof, train)))
    out = []
    for op, items in grouped.items():
        est = [e for _, e in items]
        fused_kernels = len(items) * (2 if train else 1)
        what, status = describe_op(op, specs)
        modules = sorted({e["module"] for e in est if e["module"] is not None})
        out.append({
            "op": op, "what": what, "pattern": items[0][0].pattern, "instances": len(items),
            "modules": modules, "note": items[0][0].note,
            "status": status,
            "time_saved_s": sum(e["time_saved_s"] for e in est),
            "memory_saved_bytes": sum(e["memory_saved_bytes"] for e in est),
            "bytes_removed": sum(e["bytes_removed"] for e in est),
            "unfused_bytes": sum(e["unfused_bytes"] for e in est),
            "fused_bytes": sum(e["fused_bytes"] for e in est),
            "kernels_unfused": sum(e["kernels"] for e in est),
            "launches_removed": max(sum(e["kernels"] for e in est) - fused_kernels, 0),
            "measured_time_s": sum(e["measured_time_s"] for e in est),
            "uncounted_ops": sum(e["uncounted_ops"] for e in est),
            **{f: sum(e[f] for e in est) for f in ("unfused_floor_s", "fused_floor_s")
               if f in est[0]},
            "instances_detail": est,
        })
    out.sort(key=lambda a: -a["time_saved_s"])
    return out
