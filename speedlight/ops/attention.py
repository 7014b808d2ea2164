"""Flash attention: the custom op, `speedlight.attention` and the op's SPEC (at the
bottom). The checks are in ops/attention_checks.py, the launchers in
ops/attention_launch.py, the cases and cost in ops/attention_cases.py.

Layouts: q [batch, heads_q, seq_q, dim] and k, v [batch, heads_kv, seq_k, dim], or packed
[total, heads, dim] with int32 cu_seqlens_q/k [batch + 1]; see attention_launch.
"""

from __future__ import annotations

from typing import Optional

import torch

from speedlight import shapes
from speedlight.ops import attention_cases as cases
from speedlight.ops import attention_gluon
from speedlight.ops._checks import check_bool, check_choice
from speedlight.ops._dtensor import local_rows
from speedlight.ops.attention_checks import MAX_HEAD_DIM, check_arguments
from speedlight.ops.attention_launch import (ATTENTION_CONFIGS, attention_bwd, attention_fwd,
                                             launch_bwd, launch_fwd)
from speedlight.ops.registration import register_op
from speedlight.runtime import autocast_dtype
from speedlight.spec import KernelDesign, OpSpec

__all__ = ["attention", "attention_fwd", "attention_bwd", "SPEC", "MAX_HEAD_DIM"]


# --- registration: custom ops, fakes and autograd -----------------------------------------
# The ops take the checked arguments: the window as its sides (-1 unbounded, causal folded
# in), the options as Optional values.

def _registered_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
                    scale: float, softcap: Optional[float], left: int, right: int,
                    max_seqlen_q: Optional[int], max_seqlen_k: Optional[int],
                    num_splits: Optional[int], check_seqlens: bool):
    return launch_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, softcap, left, right,
                      max_seqlen_q, max_seqlen_k, num_splits, check_seqlens)


def _registered_bwd(do: Optional[torch.Tensor], dlse: Optional[torch.Tensor], q: torch.Tensor,
                    k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                    cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
                    scale: float, softcap: Optional[float], left: int, right: int,
                    max_seqlen_q: Optional[int], max_seqlen_k: Optional[int],
                    check_seqlens: bool):
    return launch_bwd(torch.zeros_like(o) if do is None else do, dlse, q, k, v, o, lse,
                      cu_seqlens_q, cu_seqlens_k, scale, softcap, left, right, max_seqlen_q,
                      max_seqlen_k, check_seqlens)


def _registered_fwd_gluon(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          cu_seqlens_q: Optional[torch.Tensor],
                          cu_seqlens_k: Optional[torch.Tensor], scale: float,
                          softcap: Optional[float], left: int, right: int,
                          max_seqlen_q: Optional[int], max_seqlen_k: Optional[int],
                          num_splits: Optional[int], check_seqlens: bool):
    return attention_gluon.launch_gluon_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, softcap, left,
                                      right, max_seqlen_q, max_seqlen_k, num_splits,
                                      check_seqlens)


def _fake(q, k, v, cu_seqlens_q, cu_seqlens_k, *_):
    """o with q's strides (the launcher's empty_like), and the fp32 lse."""
    lse_shape = (q.shape[1], q.shape[0]) if cu_seqlens_q is not None else tuple(q.shape[:3])
    return torch.empty_like(q), q.new_empty(lse_shape, dtype=torch.float32)


ATTENTION = register_op(
    "attention",
    # impl="gluon": the warp-specialized Gluon forward (ops/attention_gluon.py), the Triton
    # backward; no GPU has verified it yet, so it runs only when named
    forward={"triton": _registered_fwd, "gluon": _registered_fwd_gluon},
    outputs=("o", "lse"),
    fake=_fake,
    backward={"triton": _registered_bwd, "gluon": _registered_bwd},
    unverified=attention_gluon.UNVERIFIED,
    backward_fake=lambda do, dlse, q, k, v, *_: (torch.empty_like(q), torch.empty_like(k),
                                                 torch.empty_like(v)),
    grads=("q", "k", "v"),
    optional_grads=True,  # the lse is often unused: dlse None, not zeros
)


def _reduced_dims(arguments: dict) -> tuple[int, ...]:
    """The dims of q no rank may split (DTensor): the sequence and head dims; packed, the
    tokens too (a sequence may not cross ranks). Batch and heads may be sharded."""
    return (0, 2) if arguments.get("cu_seqlens_q") is not None else (2, 3)


def _dtensor_refused(arguments: dict) -> str | None:
    """Why sharded q, k, v cannot run on each rank's shards: heads split unevenly (each
    rank must hold whole GQA groups, q heads and kv heads split evenly, or a q head's kv
    head would sit on another rank), or a packed lse asked for."""
    q, k = arguments["q"], arguments["k"]
    if arguments.get("cu_seqlens_q") is not None and arguments.get("return_lse"):
        return ("the packed log-sum-exp is [heads, total], heads first, which the output "
                "placement (q's, heads on dim 1) does not describe; call with return_lse=False "
                "or on each rank's local tensors")
    heads = 1
    for mesh_dim, p in enumerate(q.placements):
        if p.is_shard() and p.dim % q.dim() == 1:
            n = q.device_mesh.size(mesh_dim)
            if q.shape[1] % (heads * n) or k.shape[1] % (heads * n):
                return (f"heads are split over {n} ranks, but q's {q.shape[1]} heads and "
                        f"k's {k.shape[1]} kv heads must both divide evenly so each rank "
                        f"holds whole GQA groups")
            heads *= n
    return None


@local_rows("q", "k", "v", over=_reduced_dims, refuse=_dtensor_refused)
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: float | None = None, window: tuple[int, int] | None = None,
              softcap: float | None = None, cu_seqlens_q: torch.Tensor | None = None,
              cu_seqlens_k: torch.Tensor | None = None, max_seqlen_q: int | None = None,
              max_seqlen_k: int | None = None, return_lse: bool = False,
              num_splits: int | None = None, check_seqlens: bool = True,
              impl: str | None = None):
    """softmax(cap(q k^T * scale) + mask) v by flash attention (fp32 softmax statistics).

    q [batch, heads_q, seq_q, dim], k and v [batch, heads_kv, seq_k, dim] (heads_kv
    dividing heads_q: GQA/MQA without copies), any strides with the last dim contiguous;
    or packed [total, heads, dim] with int32 cu_seqlens_q/k [batch + 1]. Positions are
    aligned at the end (query row r at r + seq_k - seq_q): `causal` hides later keys,
    `window=(left, right)` keeps keys in [i - left, i + right] (-1 unbounded),
    `softcap=c` applies c * tanh(s / c) to the scaled scores; scale defaults to
    dim ** -0.5. A query that sees no key gets zeros. Returns o in q's shape and dtype,
    and with return_lse=True also the fp32 log-sum-exp [batch, heads_q, seq_q]
    ([heads_q, total] packed; -inf where no key is seen).

    Packed inputs: check_seqlens (default) reads cu_seqlens on the host once per call (a
    sync) and raises ValueError unless each starts at 0, never decreases and ends at the
    packed length, and max_seqlen_q/k, when given, are at least the longest sequence
    (None: the longest is read). check_seqlens=False reads nothing (for CUDA graphs and
    compiled steps; give max_seqlen_q/k then, else every sequence is launched as long as
    the packed tensor): whatever the values, no kernel reads or writes outside q, k, v and
    the outputs, each sequence being clamped into the packed rows and cut at max_seqlen,
    and rows in no sequence come back as zeros (o, dq, dk, dv; lse -inf).

    Masked positions (later keys under causal, keys outside the window, the ends of
    packed sequences) never affect any output or gradient, NaN and inf included, as in
    the flash and cuDNN backends: each row's softmax runs over the keys it sees only.
    Faults it sees propagate: a NaN score gives the row o and lse NaN (lse +inf for a
    +inf score), dq NaN, and dk and dv NaN at every key it sees. SDPA's math backend,
    which adds -inf masks and multiplies by zero probabilities, spreads a masked NaN to
    every row instead; speedlight does not copy that.

    Range: the softmax statistics are fp32, as in every flash kernel: the backward
    recomputes p = exp(s - lse) from an fp32 lse (rounded by |lse| * 2^-24) and takes
    delta = rowsum(do * o) from the rounded o, so the error of p and of dq, dk grows with
    the scaled scores |s|. Results pass the float64 comparison for |s| up to about 1e3
    (the quick suite's `amplitude` case: q, k ~ 16 at head dim 64); near 4e3 dq and dk
    start to fail it, and at 3e8 (bf16 q, k ~ 1e4) dv is off by up to 2^33. torch's flash
    SDPA backend computes the same way and shares the bound (on a CPU its dv is inf at
    3e8). No input is clamped.

    num_splits forces the key range of each query block to be split across that many
    programs and combined (decode; None picks it for the GPU).
    DTensor: q, k and v on one mesh with one placement, sharded over batch or heads
    (whole GQA groups per rank; packed, heads only), cu_seqlens whole on every rank.
    Differentiable in q, k and v (and through the lse); works under torch.compile(fullgraph=True).
    Under torch.autocast, q, k and v are first cast to its dtype (as torch's
    scaled_dot_product_attention is there: a model may hand over a q promoted to fp32 by
    its q_norm beside a bf16 v), and o has that dtype.

    impl: "triton" (the default) or "gluon": the warp-specialized Gluon forward on Hopper
    (ops/attention_gluon.py; the Triton kernels where its design does not apply, and for
    the backward), not yet verified on a GPU; GluonUnavailable where it cannot run.
    """
    amp = autocast_dtype(q)
    if amp is not None:
        q, k, v = (t.to(amp) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                   for t in (q, k, v))
    left, right = check_arguments(
        q, k, v, causal=causal, scale=scale, window=window, softcap=softcap,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k, num_splits=num_splits, check_seqlens=check_seqlens)
    check_bool("return_lse", return_lse)
    check_choice("impl", impl, ATTENTION.impls, optional=True)
    if impl == "gluon":
        attention_gluon.check_gluon(q)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    o, lse = ATTENTION(q, k, v, cu_seqlens_q, cu_seqlens_k, scale,
                       None if softcap is None else float(softcap), left, right,
                       max_seqlen_q, max_seqlen_k, num_splits, check_seqlens, impl=impl)
    return (o, lse) if return_lse else o


# --- OpSpec --------------------------------------------------------------------------------

# One program of 8 warps per SM (an eighth of Hopper's 64 warps) is the flash design: its
# 128 x 64 score tile, fp32 accumulator and K/V pipeline fill the registers and shared
# memory, and the tensor cores, not warp count, hide the latency.
# The shortfall sm_100a's backward records (tests/inspect/test_blackwell.py holds it to it)
_BWD_SM100 = ("a shortfall on sm_100a: Triton 3.6 lowers the dk/dv pass's dots to tcgen05 "
              "MMA with dk and dv accumulated in tensor memory (512 columns), but moving the "
              "[BLOCK_N, D] tiles between tensor memory and registers for the softmax "
              "gradient runs at the 255-register cap and spills (about 200 bytes at head dim "
              "128); the sm_90a tiles are kept until a B200 can time smaller ones")
_FLASH = ("flash tiles: one 8-warp program per SM; k and v re-read per query block (and q, "
          "do per key block backward), as the cost model counts; no access width is held: "
          "the loop's operand tiles arrive in shared memory by TMA (tensor descriptors made "
          "on the device per sequence, pipelined: min_stages), the rest by pointer, and "
          "lse/delta are one fp32 per row (32-bit)")

_FLASH_SM100 = ("flash tiles as on sm_90a; on sm_100a the K and V tiles of the loop arrive by "
                "TMA (tensor descriptors made on the device per sequence and kv head, which "
                "zero-fill rows past the sequence), q once per program by 128-bit loads")

_FLASH_GFX942 = ("flash tiles sized for gfx942 (launch sizing on an AMD target: the tiles of "
                 "fp32 or head dim 256 on every dtype, two stages, one operand buffer in LDS, "
                 "so no kernel passes the 64 KB of LDS a workgroup may have or spills); the "
                 "dots on MFMA, the operand tiles by global/buffer loads (no TMA)")
_GLUON_SM90 = ("warp-specialized (FlashAttention-3): one program of 12 warps per SM (19%), "
               "the kernel's warpgroup and a second one consuming 64 query rows each in "
               "ping-pong at 240 registers, one producer warp at 24 loading Q, K and V by TMA "
               "into a two-stage ring; o stored by TMA, lse one fp32 per row (32-bit)")
_GLUON_SM100 = ("warp-specialized for tcgen05: one program of 12 warps per SM (19%), two "
                "softmax warpgroups of 128 query rows at 240 registers, an MMA warp and a "
                "producer warp at 24; S and O accumulate in tensor memory (384 of 512 "
                "columns), K and V by TMA in a three-stage ring; o stored by 128-bit stores "
                "of 32-column slices, lse one fp32 per row (32-bit)")
# the matrix kernels on gfx942: MFMA, no TMA, one operand buffer in LDS
_MFMA = KernelDesign(min_occupancy=0.125, mma="MFMA", vector_bits=0, why=_FLASH_GFX942)
# The fault kernels: at most one program per SM, each reading the fault counts of its
# blocks and, only for a block whose boundary blocks met a NaN or inf, redoing it exactly
_FAULTS_WHY = ("the fault pass: one wave of programs that read one count per block and move "
               "on (finite inputs); a block with a fault is redone exactly on small tiles "
               "(its NaN and inf replaced, then added back at the visible pairs)")
_FAULTS_AMD = KernelDesign(min_occupancy=0.125, vector_bits=0, spills=True,
                           why=_FAULTS_WHY + "; on gfx942 its exact path spills to scratch (the "
                               "rare path only)")
_FAULTS = KernelDesign(min_occupancy=0.125, vector_bits=0, why=_FAULTS_WHY,
                       per_arch=(("gfx942", _FAULTS_AMD), ("gfx950", _FAULTS_AMD)))
_BWD_SPILLS = ("the exact dk/dv and dq paths in one kernel hold enough tiles to spill a few "
               "bytes (tens on sm_90a), on the rare path only")
_BWD_FAULTS = KernelDesign(
    min_occupancy=0.125, vector_bits=0, spills=True, why=f"{_FAULTS_WHY}; {_BWD_SPILLS}",
    per_arch=((100, KernelDesign(min_occupancy=0.125, vector_bits=0, spills=True,
                                 why=f"a shortfall on sm_100a: {_BWD_SPILLS}")),))
SPEC = OpSpec(
    impl=attention,
    implementations=attention_gluon.gluon_implementations(attention, ATTENTION),
    make_inputs=cases.make_inputs,
    cost=cases.cost,
    suites=shapes.suites(cases.cases),
    grad_inputs=("q", "k", "v"),
    skip=cases.skip,
    notes=("Flash attention, causal/window/softcap/GQA/varlen/split-KV decode. Bytes count "
           "k and v once per 128-query block per q head (and q, do once per 128-key block "
           "backward): what a flash kernel reads, L2 aside. bf16 on CPU: the interpreter's "
           "tl.dot is wrong in bf16, so loaded bf16 tiles are upcast to fp32 there (products "
           "of bf16 values are exact in fp32: the GPU's math up to summation order)."),
    family="attention",
    for_model=cases.for_model,
    count_rows=cases.count_rows,
    case_of=cases.case_of,
    recognise=cases.recognise,
    configs=ATTENTION_CONFIGS,  # the forward's HIP knobs: a space on AMD targets only
    fuses=("eager or SDPA attention: flash attention (scores never written to memory; causal, "
           "sliding window, softcap, GQA, variable length)"),
    patches="attention",
    kernels={
        "_attention_fwd_kernel": KernelDesign(
            min_occupancy=0.125, mma="HGMMA", tma=True, min_stages=2, vector_bits=0, why=_FLASH,
            # sm_100a: tcgen05 MMA (UTCHMMA), the scores and the output accumulated in
            # tensor memory, K and V tiles loaded by TMA (device-made descriptors)
            per_arch=((100, KernelDesign(min_occupancy=0.125, mma="UTCHMMA", tma=True,
                                         vector_bits=0, why=_FLASH_SM100)),
                      ("gfx942", _MFMA), ("gfx950", _MFMA))),
        "_attention_bwd_dkdv_kernel": KernelDesign(
            min_occupancy=0.125, mma="HGMMA", tma=True, vector_bits=0, why=_FLASH,
            per_arch=((100, KernelDesign(min_occupancy=0.125, mma="UTCHMMA", vector_bits=0,
                                         spills=True, why=_BWD_SM100)),
                      ("gfx942", _MFMA), ("gfx950", _MFMA))),
        "_attention_bwd_dq_kernel": KernelDesign(
            min_occupancy=0.125, mma="HGMMA", tma=True, vector_bits=0, why=_FLASH,
            per_arch=((100, KernelDesign(min_occupancy=0.125, mma="UTCHMMA", vector_bits=0,
                                         why=_FLASH)),
                      ("gfx942", _MFMA), ("gfx950", _MFMA))),
        # impl="gluon" (ops/attention_gluon.py): FlashAttention-3's roles on sm_90a
        "_attention_fwd_gluon_kernel": KernelDesign(
            min_occupancy=0.1875, mma="HGMMA", tma=True, min_stages=2, vector_bits=0,
            partitions=((4, 240), (1, 24)), why=_GLUON_SM90),
        "_attention_fwd_gluon_sm100_kernel": KernelDesign(
            min_occupancy=0.1875, mma="UTCHMMA", tma=True, min_stages=3, vector_bits=128,
            partitions=((4, 240), (1, 24), (1, 24)), why=_GLUON_SM100),
        "_attention_fwd_faults_kernel": _FAULTS,
        "_attention_bwd_faults_kernel": _BWD_FAULTS,
        "_attention_combine_kernel": KernelDesign(min_occupancy=0.25, vector_bits=32,
                                                  why="one query row per program: its fp32 "
                                                      "partials of one head row each"),
    },
)
