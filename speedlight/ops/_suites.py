"""Case-suite helpers shared by several ops' OpSpecs."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from speedlight import shapes
from speedlight.spec import Case


def skip_huge_on_cpu(case, device, what: str = "rows x stride > 2^31") -> str | None:
    """The OpSpec skip of an op whose only CPU-impossible cases are flagged `huge`; `what`
    says in the reason what passes 2^31."""
    if case.flag("huge") and torch.device(device).type != "cuda":
        return (f"64-bit indexing case: {what} needs > 4 GiB per tensor and "
                "hours under the interpreter; it runs on a GPU")
    return None


def norm_cases(op: str, suite: str, *, quick_variants: Sequence[tuple[int, int, dict]] = (),
               full_variants: Sequence[dict] = (),
               model_flags: Callable[[shapes.ModelConfig], dict] = lambda m: {}) -> list[Case]:
    """The cases of a norm over [rows, hidden] (rms_norm, add_rms_norm, layer_norm).

    model: every model's hidden size at shapes.MODEL_TOKENS, with the flags
    model_flags(model) gives it (Gemma's offset), once per distinct (hidden, flags).
    quick and full: rows_and_width's shapes, strided and transposed layouts, NaN/Inf,
    empty input and rows longer than one block, plus the op's own variants:
    quick_variants as (rows, hidden, flags), full_variants as flags on 257 x 4093; full also
    has the 64-bit indexing case (rows x row stride > 2^31, skipped on CPU).
    """
    def case(rows, hidden, layout="contiguous", model=None, **flags):
        return Case(op, (("rows", rows), ("hidden", hidden)), layout=layout, flags=flags,
                    model=model)

    points = shapes.rows_width_variant(suite, "hidden", lambda m: tuple(model_flags(m).items()))
    out = [case(r, w, model=m, **dict(v or ())) for r, w, m, v in points]
    if suite == "quick":
        out += [case(37, 128, "strided"), case(5, 781, "strided"), case(4, 1000, "transposed")]
        out += [case(r, w, **flags) for r, w, flags in quick_variants]
        out += [case(5, 781, nonfinite=True), case(0, 128), case(2, 70001, "strided")]
    if suite == "full":
        out += [case(r, w, "strided") for r, w, m, _ in points if m is None and r * w <= 2**24]
        out += [case(257, 4093, **flags) for flags in full_variants]
        out += [case(3, 100003, "transposed"), case(257, 1021, nonfinite=True), case(0, 4096),
                case(65537, 32771, huge=True)]
    return out


# --- OpSpec.case_of: the Case of one call of a registered op ------------------------------

def is_call_of(call: str, name: str) -> bool:
    """Whether `call` names one of op `name`'s registered custom ops (forward, inference
    or backward)."""
    return call in (f"{name}_fwd", f"{name}_infer", f"{name}_bwd")


def rows_case(op: str, x: torch.Tensor, width: str, rows: str = "rows", **flags) -> Case:
    """The Case of a call over x's rows: [<rows>, <width>] in x's dtype, with the flags
    whose value is not None."""
    n = x.shape[-1]
    return Case(op, ((rows, x.numel() // n if n else 0), (width, n)), dtype=x.dtype,
                flags={k: v for k, v in flags.items() if v is not None})


# --- the memory-bound family's comparison shapes -------------------------------------------

HEAD_DIM = 128  # rope's head at a family shape: hidden / 128 query heads, 8 key heads


def family_case(op: str, rows: int, hidden: int, dtype: torch.dtype) -> Case:
    """The Case of memory-bound op `op` at `rows` x `hidden`, the one shape the family is
    compared at (scripts/gpu/membound.py, scripts/bytes_in_flight.py): the row width is
    the norms' hidden, the GLUs' intermediate, softmax's columns, cross_entropy's vocabulary;
    rope rotates hidden / 128 query heads of 128 dims and 8 key heads, laid out as its model
    suite (transposed from [batch, heads, seq, dim])."""
    if op == "rope":
        return Case(op, (("batch", 1), ("seq", rows), ("heads", hidden // HEAD_DIM), ("kv", 8),
                         ("dim", HEAD_DIM), ("rot", HEAD_DIM)), dtype=dtype, layout="transposed")
    width = {"swiglu": "intermediate", "geglu": "intermediate", "softmax": "cols",
             "cross_entropy": "vocab"}.get(op, "hidden")
    rows_name = "tokens" if op == "cross_entropy" else "rows"
    return Case(op, ((rows_name, rows), (width, hidden)), dtype=dtype)
