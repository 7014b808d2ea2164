"""Rotary position embedding with the Hugging Face `apply_rotary_pos_emb` contract.

q_rot = q * cos + rotate(q) * sin on the first rot_dim = cos.shape[-1] dims of every head
(the rest pass through), and the same for k, in one launch whatever the head counts (GQA).
Rotate-half pairs (Llama, NeoX) or interleaved pairs (GPT-J); cos/sin either per token
([batch, seq, rot_dim], as HF's rotary embeddings return them) or a cache [max_pos,
rot_dim] read at position_ids inside the kernel. q and k are read through their strides
(a [batch, heads, seq, head_dim] transpose or a slice of a fused qkv projection is not
copied). fp32 arithmetic; outputs in q's dtype. cos and sin take no gradient.
"""

from __future__ import annotations

import math

import torch
import triton

from speedlight import shapes
from speedlight.kernels.rope import _rope_kernel
from speedlight.launch import planned_amd_arch, planned_sm_count
from speedlight.ops._checks import check_bool, check_same_device, check_same_dtype, check_tensor
from speedlight.ops._dtensor import local_rows
from speedlight.ops._suites import is_call_of, skip_huge_on_cpu
from speedlight.ops.registration import register_op
from speedlight.runtime import check_runtime, describe
from speedlight.spec import Case, Chain, Cost, KernelDesign, OpSpec, generator, rand_tensor

INT_DTYPES = (torch.int32, torch.int64)


# --- launchers (usable without autograd) --------------------------------------------------

# A GPU program's tiles, in bytes of one load: tokens per program grow until the heads of
# the tensor with fewer (k under GQA) fill MIN_TILE, and heads per step grow when there are
# too few tokens; num_warps gives every thread one 16-byte vector of the smallest tile that
# fills a warp's vectors (a warp moves WARP_VECTORS), and no tile gives it more than two.
MIN_TILE = 1024
MAX_TILE = 4096
WARP_VECTORS = 32 * 16


def _tiles(n_tokens: int, q_heads: int, k_heads: int, half: int, n_pass: int, itemsize: int,
           table_itemsize: int, interleaved: bool, device: torch.device) -> dict:
    """Block sizes: a [BLOCK_T tokens, BLOCK_H heads, BLOCK_R pairs] tile per step, q's heads
    then k's.

    On a GPU (or the launch context's target), 128-bit accesses whatever the head counts:
    every tile that fills a warp's vectors (q and k, a token tile's cos/sin rows, the
    pass-through dims) gives each thread one or two 16-byte vectors per load (pass-through
    dims, copied without conversion, may give more). Tokens per program are not cut to make
    more programs: a program's steps are its heads, so fewer tokens would not shorten a small
    launch, only narrow its accesses. Under the interpreter (milliseconds per program) tiles
    of up to 16K elements and 16 heads: few programs, yet small cases still cross program
    and head-block boundaries."""
    block_r = triton.next_power_of_2(half)
    block_p = triton.next_power_of_2(n_pass) if n_pass else 1
    q_p2 = triton.next_power_of_2(max(q_heads, 1))
    k_p2 = triton.next_power_of_2(max(k_heads, 1))
    fewer, more = min(q_p2, k_p2), max(q_p2, k_p2)
    if planned_sm_count(device):
        pair = 2 if interleaved else 1  # an interleaved load moves both members of a pair
        load = block_r * pair * itemsize  # bytes of one load of one head of one token
        block_t = min(16, triton.next_power_of_2(n_tokens),
                      triton.next_power_of_2(triton.cdiv(MIN_TILE, fewer * load)))
        block_h = min(more, max(fewer, triton.next_power_of_2(triton.cdiv(MIN_TILE,
                                                                          block_t * load))))
        block_h = min(block_h, max(1, MAX_TILE // (block_t * load)))
        tiles = [block_t * block_h * load, block_t * block_r * pair * table_itemsize]
        if n_pass:
            tiles.append(block_t * block_h * block_p * itemsize)
        full = [b for b in tiles if b >= WARP_VECTORS]
        num_warps = max(1, min(8, min(full) // WARP_VECTORS)) if full else 1
        # a small cos/sin or pass-through tile holds the warps down: fewer heads per step
        block_h = min(block_h, max(1, 2 * WARP_VECTORS * num_warps // (block_t * load)))
    else:
        block_h = min(16, more)
        width = max(block_r, block_p)
        block_t = max(1, min(triton.next_power_of_2(n_tokens), 16384 // (block_h * width)))
        num_warps = 1
    return dict(BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_R=block_r, BLOCK_P=block_p,
                num_warps=num_warps)


def _launch(q, k, cos, sin, position_ids, interleaved: bool, backward: bool):
    q_out = torch.empty_like(q)  # q's memory layout when it is dense, else contiguous
    k_out = torch.empty_like(k)
    batch, seq, q_heads, head_dim = q.shape
    k_heads = k.shape[2]
    n_tokens = batch * seq
    if n_tokens == 0 or (q.numel() == 0 and k.numel() == 0):
        return q_out, k_out
    check_runtime(q, _rope_kernel)
    rot_dim = cos.shape[-1]
    if position_ids is None:
        c = cos.expand(batch, seq, rot_dim)  # stride 0 along a broadcast batch or seq dim
        s = sin.expand(batch, seq, rot_dim)
        cos_strides = (c.stride(0), c.stride(1), c.stride(2), s.stride(0), s.stride(1), s.stride(2))
        pos, pos_strides, max_pos = q, (0, 0), 0  # q: a placeholder pointer (HAS_POS=False)
    else:
        pos = position_ids.expand(batch, seq)
        cos_strides = (0, cos.stride(0), cos.stride(1), 0, sin.stride(0), sin.stride(1))
        pos_strides, max_pos = (pos.stride(0), pos.stride(1)), cos.shape[0]
    half, n_pass = rot_dim // 2, head_dim - rot_dim
    tiles = _tiles(n_tokens, q_heads, k_heads, half, n_pass, q.element_size(),
                   cos.element_size(), interleaved, q.device)
    grid = (triton.cdiv(n_tokens, tiles["BLOCK_T"]),)
    _rope_kernel[grid](
        q, k, cos, sin, pos, q_out, k_out,
        n_tokens, seq, q_heads, k_heads, half, n_pass, max_pos,
        *q.stride(), *k.stride(), *q_out.stride(), *k_out.stride(), *cos_strides, *pos_strides,
        HAS_POS=position_ids is not None, INTERLEAVED=interleaved, BACKWARD=backward,
        HAS_PASS=n_pass > 0, SPLIT_QK=planned_amd_arch(q.device) is not None, **tiles)
    return q_out, k_out


def rope_fwd(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             position_ids: torch.Tensor | None = None,
             interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_rot, k_rot), new tensors of q's and k's shapes and dtypes.

    q [batch, seq, q_heads, head_dim] and k [batch, seq, kv_heads, head_dim], any strides
    (pass q.transpose(1, 2) for a [batch, heads, seq, head_dim] tensor); cos, sin
    [1 or batch, 1 or seq, rot_dim], or with position_ids ([1 or batch, seq] int32/int64)
    a cache [max_pos, rot_dim]. A position outside [0, max_pos) is not read: the rotated
    dims of its token come out NaN. Inputs are not checked here; speedlight.rope checks them.
    """
    return _launch(q, k, cos, sin, position_ids, interleaved, backward=False)


def rope_bwd(dq_rot: torch.Tensor, dk_rot: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             position_ids: torch.Tensor | None = None,
             interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(dq, dk) from the gradients of q_rot and k_rot: the transpose of the rotation (the
    rotation by -theta), in one launch. Arguments as in rope_fwd."""
    return _launch(dq_rot, dk_rot, cos, sin, position_ids, interleaved, backward=True)


# --- registration: custom ops, fakes and autograd -----------------------------------------

ROPE = register_op(
    "rope",
    forward=rope_fwd,
    outputs=("q_rot", "k_rot"),
    fake=lambda q, k, cos, sin, position_ids, interleaved: (torch.empty_like(q),
                                                            torch.empty_like(k)),
    backward=rope_bwd,
    backward_fake=lambda dq_rot, dk_rot, cos, sin, position_ids, interleaved: (
        torch.empty_like(dq_rot), torch.empty_like(dk_rot)),
    grads=("q", "k"),
)


# --- public function ---------------------------------------------------------------------

_LAYOUTS = {1: "[batch, heads, seq, head_dim]", 2: "[batch, seq, heads, head_dim]"}


@local_rows("q", "k")
def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         position_ids: torch.Tensor | None = None, unsqueeze_dim: int = 1,
         interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding of q and k, as Hugging Face's apply_rotary_pos_emb.

    q [batch, q_heads, seq, head_dim] and k [batch, kv_heads, seq, head_dim] with
    unsqueeze_dim=1 (HF's layout), or [batch, seq, heads, head_dim] with unsqueeze_dim=2;
    float32/float16/bfloat16, one dtype, any strides. cos, sin: [batch or 1, seq or 1,
    rot_dim] (what HF's rotary embedding returns), or with position_ids ([batch or 1, seq]
    int32/int64) a cache [max_pos, rot_dim] indexed by them in the kernel. rot_dim
    (even, <= head_dim) dims of each head rotate, the rest pass through (partial rotary).
    interleaved=False pairs dims (i, i + rot_dim/2) with cos = cat(freqs, freqs)
    (Llama, NeoX); True pairs (2i, 2i + 1) with cos repeat-interleaved (GPT-J).

    Returns (q_rot, k_rot) in q's shape and dtype (fp32 arithmetic, one rounding).
    Differentiable in q and k; works under torch.compile(fullgraph=True). cos and sin take
    no gradient: they are constants in the models RoPE serves (HF builds them from a
    non-trainable buffer), so one that requires grad raises instead of having its gradient
    silently dropped. Positions are range-checked on the host when position_ids is on the
    CPU; on a GPU (where the check would synchronize) an out-of-range position is not read
    and its token's rotated dims come out NaN.
    """
    check_tensor("q", q)
    check_tensor("k", k)
    check_same_dtype(q=q, k=k)
    check_tensor("cos", cos)
    check_tensor("sin", sin)
    if position_ids is not None:
        check_tensor("position_ids", position_ids, dtypes=INT_DTYPES,
                     expected="64- or 32-bit integer")
    check_same_device(q=q, k=k, cos=cos, sin=sin, position_ids=position_ids)
    if isinstance(unsqueeze_dim, bool) or unsqueeze_dim not in (1, 2, -3, -2):
        raise ValueError(f"unsqueeze_dim must be 1 (q, k as {_LAYOUTS[1]}) or 2 (as "
                         f"{_LAYOUTS[2]}), got {unsqueeze_dim!r}")
    check_bool("interleaved", interleaved)
    heads_dim = unsqueeze_dim % 4
    seq_dim = 3 - heads_dim
    layout = _LAYOUTS[heads_dim]
    for name, t in (("q", q), ("k", k)):
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dims, {layout} for unsqueeze_dim="
                             f"{unsqueeze_dim}, got {describe(t)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have one head_dim: q has {q.shape[-1]}, k has "
                         f"{k.shape[-1]} (q {tuple(q.shape)}, k {tuple(k.shape)})")
    if q.shape[0] != k.shape[0] or q.shape[seq_dim] != k.shape[seq_dim]:
        raise ValueError(f"q and k must have the same batch and seq ({layout}): q has shape "
                         f"{tuple(q.shape)}, k has {tuple(k.shape)}")
    batch, seq, head_dim = q.shape[0], q.shape[seq_dim], q.shape[-1]
    _check_cos_sin_positions(cos, sin, position_ids, batch, seq, head_dim)

    if heads_dim == 1:  # the kernel takes [batch, seq, heads, head_dim]: a view, not a copy
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    q_rot, k_rot = ROPE(q, k, cos, sin, position_ids, interleaved)
    if heads_dim == 1:
        q_rot, k_rot = q_rot.transpose(1, 2), k_rot.transpose(1, 2)
    return q_rot, k_rot


def _check_cos_sin_positions(cos, sin, position_ids, batch: int, seq: int,
                             head_dim: int) -> None:
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have one shape, got cos {tuple(cos.shape)} and "
                         f"sin {tuple(sin.shape)}")
    rot_dim = cos.shape[-1] if cos.dim() else 0
    if rot_dim % 2 or rot_dim == 0 or rot_dim > head_dim:
        raise ValueError(f"rot_dim = cos.shape[-1] must be even, positive and at most "
                         f"head_dim={head_dim}, got cos of shape {tuple(cos.shape)}")
    # `a == 1 or a == b`, not `a in (1, b)`: dynamo (torch 2.13) decides `in` over symbolic
    # sizes wrongly when a recompile has made them dynamic
    if position_ids is None:
        if (cos.dim() != 3 or not (cos.shape[0] == 1 or cos.shape[0] == batch)
                or not (cos.shape[1] == 1 or cos.shape[1] == seq)):
            raise ValueError(f"cos and sin must have shape [{batch} or 1, {seq} or 1, rot_dim] "
                             f"(batch {batch}, seq {seq}) when position_ids is None, got "
                             f"{tuple(cos.shape)}; pass position_ids to index a cache "
                             f"[max_pos, rot_dim]")
    else:
        if cos.dim() != 2:
            raise ValueError(f"with position_ids, cos and sin must be a cache [max_pos, "
                             f"rot_dim], got shape {tuple(cos.shape)}")
        if (position_ids.dim() != 2 or not (position_ids.shape[0] == 1
                                             or position_ids.shape[0] == batch)
                or position_ids.shape[1] != seq):
            raise ValueError(f"position_ids must have shape [{batch} or 1, {seq}] (batch, seq "
                             f"of q), got {tuple(position_ids.shape)}")
        if (position_ids.device.type == "cpu" and position_ids.numel()
                and not torch.compiler.is_compiling()):
            lo, hi = (int(v) for v in torch.aminmax(position_ids))
            if lo < 0 or hi >= cos.shape[0]:
                raise ValueError(f"position_ids must lie in [0, {cos.shape[0]}) (the rows of "
                                 f"the cos/sin cache), got values in [{lo}, {hi}]")
    if torch.is_grad_enabled():
        for name, t in (("cos", cos), ("sin", sin)):
            if t.requires_grad:
                raise ValueError(
                    f"{name} requires grad, but speedlight.rope gives no gradient for cos and "
                    f"sin (constants in every model it serves). Pass {name}.detach(), or use "
                    f"speedlight.reference.rope if the rotation angles are learned")


# --- OpSpec --------------------------------------------------------------------------------

ROPE_BASE = 10000.0


def _max_pos(case: Case) -> int:
    """Rows of the cos/sin cache of a position_ids case: more than the tokens, odd."""
    return 2 * case["seq"] + 17


def _angles_to_cos_sin(positions: torch.Tensor, rot_dim: int, case: Case, device,
                       interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of positions[..., None] * inv_freq as HF's rotary embeddings build them:
    duplicated halves (cat) or duplicated pairs (repeat_interleave), in the case dtype."""
    inv_freq = 1.0 / ROPE_BASE ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    freqs = positions.to(torch.float64)[..., None] * inv_freq
    emb = freqs.repeat_interleave(2, dim=-1) if interleaved else torch.cat((freqs, freqs), -1)
    return emb.cos().to(case.dtype).to(device), emb.sin().to(case.dtype).to(device)


def _qk(case: Case, device, heads: int, salt: int, fused: torch.Tensor | None, offset: int):
    """q or k for a case, in the case's layout (see make_inputs)."""
    b, s, d = case["batch"], case["seq"], case["dim"]
    heads_first = not case.flag("bshd")
    if fused is not None:  # a slice of the [batch, seq, (heads + 2 kv) * dim] projection
        t = fused[..., offset * d:(offset + heads) * d].unflatten(-1, (heads, d))
        return t.transpose(1, 2) if heads_first else t
    logical = (b, heads, s, d) if heads_first else (b, s, heads, d)
    if case.layout == "transposed":  # the other memory order: HF's q_proj(x).view().transpose()
        other = (b, s, heads, d) if heads_first else (b, heads, s, d)
        return rand_tensor(other, case, device, layout="contiguous", salt=salt).transpose(1, 2)
    return rand_tensor(logical, case, device, salt=salt)


def make_inputs(case: Case, device) -> dict:
    """q, k in the case's layout: contiguous in their logical order ([batch, heads, seq,
    dim], or [batch, seq, heads, dim] with the bshd flag), transposed (the other memory
    order; HF's layout for bhsd), strided (the last dim padded with NaN), or with the fused
    flag slices of one qkv projection. cos/sin as HF builds them for positions offset per
    sequence ([batch, seq, rot]; [1, seq, rot] with bcast), or with pos a cache indexed by
    random position_ids."""
    b, s, hq, hk, d, r = (case[n] for n in ("batch", "seq", "heads", "kv", "dim", "rot"))
    fused = None
    if case.flag("fused"):
        fused = rand_tensor((b, s, (hq + 2 * hk) * d), case, device, layout="contiguous")
    q = _qk(case, device, hq, salt=0, fused=fused, offset=0)
    k = _qk(case, device, hk, salt=1, fused=fused, offset=hq)
    interleaved = bool(case.flag("interleaved", False))
    g = generator(case, salt=3)
    position_ids = None
    if case.flag("pos"):
        max_pos = _max_pos(case)
        position_ids = torch.randint(0, max_pos, (b, s), generator=g).to(device)
        cos, sin = _angles_to_cos_sin(torch.arange(max_pos), r, case, device, interleaved)
    else:
        rows = 1 if case.flag("bcast") else b
        start = torch.randint(0, 4096, (rows, 1), generator=g)  # tokens already in a cache
        cos, sin = _angles_to_cos_sin(start + torch.arange(s), r, case, device, interleaved)
    return {"q": q, "k": k, "cos": cos, "sin": sin, "position_ids": position_ids,
            "unsqueeze_dim": 2 if case.flag("bshd") else 1, "interleaved": interleaved}


def cost(case: Case, mode: str) -> Cost:
    b, s, hq, hk, d, r = (case[n] for n in ("batch", "seq", "heads", "kv", "dim", "rot"))
    e = case.dtype.itemsize
    tokens = b * s
    heads_bytes = tokens * (hq + hk) * d * e
    if case.flag("pos"):  # the cache rows the tokens address (at most one per token), ids
        table = 2 * min(tokens, _max_pos(case)) * r * e + tokens * 8
    else:
        table = 2 * (1 if case.flag("bcast") else b) * s * r * e
    # fwd: read q, k, cos, sin (, position_ids); write q_rot, k_rot.
    # bwd: read dq_rot, dk_rot, cos, sin (, position_ids); write dq, dk.
    # Each rotated element: a multiply and a multiply-add, 3 FLOP; pass-through dims: 0.
    return Cost(flops=3 * tokens * (hq + hk) * r, bytes=2 * heads_bytes + table)


def cases(suite: str) -> list[Case]:
    def case(batch, seq, heads, kv, dim, rot, layout="contiguous", model=None, **flags):
        return Case("rope", (("batch", batch), ("seq", seq), ("heads", heads), ("kv", kv),
                             ("dim", dim), ("rot", rot)), layout=layout, model=model,
                    flags={k: v for k, v in flags.items() if v})

    points = shapes.distinct_configs(
        ("heads", "kv_heads", "head_dim", "rotary_dim", "rope_interleaved"),
        where=lambda m: m.rotary_dim > 0)
    if suite == "quick":
        return [
            case(1, 1, 4, 4, 16, 16),                                # one token
            case(2, 7, 20, 4, 32, 32, "transposed"),                 # HF's layout, GQA
            case(3, 37, 8, 2, 64, 64),                               # several programs
            case(2, 5, 4, 1, 64, 24, bshd=True),                     # partial rotary, MQA
            case(1, 9, 4, 4, 48, 20, interleaved=True),              # GPT-J-style partial
            case(1, 5, 16, 16, 256, 64, "transposed", interleaved=True),  # GPT-J heads
            case(1, 13, 32, 8, 128, 128, "transposed"),              # Llama-3 heads
            case(2, 11, 4, 2, 64, 64, "strided"),
            case(2, 11, 4, 2, 64, 64, "strided", bshd=True),
            case(2, 6, 4, 2, 32, 32, fused=True),                    # slices of fused qkv
            case(2, 6, 4, 2, 32, 32, bshd=True, fused=True),
            case(3, 5, 4, 2, 32, 32, pos=True),                      # position_ids + cache
            case(2, 9, 4, 4, 64, 32, "transposed", pos=True, interleaved=True),
            case(3, 4, 2, 1, 32, 32, bcast=True),                    # cos [1, seq, rot]
            case(1, 3, 2, 2, 33, 16, bshd=True),                     # odd head_dim
            case(2, 0, 4, 2, 32, 32),                                # empty
        ]
    out = [case(1, t, hq, hk, d, r, "transposed", model=name, interleaved=inter)
           for (hq, hk, d, r, inter), name in points for t in shapes.MODEL_TOKENS]
    if suite == "full":
        out += [
            case(3, 127, 5, 1, 64, 64),
            case(2, 1031, 8, 8, 80, 32, "transposed"),               # Phi-2-style partial
            case(1, 257, 12, 4, 96, 96, "strided", bshd=True),
            case(4, 1, 32, 8, 128, 128, "transposed", pos=True),     # batched decode
            case(2, 509, 16, 16, 256, 64, pos=True, interleaved=True),
            case(1, 512, 32, 8, 128, 128, fused=True),
            case(2, 4096, 32, 8, 128, 128, bshd=True, fused=True),
            case(4, 1021, 28, 4, 128, 128, "transposed", bcast=True),
            case(1, 3, 3, 1, 2, 2),                                  # one pair per head
            case(3, 0, 32, 8, 128, 128, pos=True),
            # tokens x heads x head_dim > 2^31: 64-bit offsets
            case(1, 524289, 32, 1, 128, 128, bshd=True, huge=True),
        ]
    return out


def skip(case: Case, device) -> str | None:
    return skip_huge_on_cpu(case, device, "q of > 2^31 elements")


def _aligned(case: Case) -> bool:
    """Rows (a head of q or k, a token's cos/sin) 16-byte aligned and every span the kernel
    moves starting at a multiple of 16 elements: head_dim and rot_dim multiples of 16, and
    rot_dim / 2 too for rotate-half pairs (the second half starts there). The transposed
    layout ([batch, heads, seq, dim] over [batch, seq, heads, dim] memory) and the slices
    of a fused projection keep the last dim contiguous; the strided one pads it."""
    dim, rot = case["dim"], case["rot"]
    starts = (dim, rot) if case.flag("interleaved") else (dim, rot, rot // 2)
    return case.layout != "strided" and all(v % 16 == 0 for v in starts)


def for_model(cfg, batch: int, seq: int) -> list[Case]:
    """q and k as Hugging Face attention hands them over: [batch, heads, seq, head_dim]
    views of the projections' [batch, seq, heads, head_dim]."""
    if not cfg.rotary_dim:
        return []
    flags = {"interleaved": True} if cfg.rope_interleaved else {}
    return [Case("rope", (("batch", batch), ("seq", seq), ("heads", cfg.heads),
                          ("kv", cfg.kv_heads), ("dim", cfg.head_dim), ("rot", cfg.rotary_dim)),
                 layout="transposed", flags=flags, model=cfg.name)]


def case_of(call: str, args) -> Case | None:
    """q and k ([batch, seq, heads, head_dim] as the registered op takes them; dq_rot and
    dk_rot in the backward), the cos/sin rows and whether position_ids index a cache."""
    if not is_call_of(call, "rope"):
        return None
    q, k = (args["q"], args["k"]) if "q" in args else (args["dq_rot"], args["dk_rot"])
    cos, pos = args["cos"], args["position_ids"]
    batch, seq, heads, dim = q.shape
    flags = {"pos": pos is not None, "interleaved": bool(args["interleaved"]),
             "bcast": pos is None and cos.shape[0] == 1 and batch > 1}
    return Case("rope", (("batch", batch), ("seq", seq), ("heads", heads), ("kv", k.shape[2]),
                         ("dim", dim), ("rot", cos.shape[-1])), dtype=q.dtype,
                flags={f: True for f, on in flags.items() if on})


def _rotations(g) -> list[tuple]:
    """Each x * cos + rotate(x) * sin in a profiled forward, rotate being slices, neg and
    cat (or stack): (forward ops, x, cos, the op making cos, module)."""
    found = []
    for r in g.fwd:
        if r["name"] != "neg":
            continue
        x = g.input_base(r["index"], 0)
        for cat in (c for c in g.uses(r["index"]) if g.name(c) in ("cat", "stack")):
            for mul_sin in (m for m in g.uses(cat) if g.name(m) == "mul"):
                for add in (a for a in g.uses(mul_sin) if g.name(a) == "add"):
                    other = [g.input_base(add, k) for k in (0, 1)]
                    mul_cos = next((m for m in other if m != mul_sin and g.name(m) == "mul"),
                                   None)
                    if mul_cos is None or x not in [g.input_base(mul_cos, k) for k in (0, 1)]:
                        continue
                    kx = [g.input_base(mul_cos, k) for k in (0, 1)].index(x)
                    fwd = {r["index"], cat, mul_sin, add, mul_cos}
                    for a, b in ((cat, mul_sin), (mul_sin, add), (mul_cos, add),
                                 (r["index"], cat)):
                        fwd |= g.views_between(a, b)
                    fwd |= {p for p in g.row(r["index"])["producers"] + g.row(cat)["producers"]
                            if p is not None and g.is_view(p) and g.base(p) == x}
                    found.append((fwd, g.row(mul_cos)["inputs"][kx],
                                  g.row(mul_cos)["inputs"][1 - kx],
                                  g.base(g.row(mul_cos)["producers"][1 - kx]),
                                  g.row(add)["module"]))
    return found


def recognise(g, calls) -> list[Chain]:
    """The rotations of q and k by one cos/sin in one module ([batch, heads, seq, dim], as
    Hugging Face's apply_rotary_pos_emb has them), as the one call of rope that rotates
    both; a rotation without its pair as rope on q alone (no k heads)."""
    pairs: dict[tuple, list] = {}
    for found in _rotations(g):
        pairs.setdefault((found[4], found[3]), []).append(found)
    chains = []
    for (module, _), found in pairs.items():
        for i in range(0, len(found), 2):
            q, k = found[i], found[i + 1] if i + 1 < len(found) else None
            shape, cos = q[1]["shape"], q[2]["shape"]
            batch, heads, seq, dim = shape if len(shape) == 4 else \
                (1, math.prod(shape[:-2]), shape[-2] if len(shape) > 1 else 1, shape[-1])
            kv = (k[1]["shape"][1] if len(k[1]["shape"]) == 4 else 1) if k else 0
            case = Case("rope", (("batch", batch), ("seq", seq), ("heads", heads), ("kv", kv),
                                 ("dim", dim), ("rot", cos[-1])),
                        dtype=g.tensor(q[1]).dtype, layout="transposed",
                        flags={"bcast": True} if cos[0] == 1 and batch > 1 else {})
            chains.append(Chain("x*cos + cat(-x2, x1)*sin" + (" on q and k" if k else ""),
                                q[0] | (k[0] if k else set()), module, case))
    return chains


SPEC = OpSpec(
    impl=rope,
    make_inputs=make_inputs,
    cost=cost,
    suites=shapes.suites(cases),
    grad_inputs=("q", "k"),
    skip=skip,
    notes=("q and k rotated in one launch through their strides; cos/sin per token or a "
           "cache read at position_ids; cos and sin take no gradient."),
    aligned=_aligned,
    count_rows=lambda case: case["batch"] * case["seq"],
    kernels={
        # no reduction, at most two 16-byte vectors per thread per load (_tiles): about 80
        # registers a thread or fewer, so at least 24 of an SM's 64 warps resident
        "_rope_kernel": KernelDesign(min_occupancy=0.375),
    },
    for_model=for_model,
    case_of=case_of,
    recognise=recognise,
    fuses="rotary position embedding applied in place of the slice/neg/cat chain",
    peers={"liger": "liger_rope"},
    patches="rope",
)
