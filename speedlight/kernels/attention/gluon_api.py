"""The one place the Gluon kernels meet Gluon's API where it moved between Triton releases,
chosen by feature (what the installed Triton has), never by version string.

    tma_load(desc, coord, barrier, smem, pred)    Triton 3.6: tma.async_copy_global_to_shared
                                                  later: tma.async_load (the old name raises)
    tma_store(desc, coord, smem)                  3.6: tma.async_copy_shared_to_global
                                                  later: tma.async_store
    tmem_reg_layout(dtype, shape, tmem, warps)    3.6: blackwell.get_tmem_reg_layout
                                                  later: the descriptor type's get_reg_layout

`missing()` says what the attention kernels need and this Triton lacks (None when nothing):
ops/attention_gluon.py refuses impl="gluon" with that sentence, and the tests skip with it.
"""

from __future__ import annotations

import importlib


def missing() -> str | None:
    """Why the Gluon attention kernels cannot be built with this Triton, or None."""
    try:
        gl = importlib.import_module("triton.experimental.gluon.language")
        hopper = importlib.import_module("triton.experimental.gluon.language.nvidia.hopper")
        blackwell = importlib.import_module(
            "triton.experimental.gluon.language.nvidia.blackwell")
    except ImportError as e:
        return f"this Triton has no Gluon for NVIDIA ({e})"
    import inspect

    needs = {
        "gl.warp_specialize": getattr(gl, "warp_specialize", None),
        "hopper.warpgroup_mma": getattr(hopper, "warpgroup_mma", None),
        "hopper.tma.make_tensor_descriptor": getattr(hopper.tma, "make_tensor_descriptor", None),
        "blackwell.tcgen05_mma": getattr(blackwell, "tcgen05_mma", None),
        "blackwell.allocate_tensor_memory": getattr(blackwell, "allocate_tensor_memory", None),
    }
    absent = [name for name, fn in needs.items() if fn is None]
    if absent:
        return f"this Triton's Gluon lacks {', '.join(absent)}"
    params = list(inspect.signature(gl.warp_specialize).parameters)
    if params[:3] != ["functions_and_args", "worker_num_warps", "worker_num_regs"]:
        return ("this Triton's gl.warp_specialize takes (" + ", ".join(params[:6]) + "), not "
                "a list of (partition, arguments) pairs with per-partition warps and registers "
                "(Triton 3.6 and later)")
    if _tma_names(hopper.tma) is None:
        return "this Triton's Gluon TMA has neither async_load/async_store nor the 3.6 names"
    if _tmem_layout_fn(blackwell) is None:
        return "this Triton's Gluon has no register layout for tensor memory loads"
    return None


def _tma_names(tma):
    """(load, store) of the installed Gluon's TMA copies, or None."""
    if hasattr(tma, "async_load") and hasattr(tma, "async_store"):
        return tma.async_load, tma.async_store
    if hasattr(tma, "async_copy_global_to_shared") and hasattr(tma, "async_copy_shared_to_global"):
        return tma.async_copy_global_to_shared, tma.async_copy_shared_to_global
    return None


def _tmem_layout_fn(blackwell):
    """A function (dtype, shape, tensor-memory layout, warps) -> register layout, or None."""
    get = getattr(blackwell, "get_tmem_reg_layout", None)
    if get is not None:
        return lambda dtype, shape, layout, warps: get(dtype, shape, layout, warps)
    ty = getattr(blackwell, "tensor_memory_descriptor_type", None)
    if ty is not None and hasattr(ty, "get_reg_layout"):
        return lambda dtype, shape, layout, warps: ty(dtype, shape, layout,
                                                      shape).get_reg_layout(warps)
    return None


# --- the names the kernels call (bound at import, None where this Triton lacks them: the
# kernels are launched or compiled only after ops/attention_gluon.py has asked missing()) --

try:
    from triton.experimental import gluon as _gluon
    from triton.experimental.gluon.language.nvidia import blackwell as _blackwell
    from triton.experimental.gluon.language.nvidia.hopper import tma as _tma
except ImportError:  # no Gluon: nothing below is ever called
    _gluon = _blackwell = _tma = None

tma_load, tma_store = (_tma_names(_tma) if _tma is not None else None) or (None, None)


def _reg_layout_by_type(dtype, shape, tmem_layout, num_warps):
    """The register layout of a [shape] tensor-memory load/store by num_warps warps
    (Triton after 3.6: the descriptor type's get_reg_layout)."""
    from triton.experimental.gluon.language.nvidia.blackwell import (
        tensor_memory_descriptor_type)
    return tensor_memory_descriptor_type(dtype, shape, tmem_layout, shape).get_reg_layout(
        num_warps)


if _blackwell is not None and hasattr(_blackwell, "get_tmem_reg_layout"):
    tmem_reg_layout = _blackwell.get_tmem_reg_layout  # 3.6: a constexpr function already
elif _gluon is not None:
    tmem_reg_layout = _gluon.constexpr_function(_reg_layout_by_type)
else:
    tmem_reg_layout = _reg_layout_by_type
