"""Findings: what a kernel engineer would point out, in plain words, each with its evidence,
for every kernel inspect reads (Triton or CUDA C++: one KernelReport).

  narrow-access   a global load/store of contiguous rows narrower than 128 bits, with the
                  cause: the layout (strided lanes, rows not 16-byte aligned, a misaligned
                  view) or what the compiler could not prove (a stride not divisible by 16)
  spill           registers spilled to local memory
  no-wgmma        a matrix kernel without the target's matrix instructions (HGMMA on sm_90a,
                  tcgen05 MMA on sm_100a), or without tensor cores at all, or without the
                  family its design names (KernelDesign.mma)
  no-mfma         the same on AMD: a matrix kernel without MFMA (v_mfma) instructions
  no-tma          a kernel designed for TMA loads (KernelDesign.tma) whose SASS has no UTMALDG
  shallow-pipeline  fewer pipeline stages in shared memory than the design's min_stages
  smem-limit      more shared memory per program than the target's SM allows (no launch)
  occupancy       theoretical occupancy under what the kernel was designed for
  last-wave       the grid's last wave leaves most of its slots idle
  idle-sms        fewer programs than SMs
  re-read         a direction moves more bytes than compulsory (what is read twice)
  rounding-leak   an FFMA (v_fma_f32) subtracting a product's own rounded value: a
                  difference meant to cancel keeps the product's rounding error
  loop-mask       the steady-state loop of a matrix kernel spends a large share of its
                  instructions on predicate/select (a mask applied on every iteration),
                  with the source lines that issue them
  chained-dots    on Blackwell (tcgen05 MMA), two tl.dot chained through one accumulator in
                  one loop iteration, which Triton compiles to wrong results there
  in-flight       a memory-bound kernel's steady-state loop keeps fewer bytes of loads in
                  flight per SM than the GPU's bandwidth x latency needs (Little's law),
                  and says whether any load is issued ahead of its use (a prefetch)
  compile-error   the kernel did not compile for the target
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from speedlight.inspect import loops
from speedlight.inspect.case_report import Access, CaseReport, DirectionBytes, KernelReport

WARN, INFO, ERROR = "warn", "info", "error"


@dataclass
class Finding:
    code: str
    severity: str
    text: str
    kernel: str = ""
    evidence: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"code": self.code, "severity": self.severity, "kernel": self.kernel,
                "text": self.text, "evidence": self.evidence}


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def kernel_findings(k: KernelReport, target_name: str, sku=None) -> list[Finding]:
    name = k.name
    if k.error:
        return [Finding("compile-error", ERROR, f"{name} did not compile for {target_name}: "
                        f"{k.error}", name)]
    out = []
    for a in k.accesses:
        f = _narrow(k, a)
        if f is not None:
            out.append(f)
    scalar = [a for a in k.accesses if a.scalar and a.bits < k.design.vector_bits]
    if scalar:
        lines = sorted({a.line for a in scalar})
        out.append(Finding(
            "narrow-access", INFO, f"{len(scalar)} narrower accesses on lines marked scalar by "
            f"design ({', '.join(map(str, lines))}: `// speedlight: scalar`)", name,
            {"lines": lines, "scalar": True}))
    spilled = k.spill_stores + k.spill_loads
    local = sum(k.mix.local.values())
    if (spilled or local) and k.warp_size == 64:
        out.append(Finding(
            "spill", WARN,
            f"{k.spill_stores // 4} VGPRs spilled to scratch: {k.registers} VGPRs + "
            f"{k.agprs} AGPRs per lane, {k.stack} bytes of scratch per lane, "
            f"{k.mix.local.get('scratch_store', 0)} scratch stores / "
            f"{k.mix.local.get('scratch_load', 0)} loads", name,
            {"spill_stores": k.spill_stores, "registers": k.registers, "agprs": k.agprs,
             "stack": k.stack, "local": dict(k.mix.local)}))
    elif spilled or local:
        out.append(Finding(
            "spill", WARN,
            f"{k.spill_stores} bytes spilled to local memory ({k.spill_loads} bytes reloaded): "
            f"{k.registers} registers/thread, {k.stack}-byte stack frame, "
            f"{k.mix.local.get('STL', 0)} STL / {k.mix.local.get('LDL', 0)} LDL instructions",
            name, {"spill_stores": k.spill_stores, "spill_loads": k.spill_loads,
                   "registers": k.registers, "stack": k.stack, "local": dict(k.mix.local)}))
    out += _matrix(k, target_name)
    out += _pipeline(k, target_name)
    out += _loop_mask(k)
    out += _chained_dots(k, target_name)
    if sku is not None:
        out += _in_flight(k, sku)
    leaks = sorted(set(k.mix.rounding_leaks))
    if leaks:
        lines = ", ".join(f"{Path(f).name}:{n}" for f, n in leaks)
        count = len(k.mix.rounding_leaks)
        out.append(Finding(
            "rounding-leak", WARN,
            f"{count} fused multiply-add{' subtracts' if count == 1 else 's subtract'} "
            f"a product's own rounded value ({lines}): the product is rounded where "
            f"it is summed and exact where the compiler contracted it into the subtraction, "
            f"so a difference meant to cancel (a value minus a mean it is part of) keeps the "
            f"product's rounding error; round it once (tl.fma(a, b, 0.0)) unless an "
            f"error-free product is meant", name, {"lines": [list(at) for at in leaks]}))
    occ = k.occupancy
    if occ.fraction + 1e-9 < k.design.min_occupancy and occ.per_simd:
        out.append(Finding(
            "occupancy", WARN,
            f"theoretical occupancy {_pct(occ.fraction)} ({occ.per_simd:g} of "
            f"{occ.max_warps_per_sm // 4} waves per SIMD, {occ.blocks_per_sm} workgroups of "
            f"{k.num_warps} waves per CU), limited by {occ.limiter} ({k.registers} VGPRs + "
            f"{k.agprs} AGPRs, {k.sgprs} SGPRs, {k.smem} bytes of LDS); designed for at "
            f"least {_pct(k.design.min_occupancy)}", name, occ.to_json()))
    elif occ.fraction + 1e-9 < k.design.min_occupancy:
        out.append(Finding(
            "occupancy", WARN,
            f"theoretical occupancy {_pct(occ.fraction)} ({occ.warps_per_sm} of "
            f"{occ.max_warps_per_sm} warps per SM, {occ.blocks_per_sm} programs of "
            f"{k.num_warps} warps), limited by {occ.limiter} ({k.registers} registers/"
            f"thread, {k.smem} bytes of shared memory); designed for at least "
            f"{_pct(k.design.min_occupancy)}", name, occ.to_json()))
    w = k.waves
    if w.programs > w.per_wave and w.idle_share >= 0.5:
        rest = w.programs - w.full_waves * w.per_wave
        idle = "over 99%" if w.idle_share > 0.99 else _pct(w.idle_share)
        out.append(Finding(
            "last-wave", WARN,
            f"grid of {w.programs} programs on {w.sms} SMs x {w.per_sm} resident = "
            f"{w.per_wave} per wave: {w.waves:.2f} waves, the last wave runs {rest} "
            f"program{'s' if rest != 1 else ''} in {w.per_wave} slots ({idle} idle)", name,
            w.to_json()))
    elif w.programs < w.sms:
        out.append(Finding(
            "idle-sms", INFO,
            f"grid of {w.programs} programs on {w.sms} SMs: {w.sms - w.programs} SMs "
            f"({_pct(1 - w.programs / w.sms)}) have no work", name, w.to_json()))
    return out


def _narrow(k: KernelReport, a: Access) -> Finding | None:
    """A narrow access to row data, or to rows that would be row data but for the layout:
    with its cause where the interpreter measured the addresses (Triton), by its source line
    where the source marks what is row data (CUDA C++)."""
    want = k.design.vector_bits
    bits = a.bits
    if a.marked:
        if a.scalar or a.sass is None or bits >= want:
            return None
        return Finding("narrow-access", WARN, f"line {a.line} `{_short(a.source)}`: {a.kind}s "
                       f"of row data are {bits}-bit ({a.sass.describe()}), designed for "
                       f"{want}-bit", k.name, {"line": a.line, "sass": dict(a.sass.widths),
                                               "scalar": False})
    site = a.site
    if site is None or a.sass is None:
        return None
    threads = k.warp_size * k.num_warps
    if bits >= want or a.block_bytes < 512 or a.parameter:
        return None
    arg = k.launch.arg(a.arg)
    elems = 16 // site.itemsize
    what = f"line {a.line} `{_short(a.source)}`: {a.kind}s of {a.arg} are {bits}-bit " \
           f"({a.sass.describe()})"
    ev = {"line": a.line, "arg": a.arg, "sass": dict(a.sass.widths),
          "possible_bits": a.possible_bits}
    if not site.contiguous:
        if site.stride_elems == 0:
            return None
        if site.stride_elems == -1:
            cause = "the addresses are gathered (not evenly spaced), so each lane loads alone"
        else:
            cause = (f"neighbouring lanes are {site.stride_elems} elements apart (the innermost "
                     f"dimension is not contiguous: a transposed or strided layout), so each "
                     f"element is a separate access")
        ev["lane_stride"] = site.stride_elems
    elif a.possible_bits >= want and a.block_bytes < threads * want // 8:
        per = a.block_bytes // threads
        cause = (f"the block is {site.numel} elements ({a.block_bytes} bytes) spread over "
                 f"{threads} threads ({k.num_warps} warps): {per} bytes per thread, "
                 f"less than one {want}-bit access; fewer warps or a bigger tile would allow it")
        ev["bytes_per_thread"] = per
    elif a.possible_bits >= want:
        unspecialised = [x for x in k.launch.args if x.kind == "int" and x.spec != "D"]
        if unspecialised:
            listed = ", ".join(f"{x.name}={x.value}" for x in unspecialised)
            cause = (f"the rows are contiguous and 16-byte aligned, but the compiler cannot "
                     f"prove it: {listed} {'is' if len(unspecialised) == 1 else 'are'} not a "
                     f"multiple of 16, so Triton does not specialise "
                     f"{'it' if len(unspecialised) == 1 else 'them'} as divisible, and an "
                     f"offset or mask built from them is not known to stay aligned over "
                     f"{elems} lanes (pad to a multiple of 16 elements, or hint tl.multiple_of)")
            ev["unspecialised"] = [x.name for x in unspecialised]
        else:
            cause = ("the rows are contiguous and every argument is specialised as divisible "
                     "by 16, so the kernel's own address arithmetic hides the contiguity "
                     "(an offset the compiler's axis analysis cannot follow)")
    elif arg is not None and arg.kind == "tensor" and arg.align < 16:
        cause = (f"{a.arg} starts at an address only {arg.align}-byte aligned (a view at an "
                 f"offset), so no 16-byte access can start a row")
        ev["data_ptr_align"] = arg.align
    elif not site.aligned16 and arg is not None and arg.kind == "tensor" and len(arg.strides) > 1:
        bad = [s for s in arg.strides[:-1] if s % elems]
        stride = bad[0] if bad else arg.strides[0]
        cause = (f"the row stride ({stride} elements) is not a multiple of {elems} elements "
                 f"(16 bytes), so rows start only {site.align}-byte aligned")
        ev["row_stride"] = stride
    elif site.row_bytes < 16:
        cause = f"each row is only {site.row_bytes} bytes long"
    else:
        cause = (f"the rows are {site.row_bytes} bytes long and start {site.align}-byte "
                 f"aligned: at most {a.possible_bits}-bit accesses fit")
    return Finding("narrow-access", WARN, f"{what}: {cause}", k.name, ev)


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _matrix(k: KernelReport, target_name: str) -> list[Finding]:
    """A Triton matrix kernel (tt.dot in its source) without the target's matrix
    instructions; any kernel without the tensor-core family its design names."""
    tc = k.mix.tensor_core
    name = k.name
    want = k.design.mma
    if not k.has_dot:
        if want and not tc.get(want):
            got = ", ".join(f"{op} x{n}" for op, n in sorted(tc.items())) or "no tensor-core op"
            return [Finding("no-wgmma", WARN, f"designed for {want} on {target_name}, the "
                            f"machine code has {got}", name, {"tensor_core": dict(tc)})]
        return []
    arch = k.compiled.target.arch
    if isinstance(arch, str):  # AMD: MFMA
        if not tc:
            return [Finding("no-mfma", WARN, f"matrix kernel without MFMA on {target_name}: "
                            f"tt.dot compiled to FMA (check dtypes and that every dot "
                            f"dimension is at least 16)", name, {"tensor_core": {}})]
        if want and not tc.get(want):
            return [Finding("no-mfma", WARN, f"designed for {want} on {target_name}, but "
                            f"tt.dot compiled to {', '.join(sorted(tc))}", name,
                            {"tensor_core": dict(tc)})]
        return []
    if not tc:
        return [Finding("no-wgmma", WARN, f"matrix kernel without tensor-core instructions on "
                        f"{target_name}: tt.dot compiled to FMA (check dtypes and that every "
                        f"dot dimension is at least 16)", name, {"tensor_core": {}})]
    if arch == 90 and not any(op in tc for op in ("HGMMA", "QGMMA", "IGMMA")):
        return [Finding("no-wgmma", WARN, f"matrix kernel without HGMMA on {target_name}: "
                        f"tt.dot compiled to {', '.join(sorted(tc))} (mma.sync, the sm_80 path) "
                        f"instead of wgmma; wgmma needs num_warps a multiple of 4 and a tile "
                        f"of at least 64 rows per warp group", name, {"tensor_core": dict(tc)})]
    if arch >= 100 and not any(op.startswith("UTC") for op in tc):
        return [Finding("no-wgmma", WARN, f"matrix kernel without tcgen05 MMA on "
                        f"{target_name}: tt.dot compiled to {', '.join(sorted(tc))}", name,
                        {"tensor_core": dict(tc)})]
    if want and not tc.get(want):
        return [Finding("no-wgmma", WARN, f"designed for {want} on {target_name}, but tt.dot "
                        f"compiled to {', '.join(sorted(tc))}", name, {"tensor_core": dict(tc)})]
    return []


def _pipeline(k: KernelReport, target_name: str) -> list[Finding]:
    """What a matrix kernel's design names beyond tensor cores: TMA, stages, shared memory."""
    d, name, out = k.design, k.name, []
    if d.tma and not k.mix.tma.get("UTMALDG"):
        how = "cp.async (LDGSTS)" if k.mix.async_copies else "plain global loads (LDG)"
        out.append(Finding("no-tma", WARN, f"designed for TMA loads but the SASS on "
                           f"{target_name} has no UTMALDG: operands arrive by {how} (check "
                           f"the tensor descriptors' alignment and the launch's TMA choice)",
                           name, {"tma": dict(k.mix.tma), "async_copies":
                                  dict(k.mix.async_copies)}))
    if k.stages < d.min_stages:
        out.append(Finding("shallow-pipeline", WARN, f"{k.stages} pipeline stage"
                           f"{'s' if k.stages != 1 else ''} in shared memory (num_stages="
                           f"{_num_stages(k)}); designed for at least {d.min_stages}",
                           name, {"stages": k.stages, "num_stages": _num_stages(k)}))
    if k.smem_limit and k.smem > k.smem_limit:
        out.append(Finding("smem-limit", ERROR, f"{k.smem:,} bytes of shared memory per "
                           f"program, over the {k.smem_limit:,} a {target_name} SM allows one "
                           f"block: the launch fails (fewer stages or smaller tiles)", name,
                           {"smem": k.smem, "limit": k.smem_limit}))
    return out


# A matrix kernel's steady-state loop whose predicate/select instructions pass this share of
# the loop (attention's key loop with its mask on every tile: 37%) is told so.
MASK_SHARE = 0.2


def _where(x) -> str:
    return f"{Path(x.file).name}:{x.line}"


def _loop_mask(k: KernelReport) -> list[Finding]:
    """The mask a matrix kernel's steady-state loop applies on every iteration."""
    lp = k.steady_loop
    if lp is None or not lp.mma_flops or lp.share("select") < MASK_SHARE:
        return []
    lines = loops.select_lines(lp)
    ops = ", ".join(f"{op} x{n}" for op, n in lp.opcodes.most_common()
                    if lp.pipe_of.get(op) == "select")
    named = ", ".join(f"{_where(x)} ({x.pipes['select']}) `{_short(x.source, 50)}`"
                      for x in lines[:3])
    return [Finding(
        "loop-mask", WARN,
        f"the steady-state loop ({_where(lp)}) issues {lp.pipes['select']} of its "
        f"{lp.instructions} instructions per iteration ({_pct(lp.share('select'))}) on "
        f"predicate/select ({ops}), "
        f"most at {named or 'no single line'}: a mask applied on every iteration; tiles that "
        f"need none (a causal diagonal's interior, a full key block) could run a loop "
        f"without it", k.name,
        {"loop": lp.index, "select": lp.pipes["select"], "instructions": lp.instructions,
         "lines": [[Path(x.file).name, x.line, x.pipes["select"]] for x in lines[:6]]})]


def _chained_dots(k: KernelReport, target_name: str) -> list[Finding]:
    """Two dots into one accumulator in a loop, on a target whose MMA is tcgen05 (UTC*MMA
    in the SASS): Triton 3.6 to 3.8 drop or corrupt one of the two products there
    (triton-lang/triton#10821; Liger-Kernel's SwiGLU and fused-MoE backward hit it, its PRs
    1435 and 1413). Two accumulators summed after the loop, or two loops, are right."""
    if k.compiled is None or not any(op.startswith("UTC") for op in k.mix.tensor_core):
        return []
    pairs = loops.chained_dots(k.compiled.text("ttir"))
    if not pairs:
        return []
    where = ", ".join(f"lines {a} and {b}" for a, b in pairs)
    return [Finding(
        "chained-dots", ERROR,
        f"two tl.dot accumulate into one accumulator within a loop iteration ({where}): on "
        f"{target_name}'s tcgen05 MMA Triton 3.6-3.8 compiles this to wrong results (one "
        f"product dropped or corrupted; triton-lang/triton#10821); keep one accumulator per "
        f"dot and add them after the loop, or run the dots in two loops", k.name,
        {"pairs": [list(p) for p in pairs]})]


def _steady_segment(k: KernelReport) -> dict | None:
    """The predicted figures of the steady-state loop (predict.Prediction's segment)."""
    lp, p = k.steady_loop, k.predicted
    if lp is None or p is None:
        return None
    where = f"{Path(lp.file).name}:{lp.line}"
    return next((x for x in p.parts.get("segments", []) if x["where"] == where), None)


def _in_flight(k: KernelReport, sku) -> list[Finding]:
    """A memory-bound steady-state loop (no MMA) that keeps fewer bytes in flight per SM
    than Little's law needs for the GPU's bandwidth: on average over an iteration, where
    the model predicts the iteration's length (a load used where it is issued is in flight
    only for the memory latency of each iteration), else at most; not where the model
    finds the loop bandwidth-bound (then the bytes are enough)."""
    from speedlight import predict

    lp = k.steady_loop
    if lp is None or lp.mma_flops or not lp.load_bytes or not k.resident:
        return []
    most, need = k.in_flight_per_sm(), predict.needed_in_flight(sku)
    seg = _steady_segment(k)
    if seg is not None and seg["bound"] == "memory":
        return []
    latency = k.predicted.parts["memory_latency_cycles"] if seg else 0
    share = 1.0 if lp.prefetch or not seg or not seg["cycles"] else \
        min(1.0, latency / seg["cycles"])
    have = most * share
    if have >= need:
        return []
    threads = k.num_warps * k.warp_size
    how = ("its loads are issued ahead of their use (a prefetch), still too few" if lp.prefetch
           else "every load is used in the iteration that issues it: no prefetch of the next "
                "iteration's data")
    timing = (f", in flight for about the memory latency's {latency:,} of the iteration's "
              f"{seg['cycles']:,.0f} predicted cycles" if share < 1.0 else "")
    return [Finding(
        "in-flight", WARN,
        f"the steady-state loop ({_where(lp)}) keeps about {have / 1024:.1f} KB of loads in "
        f"flight per SM ({most / 1024:.1f} KB at most: {lp.in_flight} bytes per thread x "
        f"{threads} threads x {k.resident:.3g} program{'s' if k.resident != 1 else ''} per SM"
        f"{timing}); drawing {_pct(predict.MAX_BUSY)} of {sku.name}'s bandwidth needs about "
        f"{need / 1024:.0f} KB per SM (Little's law: {_pct(predict.MAX_BUSY)} of "
        f"{sku.dram_bandwidth / sku.sm_count / 1e9:.0f} GB/s per SM x the "
        f"{predict.loaded_latency_s(sku) * 1e9:,.0f} ns a load then takes), so about "
        f"{_pct(predict.MAX_BUSY * have / need)} of it is reachable (predicted): {how}; load "
        f"the next row(s) before this one's reductions, or more rows per program", k.name,
        {"loop": lp.index, "per_sm": int(have), "most_per_sm": most, "needed": need,
         "per_thread": lp.in_flight, "threads": threads, "resident_per_sm": k.resident,
         "prefetch": lp.prefetch, "share_of_iteration": round(share, 3)})]


def _num_stages(k: KernelReport) -> int | None:
    """The num_stages a Triton launch asked for (None for CUDA C++)."""
    return getattr(k.launch, "num_stages", None)


def bytes_findings(d: DirectionBytes) -> list[Finding]:
    if d.ratio <= 1.05 + 1e-9:
        return []
    reread = []
    for v in sorted(d.by_arg.values(), key=lambda v: -(v["loaded"] + v["stored"])):
        where = f" by {' and '.join(v['kernels'])}" if len(d.kernels) > 1 else ""
        if v["size"] and v["loaded"] > 1.05 * v["size"]:
            reread.append(f"{v['arg']} read {v['loaded'] / v['size']:.2f}x its size{where}")
        if v["size"] and v["stored"] > 1.05 * v["size"]:
            reread.append(f"{v['arg']} written {v['stored'] / v['size']:.2f}x its size{where}")
    extra = ", ".join(reread[:4]) or "every argument is touched once; scratch traffic"
    text = (f"{d.direction} moves {d.ratio:.2f}x its compulsory bytes ({d.measured:,} for "
            f"{d.compulsory:,}): {extra}")
    if d.measured_on:
        # a smaller case with the same kernels, run because this one is too large for the
        # interpreter: what each program re-reads (a weight vector, a partial row) weighs
        # differently at this case's size, so the ratio is information, not this case's
        text = (f"on the stand-in case {d.measured_on} (the same kernels, run because this "
                f"case is too large for the interpreter; this case's own ratio is not "
                f"measured): " + text)
    if d.why:
        text += f" (by design: {d.why})"
    severity = INFO if d.ratio <= d.allowed + 1e-9 or d.measured_on else WARN
    return [Finding("re-read", severity, text, "+".join(d.kernels), d.to_json())]


def case_findings(report: CaseReport) -> None:
    """Fill every kernel's findings and the case's byte findings."""
    for k in report.kernels:
        k.findings = kernel_findings(k, report.target.arch_name, report.device)
    report.findings = [f for d in report.directions for f in bytes_findings(d)]
