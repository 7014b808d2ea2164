"""The JSON document `speedlight profile` writes (profile-<model>-<mode>.json), field by field.

This is what `speedlight report` reads. Times are seconds, sizes bytes, rates per second.
Numbers are either measured (times: on the CPU or the GPU named in environment.device;
memory) or computed (FLOPs, bytes, floors: from formulas, on the target's roof); the
`measured` object says which, and on which device.
"""

from __future__ import annotations

SCHEMA = "speedlight.profile/1"

TOP = {
    "schema": "this format's name and version",
    "environment": "where it ran: device, runtime, torch/triton/CUDA/driver versions, git, time (results.environment)",
    "run": "the invocation: id, model, mode (train|infer), batch, seq, dtype, warmup, steps, device",
    "model": "what was built: source, class, parameters, and the config fields that size it",
    "target": "the GPU the floors are on (speedlight.target.Target.to_json): key, name, arch, "
              "sm_count, origin (--target, the GPU in use or the default), in_use and its older "
              "name measured_here, roof_source (measured|datasheet), roof_device, bandwidth, "
              "peak_flops per dtype, roof_note, launch_s",
    "measured": "what is measured and what projected: time (cpu|cuda), floors (on the measured "
                "GPU|projected), note",
    "summary": "per step: step_time_s (clean steps, median) and its samples, time_by_bound_s (op time "
               "per bound, and on a GPU the idle time between kernels as idle), floor_by_bound_s (per bound, "
               "the floors with at least one launch per kernel: the projected picture), op_time_s (sum over ops), "
               "floor_s, floor_with_launch_s, flops, bytes, ops, speed_of_light (floor/step, "
               "on the target GPU only), uncounted {ops, time_s, time_share, names}, launch "
               "{kernel_ops, projected_overhead_s, measured_idle_s, measured_kernels, note}, gpu",
    "memory": "peak_bytes and at_peak by category (sums to peak_bytes), allocator_peak_bytes (CUDA), "
              "parameters/buffers/optimizer_state/inputs/gradients/activations _bytes, "
              "activations_by_module, at_peak_by_module, op_peaks (speedlight's ops: the most "
              "bytes each call had live beyond what was live when it began, its outputs and "
              "its launcher's intermediates, largest per op and module), notes",
    "advice": "fusions, best first (see ADVICE)",
    "by_type": "groups of rows by aten op (see GROUP)",
    "by_module": "groups by the innermost module path, or (optimizer) / (autograd engine) / (outside the model)",
    "by_class": "groups by module class",
    "by_phase": "groups by forward / backward / optimizer",
    "by_bound": "groups by bound",
    "module_tree": "per module path: time_s with its submodules, self_time_s, floor_s, depth",
    "top_ops": "the costliest ops, identical calls (op, input shapes, phase) grouped: op, name, phase, "
               "shapes, calls, and over those calls time_s, time_share, floor_s, flops, bytes; bound and "
               "formula (of each call), place (of the first), places (how many), indices",
    "rows": "one per aten op call of the recorded step (see ROW)",
    "notes": "anything the reader must know about this run",
}

# Present in a projected document only (`speedlight profile --project`); there, measured.time
# is "projected", every time_s is the op's floor and summary.step_time_s is null.
PROJECTED = {
    "projection": "how it was made: label (projected floor), dispatch (gpu|here) and dispatch_note, "
                  "attention (backend, why, calls), recipe (name, text, bytes_per_parameter), "
                  "exact_bytes (parameters, gradients, optimizer_state by arithmetic), tokens, "
                  "tokens_per_s_at_floor, moe (experts, k, widths, modules, implementation, loops, "
                  "block: the experts modules' floor_s, share of the step's floor, bound, flops, "
                  "bytes, classes, calls), seconds (wall time of the fake step)",
    "with_speedlight": "the model patched with speedlight's ops, projected on the same target: patch, "
                       "floor_s, floor_with_launch_s, ops, kernel_ops, peak_bytes, activations_bytes, "
                       "saved_s, saved_with_launch_s, saved_bytes, by_type, expert_block (as projection.moe.block), "
                       "label; with --predict, predicted: per speedlight op, case and direction its calls, "
                       "floor_us and the time predicted from its compiled kernels (predicted_us, bound, "
                       "step_predicted_us, sku; why where there is none)",
    "comparison": "--targets: rows (target, name, floor_s, floor_with_launch_s, tokens_per_s, "
                  "floor_by_bound_s, memory_bytes, peak_bytes, fits, patched_floor_s, "
                  "patched_tokens_per_s, patched_peak_bytes; with --shard: shard, sharded_peak_bytes, "
                  "sharded_fits), shard, shard_note, largest_layer, largest_layer_bytes, label",
    "variations": "--vary: target, base {batch, seq}, fields, rows (field, value, batch, seq, parameters, "
                  "floor_s, floor_with_launch_s, tokens_per_s, flops, split_s by cost family, peak_bytes, "
                  "fits), label",
}

ROW = {
    "index": "position in the step's op sequence",
    "op": "aten overload, e.g. aten.mm.default", "name": "overload packet, e.g. mm",
    "phase": "forward | backward | optimizer | other",
    "module": "innermost module path (model.layers.3.mlp.down_proj; '' the root; null outside the model)",
    "module_class": "its class", "place": "module, or (optimizer) / (autograd engine) / (outside the model)",
    "call": "id of the module call it ran in (forward ops, and backward ops through fwd_index)",
    "grad_fn": "the autograd node running a backward op", "fwd_index": "the forward op that node came from",
    "inputs": "tensor inputs: shape, dtype, stride", "outputs": "new tensor outputs",
    "scalars": "the non-tensor arguments", "producers": "per tensor input, the index of the op that made it",
    "formula": "the cost family (matmul, attention, conv, pointwise, reduction, norm, softmax, loss, "
               "gather, scatter, copy, fill, foreach, sync, view, alloc, marker, fused: a speedlight op); "
               "null: no formula",
    "formula_detail": "the formula with its numbers, or why there is none",
    "flops": "FLOPs (null without a formula)", "bytes": "compulsory bytes (null without a formula)",
    "intensity": "flops / bytes", "launches_kernel": "whether it launches device work",
    "time_s": "measured time, median over recorded steps (CUDA kernel time on a GPU, CPU time on a CPU)",
    "time_samples_s": "one per recorded step", "host_s": "CPU time inside the op (launch cost on a GPU)",
    "kernels": "CUDA kernels it launched: name, time_s",
    "launches": "kernels it launched per call, on a GPU (null when projected): its fixed cost is "
                "launches x the launch cost",
    "peak": "which peak its FLOPs run against (fp32, tf32, fp16, bf16, fp8)",
    "floor_s": "speed-of-light floor on the target", "bound": "compute | memory | launch (overhead-bound: its kernels run shorter than "
                 "their launches cost) | none | unknown",
    "distance": "time_s / floor_s, when measured on the target GPU; else null",
    "saved_bytes": "bytes of its outputs autograd saved for backward",
}

GROUP = {
    "key": "the group", "calls": "ops in it", "time_s": "measured time", "time_share": "of op time",
    "flops": "of the ops with a formula", "bytes": "of the ops with a formula",
    "floor_s": "sum of floors", "uncounted_calls": "ops without a formula",
    "bound": "the bound covering most of its time", "time_by_bound_s": "time per bound",
    "distance": "time_s / floor_s, when measured on the target GPU; else null",
}

ADVICE = {
    "op": "the speedlight op that replaces the chain", "what": "what it does",
    "pattern": "what was matched", "instances": "how many chains", "modules": "where",
    "note": "e.g. Gemma's offset", "status": "available | not in this install",
    "time_saved_s": "per step: bytes_removed / bandwidth of the target; for an op that computes "
                    "(not memory-bound), unfused_floor_s (the chain's op floors) - "
                    "fused_floor_s (its OpSpec's cost on the roof), given beside it",
    "memory_saved_bytes": "activations the chain keeps for backward that the fused op does not "
                          "(less the op's Cost.saved)",
    "bytes_removed": "unfused_bytes - fused_bytes", "unfused_bytes": "bytes the chain's ops move",
    "fused_bytes": "the fused op's bytes: its OpSpec's cost of the Case its recogniser found",
    "kernels_unfused": "kernels the chain launches",
    "launches_removed": "kernels_unfused - the fused op's", "measured_time_s": "the chain's measured time",
    "uncounted_ops": "chain ops without a formula", "instances_detail": "the same, per instance",
}


def document(*, environment: dict, run: dict, model: dict, target: dict, measured: dict,
             analysis: dict, memory: dict, advice: list, notes: list) -> dict:
    doc = {"schema": SCHEMA, "environment": environment, "run": run, "model": model,
           "target": target, "measured": measured, "summary": analysis["summary"],
           "memory": memory, "advice": advice}
    for k in ("by_type", "by_module", "by_class", "by_phase", "by_bound", "module_tree", "top_ops", "rows"):
        doc[k] = analysis[k]
    doc["notes"] = notes
    return doc


def check(doc: dict) -> list[str]:
    """What a document lacks against this schema (empty when it conforms)."""
    problems = [f"missing top-level field {k!r}" for k in TOP if k not in doc]
    if doc.get("schema") != SCHEMA:
        problems.append(f"schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    for r in doc.get("rows", []):
        problems += [f"row lacks {k!r}" for k in ROW if k not in r]
    for g in doc.get("by_type", [])[:1]:
        problems += [f"group lacks {k!r}" for k in GROUP if k not in g]
    for a in doc.get("advice", []):
        problems += [f"advice lacks {k!r}" for k in ADVICE if k not in a]
    return list(dict.fromkeys(problems))
