"""Triton kernel of rotary position embedding (RoPE), forward and backward in one.

Each pair (x1, x2) of a head's first rot_dim dims is rotated by its position's angle:
  y1 = x1 * c1 - x2 * s1,   y2 = x2 * c2 + x1 * s2,
with (c1, c2, s1, s2) the cos/sin entries at the two members of the pair. The pairs are
(i, i + rot_dim/2) in the rotate-half layout (Llama, NeoX) and (2i, 2i + 1) in the
interleaved one (GPT-J); dims from rot_dim to head_dim pass through unchanged. This is the
Hugging Face formula `x * cos + rotate_half(x) * sin` element for element, whatever values
cos and sin hold.

Backward. The Jacobian of (y1, y2) in (x1, x2) is [[c1, -s1], [s2, c2]], so
  dx1 = dy1 * c1 + dy2 * s2,   dx2 = dy2 * c2 - dy1 * s1:
the forward formula applied to (dy1, dy2) with (s1, s2) replaced by (-s2, -s1). With RoPE's
cos/sin (c1 = c2, s1 = s2) that is the rotation by -theta. The same kernel computes it
under BACKWARD=True.
"""

import triton
import triton.language as tl


@triton.jit
def _rope_heads(
    x_tok, y_tok, h0, n_heads, stride_xh, stride_xd, stride_yh, stride_yd, mask_t,
    dim_a, dim_b, mask_r, c1, c2, sa, sb, rot_dim, n_pass,
    INTERLEAVED: tl.constexpr, HAS_PASS: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """Rotate heads [h0, h0 + BLOCK_H) of one tensor (q or k) at the BLOCK_T tokens of a
    program.

    x_tok, y_tok [BLOCK_T] pointers: each token's row of heads in x and y; heads at or past
    n_heads and tokens off mask_t are masked; dim_a, dim_b, mask_r [BLOCK_R]: the dims of
    each pair's two members (INTERLEAVED pairs, dim_b = dim_a + 1, are loaded and stored as
    adjacent twos: [BT, BH, BR, 2], vectorized); c1, c2, sa, sb [BLOCK_T, 1, BLOCK_R] fp32:
    y1 = x1 * c1 - x2 * sa, y2 = x2 * c2 + x1 * sb. Dims [rot_dim, rot_dim + n_pass) are
    copied.
    """
    offs_h = h0 + tl.arange(0, BLOCK_H)
    heads = offs_h.to(tl.int64)[None, :, None]
    mask_th = mask_t[:, None, None] & (offs_h < n_heads)[None, :, None]  # [BT, BH, 1]
    mask = mask_th & mask_r[None, None, :]
    x_head = x_tok[:, None, None] + heads * stride_xh  # [BT, BH, 1]
    y_head = y_tok[:, None, None] + heads * stride_yh
    if INTERLEAVED:
        pair = dim_a[:, None] + tl.arange(0, 2)[None, :]  # [BR, 2]
        mask2 = mask[:, :, :, None]  # broadcast over the pair by load and store
        x = tl.load(x_head[:, :, :, None] + pair[None, None, :, :] * stride_xd, mask=mask2,
                    other=0.0).to(tl.float32)
        x1, x2 = tl.split(x)
    else:
        x1 = tl.load(x_head + dim_a[None, None, :] * stride_xd, mask=mask, other=0.0)
        x2 = tl.load(x_head + dim_b[None, None, :] * stride_xd, mask=mask, other=0.0)
        x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
    # [BT, BH, BR] * [BT, 1, BR] -> [BT, BH, BR]
    y1 = x1 * c1 - x2 * sa
    y2 = x2 * c2 + x1 * sb
    out_ty = y_tok.dtype.element_ty
    if INTERLEAVED:
        y = tl.join(y1, y2)  # [BT, BH, BR, 2]
        tl.store(y_head[:, :, :, None] + pair[None, None, :, :] * stride_yd, y.to(out_ty),
                 mask=mask2)
    else:
        tl.store(y_head + dim_a[None, None, :] * stride_yd, y1.to(out_ty), mask=mask)
        tl.store(y_head + dim_b[None, None, :] * stride_yd, y2.to(out_ty), mask=mask)
    if HAS_PASS:
        offs_p = rot_dim + tl.arange(0, BLOCK_P)
        mask_p = mask_th & (offs_p < rot_dim + n_pass)[None, None, :]
        x = tl.load(x_head + offs_p[None, None, :] * stride_xd, mask=mask_p)
        tl.store(y_head + offs_p[None, None, :] * stride_yd, x, mask=mask_p)


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, pos_ptr, q_out_ptr, k_out_ptr,
    n_tokens, seq_len, n_q_heads, n_k_heads, half, n_pass, max_pos,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_qob, stride_qos, stride_qoh, stride_qod,
    stride_kob, stride_kos, stride_koh, stride_kod,
    stride_cb, stride_cs, stride_cr, stride_sb, stride_ss, stride_sr,
    stride_pb, stride_ps,
    HAS_POS: tl.constexpr, INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr,
    HAS_PASS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, SPLIT_QK: tl.constexpr,
):
    """q_out, k_out = rope(q), rope(k) at BLOCK_T tokens per program, q and k in one launch.

    q_ptr, q_out_ptr [batch, seq, n_q_heads, head_dim]; k_ptr, k_out_ptr [batch, seq,
    n_k_heads, head_dim] (each with its own strides; n_q_heads != n_k_heads under GQA).
    Token t is (b, s) = divmod(t, seq_len). Without positions (HAS_POS=False) cos_ptr and
    sin_ptr are [batch, seq, rot_dim] (stride 0 along a broadcast dim); with HAS_POS they are a
    cache [max_pos, rot_dim] (row stride in stride_cs / stride_ss) read at row
    pos_ptr[b, s] (int32/int64), and a position outside [0, max_pos) reads nothing and makes
    that token's rotated dims NaN. INTERLEAVED picks the pairs (2i, 2i + 1) over
    (i, i + half); BACKWARD computes the gradient (the rotation's transpose); HAS_PASS=False
    removes the pass-through copy when rot_dim == head_dim. BLOCK_R >= half,
    BLOCK_P >= n_pass; heads go BLOCK_H at a time, q's then k's, in one loop or with
    SPLIT_QK in two (the form an AMD target compiles).
    """
    pid_t = tl.program_id(0)
    offs_t = pid_t.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    mask_t = offs_t < n_tokens
    b = offs_t // seq_len
    s = offs_t % seq_len
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < half
    if INTERLEAVED:
        dim_a = 2 * offs_r
        dim_b = dim_a + 1
    else:
        dim_a = offs_r
        dim_b = offs_r + half

    if HAS_POS:
        pos = tl.load(pos_ptr + b * stride_pb + s * stride_ps, mask=mask_t, other=0).to(tl.int64)
        valid = (pos >= 0) & (pos < max_pos)
        cos_row = cos_ptr + pos * stride_cs
        sin_row = sin_ptr + pos * stride_ss
    else:
        valid = mask_t
        cos_row = cos_ptr + b * stride_cb + s * stride_cs
        sin_row = sin_ptr + b * stride_sb + s * stride_ss
    mask_cs = (mask_t & valid)[:, None] & mask_r[None, :]  # [BT, BR]
    if INTERLEAVED:  # both members of each pair in one contiguous load: [BT, BR, 2]
        pair = dim_a[:, None] + tl.arange(0, 2)[None, :]  # [BR, 2]
        mask_cs2 = mask_cs[:, :, None]
        c = tl.load(cos_row[:, None, None] + pair[None, :, :] * stride_cr, mask=mask_cs2,
                    other=0.0).to(tl.float32)
        sn = tl.load(sin_row[:, None, None] + pair[None, :, :] * stride_sr, mask=mask_cs2,
                     other=0.0).to(tl.float32)
        c1, c2 = tl.split(c)
        s1, s2 = tl.split(sn)
    else:
        c1 = tl.load(cos_row[:, None] + dim_a[None, :] * stride_cr, mask=mask_cs,
                     other=0.0).to(tl.float32)
        c2 = tl.load(cos_row[:, None] + dim_b[None, :] * stride_cr, mask=mask_cs,
                     other=0.0).to(tl.float32)
        s1 = tl.load(sin_row[:, None] + dim_a[None, :] * stride_sr, mask=mask_cs,
                     other=0.0).to(tl.float32)
        s2 = tl.load(sin_row[:, None] + dim_b[None, :] * stride_sr, mask=mask_cs,
                     other=0.0).to(tl.float32)
    if HAS_POS:  # no cos/sin for this position: its rotated dims come out NaN
        c1 = tl.where(valid[:, None], c1, float("nan"))
        c2 = tl.where(valid[:, None], c2, float("nan"))
    if BACKWARD:
        sa = -s2
        sb = -s1
    else:
        sa = s1
        sb = s2
    c1 = c1[:, None, :]  # [BT, 1, BR]: one row per token, broadcast over heads
    c2 = c2[:, None, :]
    sa = sa[:, None, :]
    sb = sb[:, None, :]
    rot_dim = 2 * half
    # q's heads, then k's, BLOCK_H at a time, through the same loads and stores (one tile
    # shape, one access width): one loop that picks q's or k's pointers with tl.where, or
    # with SPLIT_QK (AMD targets) two loops. Triton 3.6's AMD pointer canonicalisation (its
    # buffer loads) cannot follow a select between two kernel arguments' pointers and the
    # compile fails; on NVIDIA the one loop keeps fewer registers (two loops take 82 on
    # sm_100a for interleaved pairs with a pass-through: 31% occupancy, under the design).
    x_q = q_ptr + b * stride_qb + s * stride_qs  # [BT] each token's row of heads
    x_k = k_ptr + b * stride_kb + s * stride_ks
    y_q = q_out_ptr + b * stride_qob + s * stride_qos
    y_k = k_out_ptr + b * stride_kob + s * stride_kos
    if SPLIT_QK:
        for h0 in range(0, n_q_heads, BLOCK_H):
            _rope_heads(x_q, y_q, h0, n_q_heads, stride_qh, stride_qd, stride_qoh, stride_qod,
                        mask_t, dim_a, dim_b, mask_r, c1, c2, sa, sb, rot_dim, n_pass,
                        INTERLEAVED, HAS_PASS, BLOCK_H, BLOCK_P)
        for h0 in range(0, n_k_heads, BLOCK_H):
            _rope_heads(x_k, y_k, h0, n_k_heads, stride_kh, stride_kd, stride_koh, stride_kod,
                        mask_t, dim_a, dim_b, mask_r, c1, c2, sa, sb, rot_dim, n_pass,
                        INTERLEAVED, HAS_PASS, BLOCK_H, BLOCK_P)
    else:
        q_steps = tl.cdiv(n_q_heads, BLOCK_H)
        for step in range(0, q_steps + tl.cdiv(n_k_heads, BLOCK_H)):
            is_q = step < q_steps
            _rope_heads(tl.where(is_q, x_q, x_k), tl.where(is_q, y_q, y_k),
                        tl.where(is_q, step, step - q_steps) * BLOCK_H,
                        tl.where(is_q, n_q_heads, n_k_heads),
                        tl.where(is_q, stride_qh, stride_kh),
                        tl.where(is_q, stride_qd, stride_kd),
                        tl.where(is_q, stride_qoh, stride_koh),
                        tl.where(is_q, stride_qod, stride_kod),
                        mask_t, dim_a, dim_b, mask_r, c1, c2, sa, sb, rot_dim, n_pass,
                        INTERLEAVED, HAS_PASS, BLOCK_H, BLOCK_P)
