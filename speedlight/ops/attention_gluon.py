"""Attention's Gluon implementation (impl="gluon"): the warp-specialized forward of
kernels/attention/gluon_fwd.py where its design applies, the Triton kernels elsewhere and
for the backward (the Triton backward reads the o and lse it writes, in the same layout).

Where it runs: an NVIDIA GPU of compute capability 9.x (Hopper: the wgmma kernel) or 10.x
(Blackwell: the tcgen05 kernel), with a Triton whose Gluon has what the kernels need
(kernels/attention/gluon_api.missing: Triton 3.6 and later). Gluon kernels do not run
under the Triton interpreter, so on a CPU impl="gluon" is refused (`gluon_unavailable`,
GluonUnavailable); `speedlight inspect --impl gluon` still records its launches and
compiles them for sm_90a or sm_100a on any machine.

Which calls the Gluon forward takes (`why_not_gluon`): fp16 or bf16, head dim 32 to 256
(to 128 on Blackwell: tensor memory's 512 columns hold two 128-row O tiles and their S
tiles up to that), every tile 16-byte aligned for TMA (q, k, v and o base addresses and
their batch, head and row strides), no forced split of the keys and more than DECODE_ROWS
queries (decode keeps the Triton kernel's split-KV path). Any other call runs the Triton
forward, exactly as impl="triton" would; the reason is `why_not_gluon`'s sentence.

No GPU has run the Gluon kernel yet: the implementation is registered unverified (never
an op's default) and named-only (verify, bench and the plan run it when asked for by
name), until scripts/gpu/attention_gluon.py verifies it on a GPU.
"""

from __future__ import annotations

import functools

import torch
import triton

from speedlight.kernels.attention import gluon_api
from speedlight.launch import planned_arch
from speedlight.ops import attention_launch
from speedlight.ops._gemm import ensure_allocator
from speedlight.runtime import only_recorded

# A forward of at most this many queries (the longest sequence) keeps the Triton kernel:
# its 16-row blocks and split keys serve decode; the Gluon program's 128 rows would idle.
DECODE_ROWS = 16
# The GPUs the Gluon forward is written for, by compute capability major: 9 (sm_90a's
# wgmma, TMA and setmaxnreg) and 10 (sm_100a's tcgen05 and tensor memory).
HOPPER, BLACKWELL = 9, 10
# Query rows per program: two consumers of 64 rows (wgmma) or 128 (tcgen05).
BLOCK_M = {HOPPER: 128, BLACKWELL: 256}
CONSUMERS = 2
# Both launch 4 warps (the first consumer) plus the worker partitions, 12 warps in all
# (3 warpgroups): 168 registers a thread at launch, 504 per thread of a warpgroup, given
# out as 240 to each consumer and 24 to the producer warp (and the MMA warp on Blackwell).
LAUNCH = dict(num_warps=4, maxnreg=168)
REGS = dict(PRODUCER_REGS=24, CONSUMER_REGS=240)


class GluonUnavailable(RuntimeError):
    """impl="gluon" cannot run here (no GPU, another architecture, a Triton without what
    the kernels need); the message says which."""


def gluon_unavailable(device: torch.device | str) -> str | None:
    """Why impl="gluon" cannot run on `device`, or None."""
    reason = gluon_api.missing()
    if reason:
        return f"impl='gluon': {reason}"
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available() \
            or getattr(torch.version, "hip", None):
        return ("impl='gluon': Gluon kernels run only on an NVIDIA GPU (the Triton "
                f"interpreter does not run them); the tensors are on {device}")
    major, minor = torch.cuda.get_device_capability(device)
    if major not in (HOPPER, BLACKWELL):
        return (f"impl='gluon': the Gluon forward is written for Hopper (sm_90a) and "
                f"Blackwell (sm_100a); this GPU is sm_{major}{minor}")
    return None


def check_gluon(q: torch.Tensor) -> None:
    """Raise GluonUnavailable when impl="gluon" cannot run on q's device, before any
    allocation; a launch capture on meta tensors (speedlight inspect) asks only Triton."""
    if only_recorded(q):
        reason = gluon_api.missing()
        reason = reason and f"impl='gluon': {reason}"
    else:
        reason = gluon_unavailable(q.device)
    if reason:
        raise GluonUnavailable(reason)


def _aligned(t: torch.Tensor, strides) -> bool:
    """Whether TMA can address t's tiles: 16-byte aligned base and strides."""
    return t.data_ptr() % 16 == 0 and all(s * t.element_size() % 16 == 0 for s in strides)


def _strides(t: torch.Tensor, varlen: bool) -> tuple[int, int, int]:
    """(batch, head, row) strides of a q/k/v/o-like tensor; packed: batch 0."""
    return (0, t.stride(1), t.stride(0)) if varlen else (t.stride(0), t.stride(1), t.stride(2))


def why_not_gluon(q, k, v, varlen: bool, seq_q: int, num_splits) -> str | None:
    """Why this call runs the Triton forward rather than the Gluon one (None: Gluon's)."""
    arch = planned_arch(q.device)
    if arch is None or arch // 10 not in (HOPPER, BLACKWELL):
        return f"the Gluon forward is written for sm_90a and sm_100a (this launch: {arch})"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"the Gluon forward takes fp16 or bf16 (got {q.dtype})"
    top = 256 if arch // 10 == HOPPER else 128
    if not 32 <= q.shape[-1] <= top:
        return (f"the Gluon forward takes head dims 32 to {top} on sm_{arch} "
                f"(got {q.shape[-1]})")
    if num_splits is not None and num_splits > 1:
        return "num_splits asks for the Triton kernel's split keys"
    if seq_q <= DECODE_ROWS:
        return f"decode ({seq_q} queries) keeps the Triton kernel's split-KV path"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1 or not _aligned(t, _strides(t, varlen)):
            return (f"{name}'s base or strides are not 16-byte aligned (TMA needs them): "
                    f"strides {tuple(t.stride())}")
    return None


def _tiles(major: int, head_dim: int, softcap: bool) -> dict:
    """BLOCK_N, BLOCK_D and STAGES, so one program fills an SM's 227 KB of shared memory
    without passing it and no role spills. Hopper: 128-key blocks in a two-stage K/V ring
    up to head dim 128 (160 KB at 128), 64-key blocks at 256 (192 KB); with a softcap half
    as many keys (its tanh on a consumer's 64 x 128 scores spilled 564 bytes at 240
    registers, 8 at head dim 256 with 64 keys; none at 64 and 32). Blackwell: 64-key
    blocks in three stages (192 KB at head dim 128 with the two 128-row Q tiles and P
    buffers)."""
    block_d = max(32, triton.next_power_of_2(head_dim))
    if major == BLACKWELL:
        return dict(BLOCK_N=64, BLOCK_D=block_d, STAGES=3)
    block_n = 128 if block_d <= 128 else 64
    return dict(BLOCK_N=block_n // 2 if softcap else block_n, BLOCK_D=block_d, STAGES=2)


# --- the launcher ---------------------------------------------------------------------------

def launch_gluon_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, softcap, left, right,
                     max_seqlen_q, max_seqlen_k, num_splits, check_seqlens):
    """attention_launch.launch_fwd's contract (checked arguments, the window as its sides),
    by the Gluon kernel where why_not_gluon allows, else by attention_launch.launch_fwd.
    The Gluon kernel is followed by the Triton forward's fault pass
    (attention_launch.launch_fwd_faults): each consumer counts the NaN and inf in the o it
    wrote, and the query blocks of a consumer that counted one are redone exactly, so a
    NaN or inf the mask hides never reaches an output (on finite inputs every count is 0:
    one wave of programs reads them and moves on)."""
    check_gluon(q)
    from speedlight.kernels.attention import gluon_fwd

    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    pb = attention_launch.Problem(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  check_seqlens)
    if q.numel() == 0 or k.numel() == 0 or pb.seq_k == 0 \
            or why_not_gluon(q, k, v, pb.varlen, pb.seq_q, num_splits):
        return attention_launch.launch_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, softcap,
                                           left, right, max_seqlen_q, max_seqlen_k, num_splits,
                                           check_seqlens)
    left, right = pb.sides(left, right)
    o = pb.new_like(q)  # rows in no sequence (unchecked cu_seqlens) stay zeros, lse -inf
    if not _aligned(o, pb.strides(o)):  # empty_like keeps q's (aligned) strides
        o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if not pb.exact:
            o.zero_()
    lse = pb.new(pb.lse_shape, q, float("-inf"))
    scale = pb.head_dim ** -0.5 if scale is None else float(scale)
    major = planned_arch(q.device) // 10
    kernel = (gluon_fwd._attention_fwd_gluon_kernel if major == HOPPER
              else gluon_fwd._attention_fwd_gluon_sm100_kernel)
    m_blocks = triton.cdiv(pb.seq_q, BLOCK_M[major])
    # one count per consumer (BLOCK_M // CONSUMERS query rows), every one written
    faults = torch.empty((pb.batch, pb.heads_q, m_blocks * CONSUMERS, 1), dtype=torch.int32,
                         device=q.device)
    tiles = _tiles(major, pb.head_dim, softcap is not None)
    ensure_allocator()  # the kernels make their TMA descriptors on the device
    kernel[(m_blocks * pb.batch * pb.heads_q,)](
        q, k, v, o, lse, faults, pb.cu_q, pb.cu_k, m_blocks, *pb.sizes(), pb.heads_q, pb.group,
        pb.head_dim, scale, float(softcap or 1.0), left, right, *pb.strides(q),
        *pb.strides(k), *pb.strides(v), *pb.strides(o), *pb.lse_strides(lse),
        VARLEN=pb.varlen, WINDOW=left >= 0 or right >= 0, SOFTCAP=softcap is not None,
        FOLD=softcap is None and scale > 0, **tiles, **REGS, **LAUNCH)
    attention_launch.launch_fwd_faults(pb, q, k, v, o, lse, faults, BLOCK_M[major] // CONSUMERS,
                                       tiles["BLOCK_N"], scale, softcap, left, right)
    return o, lse


# --- the OpSpec side -------------------------------------------------------------------------

# Implementations no GPU run has verified yet: never the default, labelled in every row.
UNVERIFIED = ("gluon",)


def gluon_implementations(public, op) -> dict:
    """Attention's implementations: the Triton kernels, and this Gluon forward (unverified,
    and run only by name while no GPU has run it: Implementation.named_only)."""
    from speedlight.spec import Implementation

    verified = "gluon" not in op.unverified
    return {"triton": Implementation(public),
            "gluon": Implementation(functools.partial(public, impl="gluon"), "gluon",
                                    verified=verified, unavailable=gluon_unavailable,
                                    named_only=not verified)}
