"""Attention's cases and cost: the suites, the inputs of a case, the FLOPs and bytes of
the ideal flash kernels, the model cases and the Case of a call. The OpSpec that uses
them is declared in ops/attention.py."""

from __future__ import annotations

import collections
import itertools
import math

import torch

from speedlight import shapes
from speedlight.ops._suites import is_call_of
from speedlight.ops.attention_checks import window_sides
from speedlight.spec import Case, Chain, Cost, rand_tensor

# The query block and key block the cost model counts re-reads by (the GPU forward's and
# dk/dv kernel's tiles).
COST_BLOCK = 128
# A case with more (query, key) pairs per head than this runs for minutes or more under
# the interpreter: the GPU's cases.
CPU_MAX_PAIRS = 2 ** 16


def _lengths(case: Case) -> tuple[list[int], list[int]]:
    """Per-sequence (seq_q, seq_k) of a case: its packed lengths, else batch copies."""
    if case.flag("lens_q") is not None:
        return ([int(x) for x in str(case.flag("lens_q")).split("_")],
                [int(x) for x in str(case.flag("lens_k")).split("_")])
    return [case["seq_q"]] * case["batch"], [case["seq_k"]] * case["batch"]


def _case_window(case: Case) -> tuple[int, int]:
    left = case.flag("left")
    right = case.flag("right")
    window = None if left is None and right is None else (
        -1 if left is None else left, -1 if right is None else right)
    return window_sides(bool(case.flag("causal")), window)


def _visible_ranges(seq_q: int, seq_k: int, left: int, right: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """[lo, hi) of the keys each query row sees (int64 [seq_q] each; hi <= lo: none)."""
    pos = torch.arange(seq_q, dtype=torch.int64) + (seq_k - seq_q)
    lo = (pos - left).clamp(min=0) if left >= 0 else torch.zeros_like(pos)
    hi = (pos + right + 1).clamp(max=seq_k) if right >= 0 else torch.full_like(pos, seq_k)
    return lo, hi


def _visible_counts(seq_q: int, seq_k: int, left: int, right: int) -> torch.Tensor:
    """Keys each query row sees (int64 [seq_q])."""
    lo, hi = _visible_ranges(seq_q, seq_k, left, right)
    return (hi - lo).clamp(min=0)


def _block_reads(seq_q: int, seq_k: int, left: int, right: int, block: int) -> int:
    """Keys read by the blocks of `block` query rows: each block reads from its rows'
    first visible key to their last (rows see contiguous key ranges)."""
    lo, hi = _visible_ranges(seq_q, seq_k, left, right)
    total = 0
    for b0 in range(0, seq_q, block):
        l, h = lo[b0:b0 + block], hi[b0:b0 + block]
        seen = h > l
        if bool(seen.any()):
            total += int(h[seen].max() - l[seen].min())
    return total


def cost(case: Case, mode: str) -> Cost:
    """FLOPs over the visible (query, key) pairs only (causal counts about half): 2 matmuls
    forward, 5 backward (the scores recomputed, dv, dp, dq, dk).

    Bytes are what the flash kernels must move, L2 aside, not only each tensor once: k and
    v are read once per block of 128 query rows that sees them, per q head (forward, and
    the dq pass backward), q, do, lse and delta once per block of 128 keys per q head (the
    dk/dv pass). Forward: read q; write o, lse. Backward: read o, do (delta), q, do, lse,
    delta (dq pass), k, v (dk/dv pass); write delta, dq, dk, dv."""
    e, d = case.dtype.itemsize, case["dim"]
    heads, kv_heads = case["heads"], case["kv_heads"]
    left, right = _case_window(case)
    pairs = kv_reads = q_reads = tokens_q = tokens_k = 0
    for (sq, sk), n in collections.Counter(zip(*_lengths(case))).items():
        pairs += n * int(_visible_counts(sq, sk, left, right).sum())
        kv_reads += n * _block_reads(sq, sk, left, right, COST_BLOCK)
        q_reads += n * _block_reads(sk, sq, right, left, COST_BLOCK)  # query rows per key block
        tokens_q, tokens_k = tokens_q + n * sq, tokens_k + n * sk
    q_bytes = tokens_q * heads * d * e
    kv_bytes = tokens_k * kv_heads * d * e
    kv_block_bytes = kv_reads * heads * 2 * d * e
    if mode == "fwd":  # lse, one fp32 per query row and head, kept for the backward
        return Cost(flops=4 * pairs * d * heads,
                    bytes=2 * q_bytes + kv_block_bytes + 4 * tokens_q * heads,
                    saved=4 * tokens_q * heads)
    return Cost(flops=10 * pairs * d * heads,
                bytes=(5 * q_bytes + 4 * kv_bytes + kv_block_bytes
                       + q_reads * heads * (2 * d * e + 8) + 12 * tokens_q * heads))


def make_inputs(case: Case, device) -> dict:
    b, h, hkv, d = case["batch"], case["heads"], case["kv_heads"], case["dim"]
    lens_q, lens_k = _lengths(case)
    left, right = _case_window(case)
    flags = dict(causal=bool(case.flag("causal")), softcap=case.flag("softcap"),
                 window=None if left < 0 and right < 0 else (left, right),
                 return_lse=bool(case.flag("lse")), num_splits=case.flag("splits"),
                 scale=case.flag("scale"))
    if flags["causal"] and flags["window"] == (-1, 0):
        flags["window"] = None
    if case.flag("lens_q") is not None:
        cu = lambda lens: torch.tensor([0] + list(itertools.accumulate(lens)),  # noqa: E731
                                       dtype=torch.int32, device=device)
        shapes_ = {"q": (sum(lens_q), h, d), "k": (sum(lens_k), hkv, d), "v": (sum(lens_k), hkv, d)}
        layout = "strided" if case.layout == "strided" else "contiguous"
        tensors = {n: rand_tensor(s, case, device, layout=layout, salt=i)
                   for i, (n, s) in enumerate(shapes_.items())}
        return {**tensors, **flags, "cu_seqlens_q": cu(lens_q), "cu_seqlens_k": cu(lens_k),
                "max_seqlen_q": max(lens_q), "max_seqlen_k": max(lens_k),
                "check_seqlens": True}
    sq, sk = case["seq_q"], case["seq_k"]
    shapes_ = {"q": (b, h, sq, d), "k": (b, hkv, sk, d), "v": (b, hkv, sk, d)}
    tensors = {}
    for i, (n, (bb, hh, ss, dd)) in enumerate(shapes_.items()):
        if case.layout == "transposed":  # a [batch, seq, heads, dim] tensor's transpose view
            t = rand_tensor((bb, ss, hh, dd), case, device, layout="contiguous", salt=i)
            tensors[n] = t.transpose(1, 2)
        else:
            tensors[n] = rand_tensor((bb, hh, ss, dd), case, device, salt=i)
    if case.flag("amplitude"):  # q and k times a power of two (exact): large scores
        for n in ("q", "k"):
            tensors[n].mul_(case.flag("amplitude"))
    return {**tensors, **flags}


def cases(suite: str) -> list[Case]:
    def case(b, h, hkv, sq, sk, d, layout="contiguous", model=None, **flags):
        return Case("attention", (("batch", b), ("heads", h), ("kv_heads", hkv), ("seq_q", sq),
                                  ("seq_k", sk), ("dim", d)),
                    layout=layout, flags=flags, model=model)

    def packed(h, hkv, d, lens_q, lens_k, **flags):
        return case(len(lens_q), h, hkv, sum(lens_q), sum(lens_k), d,
                    lens_q="_".join(map(str, lens_q)), lens_k="_".join(map(str, lens_k)), **flags)

    if suite == "quick":
        return [
            case(1, 2, 1, 1, 2, 64),
            case(1, 2, 1, 40, 40, 64, causal=True),
            case(2, 2, 1, 20, 33, 96),
            case(1, 2, 1, 17, 70, 80, causal=True, lse=True),
            case(1, 2, 1, 45, 12, 128, causal=True, lse=True),  # 33 rows see no key
            case(1, 2, 1, 40, 40, 112, causal=True, left=8),
            case(1, 2, 1, 20, 30, 256, causal=True, softcap=5.0),
            case(1, 2, 1, 9, 33, 40, left=4, right=6, scale=0.3),
            case(1, 2, 1, 3, 100, 64, causal=True, splits=3, lse=True),
            case(1, 2, 1, 37, 37, 64, "transposed", causal=True),
            case(1, 2, 2, 21, 33, 64, "strided"),
            packed(2, 1, 64, [5, 1, 0, 17], [5, 1, 0, 17], causal=True, lse=True),
            packed(2, 2, 64, [1, 3], [40, 70], causal=True, splits=2),
            case(1, 2, 1, 0, 5, 64),
            case(1, 2, 1, 4, 0, 64, lse=True),
            # scores up to ~1e3, the fp32 statistics' bound (see speedlight.attention)
            case(1, 2, 1, 64, 64, 64, causal=True, amplitude=16),
        ]
    out = []
    # seq 1 is one query against two keys: with a single key every dq and dk is exactly
    # zero, which no relative error can judge
    seqs = (1, 2, 127, 1000, 4096, 16384)
    for (h, hkv, d, cap, win), name in shapes.distinct_configs(
            ("heads", "kv_heads", "head_dim", "attn_softcap", "sliding_window")):
        extra = {"softcap": cap} if cap else {}
        for s in seqs:
            out.append(case(1, h, hkv, s, max(s, 2), d, model=name, causal=True, **extra))
        if win:
            out.append(case(1, h, hkv, 16384, 16384, d, model=name, causal=True, left=win - 1,
                            **extra))
        out.append(case(1, h, hkv, 1, 131072, d, model=name, causal=True, **extra))  # decode
    # the headline of scripts/gpu-check.sh: 8K tokens at head dim 128, causal and not
    out += [case(2, 32, 8, 8192, 8192, 128, model="llama-3-8b", causal=c) for c in (True, False)]
    if suite == "full":
        out += [
            case(3, 5, 5, 1021, 1021, 72, causal=True),
            case(2, 8, 2, 1000, 3001, 128, causal=True, lse=True),
            case(2, 8, 1, 4096, 4096, 128, "transposed", causal=True),
            case(1, 4, 4, 2047, 2047, 64, "strided", left=300, right=100),
            case(1, 8, 8, 4096, 4096, 256, causal=True, softcap=50.0),
            case(4, 32, 8, 16, 32768, 128, causal=True, lse=True),  # speculative decode
            packed(8, 2, 128, [1, 4096, 0, 777, 2, 3000], [1, 4096, 0, 777, 2, 3000],
                   causal=True, lse=True),
            packed(8, 8, 64, [1, 16, 3], [10000, 100, 65536], causal=True),
            case(1, 2, 1, 0, 4096, 128), case(1, 2, 1, 4096, 0, 128),
            # 64-bit offsets: q and o past 2^31 elements, and batch x heads past CUDA's
            # 65535 on a grid's second axis (the kernels take one flat first axis)
            case(65537, 32, 8, 8, 8, 128, causal=True, huge=True),
        ]
    return out


def for_model(cfg, batch: int, seq: int) -> list[Case]:
    """The model's causal self-attention over batch x seq tokens (its softcap, and its
    sliding window as a second case where it has one)."""
    if not cfg.heads:
        return []
    params = (("batch", batch), ("heads", cfg.heads), ("kv_heads", cfg.kv_heads),
              ("seq_q", seq), ("seq_k", seq), ("dim", cfg.head_dim))
    flags = {"causal": True}
    if getattr(cfg, "attn_softcap", None):
        flags["softcap"] = cfg.attn_softcap
    out = [Case("attention", params, flags=flags, model=cfg.name)]
    window = getattr(cfg, "sliding_window", None)
    if window and window < seq:
        out.append(Case("attention", params, flags={**flags, "left": window - 1},
                        model=cfg.name))
    return out


def skip(case: Case, device) -> str | None:
    if torch.device(device).type == "cuda":
        return None
    heads = case["heads"]
    left, right = _case_window(case)
    pairs = sum(n * int(_visible_counts(sq, sk, left, right).sum())
                for (sq, sk), n in collections.Counter(zip(*_lengths(case))).items())
    if pairs * heads > CPU_MAX_PAIRS * 8:
        return (f"{pairs * heads} (query, key) pairs: minutes to hours under the Triton "
                f"interpreter (about 3 ms per program); it runs on a GPU")
    return None


def case_of(call: str, args) -> Case | None:
    """The Case of one call of the registered ops (forward or backward), from q and k (and
    the cu_seqlens when packed, read on the host)."""
    if not is_call_of(call, "attention"):
        return None
    q, k = args["q"], args["k"]
    flags = {"left": int(args["left"]), "right": int(args["right"])}
    flags = {n: w for n, w in flags.items() if w >= 0}
    if float(args.get("softcap") or 0.0):
        flags["softcap"] = float(args["softcap"])
    cu_q, cu_k = args.get("cu_seqlens_q"), args.get("cu_seqlens_k")
    if cu_q is not None:
        try:
            lens_q = torch.diff(cu_q).tolist()
            lens_k = torch.diff(cu_k).tolist()
        except (RuntimeError, NotImplementedError):  # fake tensors: no values to read
            return None
        return Case("attention", (("batch", len(lens_q)), ("heads", q.shape[1]),
                                  ("kv_heads", k.shape[1]), ("seq_q", sum(lens_q)),
                                  ("seq_k", sum(lens_k)), ("dim", q.shape[2])), dtype=q.dtype,
                    flags={"lens_q": "_".join(map(str, lens_q)),
                           "lens_k": "_".join(map(str, lens_k)), **flags})
    return Case("attention", (("batch", q.shape[0]), ("heads", q.shape[1]),
                              ("kv_heads", k.shape[1]), ("seq_q", q.shape[2]),
                              ("seq_k", k.shape[2]), ("dim", q.shape[3])), dtype=q.dtype,
                flags=flags)


def count_rows(case: Case) -> int:
    return sum(_lengths(case)[0])


# --- recognise: the attention a model runs in PyTorch ops ---------------------------------

_SCORE_OPS = ("add", "mul", "div", "masked_fill", "_to_copy", "tanh", "where", "sub")
_SDPA_OPS = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
             "_scaled_dot_product_fused_attention_overrideable")


def _case(q: torch.Tensor, k_heads: int, seq_k: int) -> Case:
    """q [..., seq_q, dim]: every dim before the last two is batch x heads (one batch)."""
    heads = math.prod(q.shape[:-2])
    return Case("attention", (("batch", 1), ("heads", heads), ("kv_heads", k_heads),
                              ("seq_q", q.shape[-2]), ("seq_k", seq_k), ("dim", q.shape[-1])),
                dtype=q.dtype)


def recognise(g, calls) -> list[Chain]:
    """Eager attention (QK^T matmul, score ops: scale, mask, softcap; softmax; PV matmul),
    whose [seq_q, seq_k] scores reach memory, over its batch x heads (no mask read: a
    causal one is costed in full); then PyTorch's fused SDPA, one kernel already, where
    what speedlight.attention offers is its speed."""
    chains = []
    for r in g.fwd:
        if r["name"] != "_softmax":
            continue
        fwd, i = {r["index"]}, g.input_base(r["index"], 0)
        for _ in range(8):
            if i is None or g.name(i) not in _SCORE_OPS:
                break
            fwd.add(i)
            i = g.input_base(i, 0)
        if g.name(i) not in ("bmm", "baddbmm"):
            continue
        qk, j, pv = i, r["index"], None
        for _ in range(4):
            nxt = g.uses(j)
            if len(nxt) != 1:
                break
            j = nxt[0]
            if g.name(j) == "bmm":
                pv = j
                break
            if g.name(j) not in ("_to_copy", "native_dropout", "clone"):
                break
            fwd.add(j)
        if pv is None:
            continue
        fwd |= {qk, pv}
        fwd |= {p for a in list(fwd) for p in g.row(a)["producers"]
                if p is not None and g.is_view(p)}
        v = g.tensor(g.row(pv)["inputs"][1])
        chains.append(Chain("eager attention (QKᵀ, softmax, PV materialize the scores)", fwd,
                            r["module"], _case(g.tensor(g.row(qk)["inputs"][0]),
                                               math.prod(v.shape[:-2]), v.shape[-2])))
    for r in g.fwd:
        if r["name"] not in _SDPA_OPS or len(r["inputs"]) < 3 or not r["outputs"]:
            continue
        q, k = g.tensor(r["inputs"][0]), g.tensor(r["inputs"][1])
        if q.dim() == 4 and k.dim() == 4:  # [batch, heads, seq, dim]
            case = Case("attention", (("batch", q.shape[0]), ("heads", q.shape[1]),
                                      ("kv_heads", k.shape[1]), ("seq_q", q.shape[2]),
                                      ("seq_k", k.shape[2]), ("dim", q.shape[3])), dtype=q.dtype)
        else:
            case = _case(q, math.prod(k.shape[:-2]), k.shape[-2])
        chains.append(Chain(f"SDPA ({r['name'].lstrip('_')})", {r["index"]}, r["module"], case,
                            "already fused: the gain is kernel speed (speedlight bench --ops "
                            "attention compares it with each SDPA backend)"))
    return chains
