"""What to fuse: each chain a speedlight op replaces, with the time and memory it saves.

Estimates, per step, on the target's roof:
- time saved = (bytes the unfused chain moves - the fused op's compulsory bytes) /
  bandwidth: the intermediate traffic the fusion removes (forward, and backward when
  training). Launches removed are counted too; their time is part of the launch-gap
  figure, reported separately, since CUDA graphs recover it without fusing;
- memory saved = the bytes of the chain's intermediates (not its outputs) autograd kept
  for backward (measured), less what the fused op keeps instead (rstd, logsumexp; for
  linear_cross_entropy, whose logits are never stored, what its schedule holds under
  the default memory budget: a chunk of logits, or beside it an fp32 d_weight accumulator,
  or vocabulary blocks of logits);
- moe_experts (a mixture of experts' routed experts, the Hugging Face per-expert loop or a
  grouped_mm chain) replaces GEMMs, not only traffic: its time saved is the sum of the
  chain's op floors (forward and backward) less moe_experts' own floor, its OpSpec's cost
  on the roof. Both count the expert GEMMs at the rows each expert got (the projection's
  uniform routing, or the measured run's).

The fused op's compulsory bytes are those of the speedlight op (read its inputs once,
write its outputs once, as in its OpSpec's cost); they are written here from the chain's
boundary shapes; what each op does is its OpSpec's `fuses`.
"""

from __future__ import annotations

import math

import torch

from speedlight import registry
from speedlight.hardware import Roof
from speedlight.target import peak_key
from speedlight.profile.patterns import Chain, find_chains

# Chains whose speedlight op is still to come (a registered op's OpSpec.fuses says what
# it replaces): op -> what it does.
PLANNED: dict[str, str] = {}


def describe_op(op: str, specs=None) -> tuple[str, str]:
    """(what the op does, its status: available | planned | not in this install). `specs`:
    the OpSpecs of this run (built-in and --spec files); an op among them is available,
    a team's own op too."""
    for spec in specs or ():
        if spec.name == op:
            return spec.fuses or op, "available"
    if op in registry.BUILTIN_OPS:
        return registry.builtin_spec(op).fuses, "available"
    if op in PLANNED:
        return PLANNED[op], "planned"
    return op, "not in this install"



def itemsize(dtype: str) -> int:
    names = {"fp32": 4, "fp16": 2, "bf16": 2, "fp64": 8}
    if dtype in names:
        return names[dtype]
    return getattr(torch, dtype).itemsize


def elements(meta: dict | None) -> int:
    """Distinct elements of a recorded tensor (broadcast dims once)."""
    if meta is None:
        return 0
    return math.prod(s for s, st in zip(meta["shape"], meta["stride"]) if st != 0) if meta["shape"] else 1


def size(meta: dict | None) -> int:
    return elements(meta) * itemsize(meta["dtype"]) if meta else 0


def rows_of(meta: dict) -> int:
    return math.prod(meta["shape"][:-1]) if meta["shape"] else 1


def fused_bytes(c: Chain, train: bool) -> tuple[int, int]:
    """(compulsory bytes per step, bytes it keeps for backward that the chain did not)."""
    t = c.tensors
    if c.op in ("rms_norm", "add_rms_norm", "layer_norm"):
        x, w, out = t["x"], t.get("weight"), t["out"]
        stats = 4 * rows_of(x) * (2 if c.op == "layer_norm" else 1)  # rstd (and mean), fp32
        wb = size(w) * (2 if c.op == "layer_norm" else 1)  # weight (and bias)
        fwd = size(x) + wb + size(out) + stats
        bwd = size(out) + size(x) + wb + stats + size(x) + wb  # read dy, x, w, stats; write dx, dw
        if c.op == "add_rms_norm":
            fwd += size(t["residual"]) + size(x)  # read the residual, write the sum
            bwd += size(x)  # read the gradient arriving on the sum
        return fwd + (bwd if train else 0), stats
    if c.op in ("swiglu", "geglu"):
        gate, up, out = t["gate"], t["up"], t["out"]
        fwd = size(gate) + size(up) + size(out)
        bwd = size(out) + size(gate) + size(up) + size(gate) + size(up)
        return fwd + (bwd if train else 0), 0
    if c.op == "rope":
        x, cos, sin, out = t["x"], t["cos"], t["sin"], t["out"]
        fwd = size(x) + size(cos) + size(sin) + size(out)
        return fwd + (fwd if train else 0), 0  # backward: read dy, cos, sin; write dx
    if c.op == "softmax":
        x, out = t["x"], t["out"]
        fwd = size(x) + size(out)
        return fwd + (3 * size(out) if train else 0), 0  # read y, dy; write dx
    if c.op == "cross_entropy":
        logits, target = t["logits"], t["target"]
        lse = 4 * rows_of(logits)
        fwd = size(logits) + size(target) + lse + 4
        bwd = size(logits) + lse + size(target) + size(logits)
        return fwd + (bwd if train else 0), lse
    if c.op == "linear_cross_entropy":
        h, w, target = t["hidden"], t["weight"], t["target"]
        fwd = size(h) + size(w) + size(target) + 4
        bwd = size(h) + size(w)  # dh and dW, computed chunk by chunk in the forward
        # alive at once instead of the logits: what linear_cross_entropy's schedule holds
        # under its default memory budget (a plan from shapes: it imports no kernel)
        from speedlight.ops.linear_cross_entropy_schedule import plan_schedule
        from speedlight.spec import parse_dtype
        dtype = parse_dtype(h["dtype"])
        logits = t["logits"]
        kept = plan_schedule(rows_of(logits), logits["shape"][-1], h["shape"][-1], dtype, dtype,
                    grad_weight=train).extra_bytes
        return fwd + (bwd if train else 0), kept
    if c.op == "attention":
        q, k, v, out = t["q"], t["k"], t["v"], t["out"]
        lse = 4 * rows_of(q)
        fwd = size(q) + size(k) + size(v) + size(out) + lse
        bwd = 2 * size(out) + size(q) + size(k) + size(v) + lse + size(q) + size(k) + size(v)
        return fwd + (bwd if train else 0), lse
    raise KeyError(c.op)


def moe_case(c: Chain):
    """The moe_experts Case of an experts chain: its tokens, widths, experts and k, in the
    weights' dtype (what the patched module runs it in)."""
    from speedlight.spec import Case, parse_dtype

    t = c.tensors
    tokens, k = t["top_k_index"]["shape"]
    experts, two_i, hidden = t["gate_up_proj"]["shape"]
    return Case("moe_experts", (("tokens", tokens), ("hidden", hidden), ("inter", two_i // 2),
                                ("experts", experts), ("k", k)),
                dtype=parse_dtype(t["gate_up_proj"]["dtype"]))


def replacement(c: Chain, roof: Roof, train: bool) -> tuple[int, float, int]:
    """(bytes, floor seconds, bytes kept for backward) of the one op replacing a chain that
    is more than a fusion (moe_experts: the expert GEMMs are most of its time): its OpSpec's
    cost (forward, and backward when training) on the roof at the tensor cores' peak of its
    dtype. moe_experts keeps z alone (2 I values per pair; the sort is redone in its
    backward)."""
    case = moe_case(c)
    spec = registry.builtin_spec("moe_experts")
    key = peak_key(case.dtype, tensor_core=True)
    costs = [spec.cost(case, "fwd")] + ([spec.cost(case, "bwd")] if train else [])
    floor = sum(roof.floor_seconds(x.flops, x.bytes, key) for x in costs)
    pairs = case["tokens"] * case["k"]
    kept = pairs * 2 * case["inter"] * case.dtype.itemsize if train else 0
    return sum(int(x.bytes) for x in costs), floor, kept


def savings(c: Chain, rows: list[dict], roof: Roof, train: bool) -> dict:
    """Time and memory one chain instance would save. A fusion saves the traffic it
    removes; moe_experts, which replaces GEMMs too, saves the chain's summed floors less its
    own floor (every op's floor on the roof, so the expert GEMMs at their routed sizes)."""
    members = [rows[i] for i in sorted(c.fwd)]
    members += [r for r in rows if r["phase"] == "backward" and r["fwd_index"] in c.fwd]
    counted = [r for r in members if r["bytes"] is not None]
    unfused = sum(r["bytes"] for r in counted)
    floors = {}
    if c.op == "moe_experts":
        fused, fused_floor, kept = replacement(c, roof, train)
        unfused_floor = sum(r["floor_s"] for r in counted if r["floor_s"] is not None)
        floors = {"unfused_floor_s": unfused_floor, "fused_floor_s": fused_floor}
    else:
        fused, kept = fused_bytes(c, train)
    removed = max(unfused - fused, 0)
    # what autograd kept of the chain's intermediates; its outputs stay kept when fused
    saved_acts = sum(rows[i]["saved_bytes"] for i in c.fwd if i not in c.external)
    if c.op == "linear_cross_entropy":  # the logits themselves are never stored
        saved_acts += size(c.tensors["logits"])
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
    OpSpecs of this run (built-in and --spec files); an op among them is available."""
    train = any(r["phase"] == "backward" for r in rows)
    grouped: dict[str, list] = {}
    for c in find_chains(rows, calls):
        grouped.setdefault(c.op, []).append((c, savings(c, rows, roof, train)))
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
