"""Case-suite helpers shared by several ops' OpSpecs."""

from __future__ import annotations

import re
from typing import Callable, Sequence

import torch

from speedlight import shapes
from speedlight.spec import Case, Chain


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


# --- OpSpec.recognise: the chains an op replaces in a profiled forward --------------------

_RMS_CLASS = re.compile(r"rms_?norm", re.I)
_LN_CLASS = re.compile(r"layer_?norm", re.I)


def norm_chains(g, calls, op: str) -> list[Chain]:
    """The recogniser of norm `op` (rms_norm, add_rms_norm, layer_norm): an RMSNorm or
    LayerNorm module's call done in several kernel ops (its class says what it is, whatever
    ops it takes), an RMSNorm with the residual add that feeds it being add_rms_norm's.
    The Case is x over its rows, with a weight or not, and Gemma's offset (1 + w)."""
    rms = op in ("rms_norm", "add_rms_norm")
    by_call: dict[int, set[int]] = {}
    for r in g.fwd:
        if r["call"] is not None:
            by_call.setdefault(r["call"], set()).add(r["index"])
    chains = []
    for call in calls:
        ops, cls = by_call.get(call.id, set()), call.module_class or ""
        if not (_RMS_CLASS if rms else _LN_CLASS).search(cls) or g.kernel_ops(ops) < 2:
            continue
        first = min(ops)
        x = g.row(first)["inputs"][0]
        src = call.input_producers[0] if call.input_producers else None
        if src is not None and g.row(src)["outputs"]:
            x = g.row(src)["outputs"][0]
        weight = next((t for i in sorted(ops) for t, p in zip(g.row(i)["inputs"],
                                                               g.row(i)["producers"])
                       if p is None and t["shape"] == x["shape"][-1:]), None)
        offset = cls.lower().startswith("gemma")
        add = g.base(src)
        with_add = rms and add is not None and g.name(add) == "add" \
            and len(g.row(add)["inputs"]) == 2 \
            and g.row(add)["inputs"][0]["shape"] == g.row(add)["inputs"][1]["shape"]
        if with_add != (op == "add_rms_norm"):
            continue
        flags = {"weight": False if weight is None else None, "offset": 1 if offset else None}
        if op == "layer_norm":
            flags = {"weight": flags["weight"], "bias": flags["weight"]}
        case = rows_case(op, g.tensor(x), "hidden", **flags)
        note = "offset=1 (Gemma's 1 + w)" if offset else ""
        if with_add:
            chains.append(Chain(f"residual add + {cls}",
                                ops | {add} | g.views_between(add, first), call.module, case,
                                note))
        else:
            chains.append(Chain(f"{cls} in {g.kernel_ops(ops)} ops", ops, call.module, case,
                                note))
    return chains
