"""Read AMDGCN (what Triton's AMD backend makes of a kernel for gfx942 / gfx950): its
resources, occupancy in waves per SIMD, instruction mix and the width of each global
memory access per source line, into the same report SASS is read into (sass.Mix,
sass.LineAccess, occupancy.Occupancy).

Input is the `.amdgcn` assembly Triton writes: instructions under `.loc FILE LINE COL`
directives (the DWARF line table, `.file N "dir" "name"` naming each file), the
assembler's "; Kernel info" comment block (NumVgprs, NumAgprs, TotalNumVgprs,
TotalNumSgprs, ScratchSize, LDSByteSize, the compiler's own Occupancy) and the
amdhsa.kernels metadata (vgpr_spill_count, sgpr_spill_count). Counts are static (an
instruction inside a loop counts once).

Vocabulary: a wavefront of 64 lanes is the warp, a CU the SM, LDS the shared memory;
global_/buffer_/flat_ loads and stores are the LDG/STG of SASS (flat_ ones are generic:
the address could not be proved global), v_mfma / v_smfmac the tensor-core instructions
(counted as "MFMA", what an AMD KernelDesign.mma names), scratch_ the local memory.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from speedlight.hardware import AmdArchLimits
from speedlight.inspect import sass
from speedlight.inspect.occupancy import Occupancy

_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"(?:\s+"([^"]*)")?')
_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+\d+")
_INSTR = re.compile(r"^\s+([a-z][a-z0-9_]*)(?:\s+([^;]*))?\s*(?:;.*)?$")
_END = re.compile(r"^(\.Lfunc_end\d+:|\s*; -- End function)")
_WIDTH = {"byte": 8, "ubyte": 8, "sbyte": 8, "short": 16, "ushort": 16, "sshort": 16,
          "dword": 32, "dwordx2": 64, "dwordx3": 96, "dwordx4": 128,
          "b8": 8, "u8": 8, "i8": 8, "b16": 16, "u16": 16, "i16": 16, "b32": 32, "b64": 64,
          "b96": 96, "b128": 128}
MEMORY = ("global", "buffer", "flat")
TRANSCENDENTAL = ("v_exp_", "v_log_", "v_rcp_", "v_rsq_", "v_sqrt_", "v_sin_", "v_cos_")
SHUFFLES = ("ds_bpermute", "ds_permute", "ds_swizzle")


@dataclass(frozen=True)
class Instr:
    """One AMDGCN instruction and the source line it is attributed to (0: none)."""

    opcode: str  # the mnemonic: global_load_dwordx4, v_mfma_f32_32x32x8_bf16
    file: str
    line: int
    operands: tuple = ()  # ("v10", "v1", "v7", "-v9"): the destination first, if any

    @property
    def base(self) -> str:
        return self.opcode

    @property
    def space(self) -> str:
        """global | buffer | flat | scratch | ds | ... (the mnemonic's first word)."""
        return self.opcode.split("_")[0]

    @property
    def kind(self) -> str | None:
        """load | store | atomic for a memory instruction of any space, else None."""
        parts = self.opcode.split("_")
        return parts[1] if len(parts) > 1 and parts[1] in ("load", "store", "atomic") else None

    @property
    def width(self) -> int:
        """Bits moved per lane by a memory instruction (32 unless its suffix says)."""
        for part in reversed(self.opcode.split("_")[2:]):
            if part in _WIDTH:
                return _WIDTH[part]
        return 32


_LABEL = re.compile(r"^(\.L\w+):")


def parse(listing: str) -> list[Instr]:
    """Every instruction of the kernel with the source line its `.loc` names."""
    return parse_with_labels(listing)[0]


def parse_with_labels(listing: str) -> tuple[list[Instr], dict[str, int]]:
    """parse's instructions, and each label (`.LBB0_2`) with the position of the
    instruction it marks (what a branch jumps to)."""
    files: dict[str, str] = {}
    out: list[Instr] = []
    labels: dict[str, int] = {}
    file, line = "", 0
    for text in listing.splitlines():
        if _END.match(text):
            break
        m = _LABEL.match(text)
        if m:
            labels[m.group(1)] = len(out)
            continue
        m = _FILE.match(text)
        if m:
            folder, name = (m.group(2), m.group(3)) if m.group(3) is not None else ("", m.group(2))
            files[m.group(1)] = os.path.join(folder, name) if folder else name
            continue
        m = _LOC.match(text)
        if m:
            file, line = files.get(m.group(1), ""), int(m.group(2))
            continue
        if _END.match(text):
            break
        m = _INSTR.match(text)
        if m:
            # each operand's first word: VOP3's trailing clamp / omod words dropped
            ops = tuple(o.split()[0] for o in (m.group(2) or "").split(",") if o.strip())
            out.append(Instr(m.group(1), file if line else "", line, ops))
    return out, labels


def is_global(i: Instr) -> bool:
    return i.space in MEMORY and i.kind in ("load", "store") and "lds" not in i.opcode


def mix(instrs: list[Instr]) -> sass.Mix:
    """The instruction mix in SASS's categories: global loads and stores by width,
    global-to-LDS copies (async_copies), MFMA, LDS ops, scratch (local), transcendentals
    (mufu), barriers, cross-lane permutes (shuffles), atomics, flat (generic) accesses."""
    m = sass.Mix(total=len(instrs))
    for i in instrs:
        op, space, kind = i.opcode, i.space, i.kind
        m.by_base[op] += 1
        if space in MEMORY and kind == "load" and "lds" in op:
            m.async_copies[i.width] += 1
        elif is_global(i):
            (m.global_loads if kind == "load" else m.global_stores)[i.width] += 1
            m.generic += space == "flat"
        elif space in MEMORY and kind == "atomic":
            m.atomics += 1
        if op.startswith(("v_mfma", "v_smfmac")):
            m.tensor_core["MFMA"] += 1
        elif space == "ds":
            if op.startswith(SHUFFLES):
                m.shuffles += 1
            else:
                m.shared[op] += 1
        elif space == "scratch":
            m.local[f"scratch_{kind}"] += 1
        elif op.startswith(TRANSCENDENTAL):
            m.mufu[op.split("_")[1]] += 1
        elif op == "s_barrier":
            m.barriers += 1
    m.rounding_leaks = [(i.file, i.line) for i in sass.rounding_leaks(instrs, ARITHMETIC)]
    return m


# Mnemonics whose first operand is not a register written: stores (an address first),
# branches, waits and barriers.
_NO_DESTINATION = ("global_store", "buffer_store", "flat_store", "scratch_store", "ds_write",
                   "ds_store", "s_waitcnt", "s_endpgm", "s_branch", "s_cbranch", "s_barrier",
                   "s_nop", "s_setprio", "s_sleep")

ARITHMETIC = sass.Arithmetic(mul=("v_mul_f32", "v_mul_f32_e32", "v_mul_f32_e64"),
                             fma=("v_fma_f32",),
                             writes=lambda i: not i.opcode.startswith(_NO_DESTINATION))


class LineAccess(sass.LineAccess):
    """The global loads or stores AMDGCN issues for one source line."""

    def describe(self) -> str:
        op = "global_load" if self.kind == "load" else "global_store"
        return ", ".join(f"{op}.{w} x{n}" for w, n in sorted(self.widths.items(), reverse=True))


def accesses_by_line(instrs: list[Instr]) -> dict[tuple[str, int, str], LineAccess]:
    """(file, line, kind) -> the widths of the global memory instructions it compiled to."""
    out: dict[tuple[str, int, str], LineAccess] = {}
    for i in instrs:
        if not is_global(i) or not i.line:
            continue
        key = (i.file, i.line, i.kind)
        acc = out.get(key)
        if acc is None:
            acc = out[key] = LineAccess(i.file, i.line, i.kind)
        acc.widths[i.width] += 1
    return out


# --- resources ---------------------------------------------------------------------------

_INFO = {"vgprs": r"; NumVgprs: (\d+)", "agprs": r"; NumAgprs: (\d+)",
         "total_vgprs": r"; TotalNumVgprs: (\d+)", "sgprs": r"; TotalNumSgprs: (\d+)",
         "scratch": r"; ScratchSize: (\d+)", "lds": r"; LDSByteSize: (\d+)",
         "compiler_occupancy": r"; Occupancy: (\d+)",
         "vgpr_spills": r"\.vgpr_spill_count:\s+(\d+)", "sgpr_spills": r"\.sgpr_spill_count:\s+(\d+)",
         "lds_static": r"\.group_segment_fixed_size:\s+(\d+)"}


def resources(listing: str) -> dict:
    """What the assembler reports of the kernel: VGPRs, AGPRs and their allocated total,
    SGPRs, scratch bytes per lane, LDS bytes per workgroup, spilled VGPRs and SGPRs, and
    the compiler's own occupancy (waves per SIMD). Read into the keys ptxas's report has
    too: registers (VGPRs), stack (scratch), spill_stores / spill_loads (bytes per lane of
    spilled VGPRs: the assembler counts spills, not reloads, so both are that count)."""
    out = {}
    for key, pattern in _INFO.items():
        m = re.search(pattern, listing)
        out[key] = int(m.group(1)) if m else 0
    spilled = 4 * out["vgpr_spills"]
    out.update(registers=out["vgprs"], stack=out["scratch"], spill_stores=spilled,
               spill_loads=spilled)
    return out


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def occupancy(limits: AmdArchLimits, num_warps: int, vgprs: int, sgprs: int,
              lds: int) -> Occupancy:
    """Workgroups of `num_warps` waves that one CU holds at once, using `vgprs` (VGPRs +
    AGPRs as allocated: TotalNumVgprs), `sgprs` and `lds` bytes each. A workgroup's waves
    spread over the CU's SIMDs; each SIMD holds at most max_waves_per_simd waves and as
    many as its VGPR file and the SGPRs allow, so the CU holds simds times that many waves
    in whole workgroups; LDS is allocated per workgroup. `per_simd` in the result: resident waves per SIMD."""
    vgpr_alloc = _round_up(max(vgprs, 1), limits.vgpr_alloc_unit)
    by_vgprs = 0 if vgprs > limits.max_vgprs_per_wave else \
        min(limits.max_waves_per_simd, limits.vgprs_per_simd // vgpr_alloc)
    by_sgprs = next((w for most, w in limits.sgpr_waves if sgprs <= most),
                    limits.sgpr_waves[-1][1])
    lds_alloc = _round_up(lds, limits.lds_alloc_unit)
    if lds > limits.lds_per_workgroup:
        by_lds = 0
    else:
        by_lds = limits.lds_per_cu // lds_alloc if lds_alloc else limits.max_warps_per_sm
    fits = num_warps <= limits.max_waves_per_workgroup

    def groups_of(waves_per_simd: int) -> int:  # workgroups whose waves fit the CU's SIMDs
        return waves_per_simd * limits.simds // num_warps if fits else 0

    found = {"waves": groups_of(limits.max_waves_per_simd),
             "workgroups": limits.max_workgroups_per_cu if num_warps > 1 else
             limits.max_warps_per_sm,
             "VGPRs": groups_of(min(limits.max_waves_per_simd, by_vgprs)),
             "SGPRs": groups_of(min(limits.max_waves_per_simd, by_sgprs)),
             "LDS": by_lds}
    groups = min(found.values())
    order = ("waves", "VGPRs", "LDS", "SGPRs", "workgroups")
    limiter = next(k for k in order if found[k] == groups) if groups else \
        next(k for k in order if found[k] == 0)
    waves = min(groups * num_warps, limits.max_warps_per_sm)
    return Occupancy(groups, waves, limits.max_warps_per_sm, limiter, found, vgpr_alloc,
                     lds_alloc, per_simd=waves / limits.simds)
