"""How linear_cross_entropy splits its work to stay within a memory budget: the schedule,
and what each schedule costs in bytes beyond the inputs and FLOPs.

The gradient of the lm_head, d_weight = sum over tokens of dlogits^T h, is the only sum
across chunks of tokens (d_hidden and the loss are per token). Three ways to form it:

  in-place          chunks of tokens; each chunk's d_weight GEMM adds into d_weight itself
                    (the first writes it: no zero-fill), rounding it to d_weight's dtype
                    once per chunk: `roundings` = chunks. No accumulator: the memory beyond
                    inputs and gradients is one chunk's logits (their gradient is written
                    over them). One chunk (everything fits) is the same with one rounding.
  fp32-accumulator  chunks of tokens; a float32 [vocab, hidden] accumulator (the first
                    chunk writes it), the last chunk's GEMM adding it in its epilogue and
                    writing d_weight in its dtype (no separate cast pass): one rounding,
                    4 x vocab x hidden bytes more.
  vocab-major       a token pass (chunks of tokens: logits, loss, each token's softmax
                    statistics, d_hidden), then blocks of the vocabulary: each block's
                    logits for every token again (a fourth GEMM), its gradient from the
                    saved statistics, and d_weight's rows of the block by one GEMM over all
                    tokens (one rounding, written once). Memory: the larger of one chunk's
                    logits and one block's; FLOPs 4/3 of the others'.

`plan_schedule` picks, for a budget of extra bytes: one chunk when the logits fit; else the
fp32 accumulator when it fits beside chunks of at least MIN_ACCUMULATOR_TOKENS tokens (its
read-modify-write of 8 bytes per element per chunk stays under the GEMM's time); else
in-place when it needs at most MAX_HALF_ROUNDINGS chunks (the most roundings of a bf16
d_weight within verify's rule, k = 4 x PyTorch's error: 8 measured at 3.2x, 16 at 3.9x,
20 at 4.6x on a CPU emulation); else vocab-major. An explicit chunk_size keeps token chunks
(in-place or fp32-accumulator). A d_weight of float32 (fp32 weights, with or without
autocast) is always in-place: its roundings are fp32's. Nothing here launches anything: the
public function plans on the host from shapes, profile reports the plan (case_of), and the
OpSpec reproduces the headline's plan at small sizes (`budget_like`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

DEFAULT_MEMORY_BUDGET = 2 ** 30  # bytes beyond inputs and returned gradients
# Low-memory setting users can pass (Liger's extra at Llama 3's size is 0.13 GB)
LOW_MEMORY_BUDGET = 250_000_000
MAX_HALF_ROUNDINGS = 8
MIN_ACCUMULATOR_TOKENS = 1024
TILE = 128  # the GEMM tile: chunks and vocabulary blocks are multiples of it where they can be
KINDS = ("in-place", "fp32-accumulator", "vocab-major")

# The shape the defaults are chosen for (issue 13's: Llama 3 8B's lm_head at 16K tokens)
HEADLINE = {"tokens": 16384, "hidden": 4096, "vocab": 128256}


@dataclass(frozen=True)
class Schedule:
    kind: str  # one of KINDS
    chunk_tokens: int  # tokens per chunk of the token pass
    vocab_block: int  # vocabulary rows per block of the vocab-major pass (0 otherwise)
    n_chunks: int
    n_blocks: int
    roundings: int  # how many times each element of d_weight is rounded to its dtype
    extra_bytes: int  # predicted peak beyond inputs and returned gradients

    def describe(self) -> str:
        where = (f"{self.n_chunks} chunk{'s' if self.n_chunks != 1 else ''} of "
                 f"{self.chunk_tokens} tokens")
        if self.kind == "vocab-major":
            where += f", then {self.n_blocks} vocabulary blocks of {self.vocab_block}"
        return (f"{self.kind}: {where}; d_weight rounded {self.roundings}x; "
                f"~{self.extra_bytes / 1e9:.3g} GB beyond inputs and gradients")


def _even(n: int, most: int) -> tuple[int, int]:
    """(size, count): n split into the fewest parts of at most `most`, evened out, each a
    multiple of TILE where that keeps it within `most`."""
    most = max(1, min(most, n))
    count = triton.cdiv(n, most)
    size = triton.cdiv(n, count)
    tiled = triton.cdiv(size, TILE) * TILE
    if size >= TILE and tiled <= most:
        size = tiled
    return size, triton.cdiv(n, size)


def plan_schedule(n_tokens: int, vocab: int, hidden: int, mm_dtype: torch.dtype,
                  grad_dtype: torch.dtype, *, grad_weight: bool = True,
                  memory_budget: int | None = None, chunk_size: int | None = None,
                  weight_copy: bool = False) -> Schedule:
    """The schedule of one call: n_tokens x hidden states, a [vocab, hidden] lm_head,
    matmuls and logits in mm_dtype, d_weight in grad_dtype (its parameter's), whether
    d_weight is wanted, the budget (None: DEFAULT_MEMORY_BUDGET), an explicit chunk_size
    (tokens), and whether the weight is cast to mm_dtype first (autocast: a copy that
    counts against the budget)."""
    budget = DEFAULT_MEMORY_BUDGET if memory_budget is None else int(memory_budget)
    e = mm_dtype.itemsize
    fixed = vocab * hidden * e if weight_copy else 0
    avail = max(budget - fixed, 0)
    n = max(n_tokens, 1)
    row = max(vocab * e, 1)  # one token's logits (its gradient overwrites them)

    def token_major(kind: str, most: int, acc_bytes: int = 0) -> Schedule:
        size, count = _even(n, most)
        return Schedule(kind, size, 0, count, 0, 1 if kind != "in-place" else count,
                        fixed + acc_bytes + size * row)

    acc = 4 * vocab * hidden
    if chunk_size is not None:
        most = int(chunk_size)
        if grad_weight and grad_dtype != torch.float32 and most < n and acc + most * row <= avail:
            return token_major("fp32-accumulator", most, acc)
        return token_major("in-place", most)
    most = max(1, avail // row)
    if not grad_weight or grad_dtype == torch.float32 or most >= n:
        return token_major("in-place", most)
    most_acc = (avail - acc) // row if avail > acc else 0
    if most_acc >= min(n, MIN_ACCUMULATOR_TOKENS):
        return token_major("fp32-accumulator", most_acc, acc)
    if triton.cdiv(n, most) <= MAX_HALF_ROUNDINGS:
        return token_major("in-place", most)
    size, count = _even(n, most)
    stats = 12 * n  # each token's max, log-sum and p_target - 1 (fp32)
    block = max(avail - stats, 0) // (n * e)
    # whole tiles, at least one (a budget smaller than [tokens, 128] logits is exceeded)
    block = max(min(TILE, vocab), block // TILE * TILE)
    block, blocks = _even(vocab, block)
    return Schedule("vocab-major", size, block, count, blocks, 1,
                    fixed + stats + max(size * row, n * block * e))


def budget_like(schedule: Schedule, n_tokens: int, vocab: int, hidden: int,
                mm_dtype: torch.dtype) -> int:
    """A memory budget under which `plan_schedule` gives a call of n_tokens x hidden, vocab,
    the same kind of schedule with as many chunks of tokens as `schedule` (vocab-major:
    more than MAX_HALF_ROUNDINGS), so that a small case is rounded as often as a large
    one."""
    row = vocab * mm_dtype.itemsize
    if schedule.kind == "vocab-major":  # (more than n_tokens // 9 tokens fit no chunk)
        return max(1, n_tokens // (MAX_HALF_ROUNDINGS + 1)) * row
    most = triton.cdiv(n_tokens, schedule.n_chunks)
    extra = 4 * vocab * hidden if schedule.kind == "fp32-accumulator" else 0
    return extra + most * row


def headline(memory_budget: int | None = None, dtype: torch.dtype = torch.bfloat16) -> Schedule:
    """The schedule at HEADLINE's shape in `dtype` under the budget (None: the default)."""
    return plan_schedule(HEADLINE["tokens"], HEADLINE["vocab"], HEADLINE["hidden"], dtype, dtype,
                memory_budget=memory_budget)


def schedule_work(schedule: Schedule, n_tokens: int, vocab: int, hidden: int,
                  dtype: torch.dtype, grads: tuple[bool, bool] = (True, True)) -> dict:
    """FLOPs and DRAM bytes of one training call under `schedule` (the matmuls' and the
    passes over logits, d_weight and its accumulator; hidden and weight reads by the GEMMs
    counted once each), for the design notes and profile. grads: (d_hidden, d_weight)."""
    e = dtype.itemsize
    gemm = 2 * n_tokens * vocab * hidden
    logits = n_tokens * vocab * e
    grad_h, grad_w = grads
    vocab_major = grad_w and schedule.kind == "vocab-major"
    flops = gemm * (1 + grad_h + grad_w + vocab_major)
    # token pass: the logits written by their GEMM, read twice and written once by the CE
    # kernel (long rows: statistics, then the gradient over them), read by the d_hidden
    # GEMM and, token-major, the d_weight GEMM; vocab-major reads them once more for each
    # token's statistics instead
    moved = logits * (1 + 3 + grad_h + grad_w)
    dw = vocab * hidden
    c = schedule.n_chunks
    if grad_w and schedule.kind == "in-place":
        moved += dw * e * (2 * c - 1)  # the first chunk writes, the others read and write
    elif grad_w and schedule.kind == "fp32-accumulator":
        # the first chunk writes fp32, the middle ones read and write it, the last reads it
        # and writes d_weight
        moved += dw * (4 + 8 * max(c - 2, 0) + 4 + e) if c > 1 else dw * e
    elif vocab_major:  # the vocab pass: logits written, read and written by the gradient
        # kernel, read by the d_weight GEMM; d_weight written once; the statistics
        moved += logits * 4 + dw * e + 12 * n_tokens * (1 + schedule.n_blocks)
    return {"flops": flops, "bytes": moved}
