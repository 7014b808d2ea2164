"""Issue 32 item 3: CI compiles every registered op's kernels for sm_90a and sm_100a and
holds each to its design (spec.KernelDesign, guard.check_kernel). The memory-bound family
is held by test_guards (both targets, from the registry), the GEMMs and grouped GEMM by
test_matmul_guard (sm_90a), attention by test_attention_design (sm_90a), all three matrix
ops' Blackwell designs by test_blackwell (sm_100a). The rest are held here, compile only,
at the case `speedlight inspect OP` reports by default (a model's shape at 4096 tokens,
its launches recorded on meta tensors: nothing runs). A new op must join one of these
guards: test_every_op_is_guarded_on_both_targets names it otherwise.
"""

import pytest
import torch

from speedlight import registry
from speedlight.inspect import guard
from speedlight.inspect.case_report import analyse_kernel
from speedlight.inspect.command import representative
from speedlight.inspect.launches import capture_case
from speedlight.launch import for_target
from speedlight.target import resolve
from tests.inspect.conftest import GUARD_TABLE, TARGET

BLACKWELL = resolve("sm_100a")
SPECS = {s.name: s for s in registry.builtin_specs()}
MEMORY_BOUND = {n for n, s in SPECS.items() if s.family == "memory-bound"}  # test_guards
# the op's kernels each other file compiles, per target
ELSEWHERE = {
    "sm_90a": MEMORY_BOUND | {"matmul", "gated_matmul", "grouped_matmul", "attention"},
    "sm_100a": MEMORY_BOUND | {"matmul", "gated_matmul", "attention"},
}
HERE = {"sm_90a": ("moe_experts", "linear_cross_entropy"),
        "sm_100a": ("grouped_matmul", "moe_experts", "linear_cross_entropy")}
# kernels an op shares with one guarded elsewhere on both targets, under the same design
# (moe_experts' grouped GEMMs are grouped_matmul's): not compiled again here, except
# moe_experts' launches that gather an operand's rows by index (GATHER, GATHER_OF: the
# backward's dout and hidden read in expert order), which grouped_matmul never makes
SHARED = {"_grouped_matmul_kernel", "_grouped_matmul_dw_kernel"}


def _shared(op: str, launch) -> bool:
    """Whether the launch is one grouped_matmul's own cases compile."""
    if op == "grouped_matmul" or launch.kernel not in SHARED:
        return False
    declared = {a.name: a.value for a in launch.args if a.name in launch.declared}
    return not declared.get("GATHER") and not declared.get("GATHER_OF")
ITEMS = [pytest.param(SPECS[op], t, id=f"{t.arch_name}-{op}")
         for t in (TARGET, BLACKWELL) for op in HERE[t.arch_name]]


def test_every_op_is_guarded_on_both_targets():
    for arch in ("sm_90a", "sm_100a"):
        missing = set(SPECS) - ELSEWHERE[arch] - set(HERE[arch])
        assert not missing, f"{arch}: no CI guard compiles {sorted(missing)}"


# one compile of every kernel serves every test here: keep them on one xdist worker
pytestmark = pytest.mark.xdist_group("every-kernel")


@pytest.fixture(scope="session")  # once per worker, however its tests interleave
def compiled(compiler) -> dict:
    """Every item's launches, captured dry, then compiled in one batch per target (each
    batch starts its worker processes once)."""
    out, launches = {}, {}
    for t in (TARGET, BLACKWELL):
        for op in HERE[t.arch_name]:
            spec = SPECS[op]
            case = representative(spec, torch.bfloat16)
            with for_target(t):
                capture = capture_case(spec, case, "meta", arch=t.arch, mode="dry")
            out[(op, t.arch_name)] = (case, capture)
            launches.setdefault(t.arch_name, []).extend(
                l for l in capture.launches if not _shared(op, l))
    binaries = {arch: compiler.compile(ls, t) for t in (TARGET, BLACKWELL)
                for arch, ls in launches.items() if arch == t.arch_name}
    return {k: (case, capture, binaries[k[1]]) for k, (case, capture) in out.items()}


@pytest.mark.parametrize("spec,target", ITEMS)
def test_default_case_compiles_every_kernel_to_its_design(spec, target, compiled):
    case, capture, binaries = compiled[(spec.name, target.arch_name)]
    # (linear_cross_entropy computes its gradients in the forward; its backward's kernel
    # scales them unless the upstream gradient is 1)
    assert {l.direction for l in capture.launches} == {"fwd", "bwd"}
    short, seen = [], set()
    for launch in capture.launches:
        if _shared(spec.name, launch):
            continue
        key = launch.key(target.arch_name)
        k = analyse_kernel(launch, binaries[key], target, target.sku,
                           spec.design(launch.kernel, target.arch))
        short += [str(s) for s in guard.check_kernel(k)]
        if key not in seen:
            seen.add(key)
            GUARD_TABLE.append(
                f"{target.arch_name} {spec.name:20s} {launch.direction} {k.name:32s} regs "
                f"{k.registers:3d} spill {k.spill_stores:3d} occ {k.occupancy.fraction:4.0%} "
                f"{' '.join(f'{op} x{n}' for op, n in sorted(k.mix.tensor_core.items()))}"
                f"  [{case.label}]")
    assert seen, "no kernel compiled"
    assert not short, "\n".join(short)
