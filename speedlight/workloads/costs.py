"""FLOPs and compulsory bytes of one aten op call, from its shapes and dtypes.

Conventions (as everywhere in speedlight, see spec.Cost):
- FLOP = 2 x multiply-add for matmuls, convolutions and attention (the count
  torch.utils.flop_counter uses; bias adds are not counted). Causal attention counts
  only the unmasked half.
- Other ops count 1 FLOP per arithmetic operation per output element; exp, log, sqrt,
  rsqrt, tanh, sin, cos, erf count 1 each; composites count their parts (sigmoid 3,
  silu 4, ...). These ops are memory-bound by orders of magnitude, so the constant only
  moves their arithmetic intensity, never their bound.
- Bytes are compulsory traffic: each distinct input read once (a broadcast input once,
  not once per use), each new output written once, each in-place argument written once.
  Gathers read only the rows they gather. Views, allocations and profiler markers move
  nothing and launch no kernel.

`estimate(func, args, kwargs, out)` returns an OpCost naming the formula that produced
it, or None when no formula covers the op (callers list such ops as uncounted, with the
time they take; they are never counted as zero).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from speedlight.target import TENSOR_CORE_FAMILIES
from speedlight.workloads.tensor_io import (bind, io_bytes, tensor_bytes, out_elements, tensors,
                                            total_io, unique_tensors, written_args)

Tensor = torch.Tensor


@dataclass(frozen=True)
class OpCost:
    flops: int
    bytes: int
    formula: str  # the family that counted it: matmul, attention, pointwise, view, ...
    detail: str  # the formula with its numbers, for a reader checking it
    tensor_core: bool = False  # FLOPs run on the matmul units (peak per dtype)
    kernel: bool = True  # the op launches device work (views and allocations do not)
    case: object = None  # a speedlight op's Case (OpSpec.case_of), for a predicted time
    op_name: str = ""  # that op's OpSpec name


# ---------------------------------------------------------------------------------------
# formulas, one per family
# ---------------------------------------------------------------------------------------

Formula = Callable[..., OpCost]


def _mm_dims(a: Tensor, b: Tensor) -> tuple[int, int, int]:
    return a.shape[-2], b.shape[-1], a.shape[-1]


def matmul_formula(func, args, kwargs, out) -> OpCost:
    """mm, addmm, bmm, baddbmm, _scaled_mm: 2·B·M·N·K; mv/addmv 2·M·N; dot 2·N."""
    name = func.overloadpacket.__name__
    b = bind(func, args, kwargs)
    if name in ("mm", "_scaled_mm", "_int_mm"):
        a_, w = b["self"], b["mat2"]
    elif name == "addmm":
        a_, w = b["mat1"], b["mat2"]
    elif name == "bmm":
        a_, w = b["self"], b["mat2"]
    elif name == "baddbmm":
        a_, w = b["batch1"], b["batch2"]
    elif name in ("mv", "addmv"):
        m_ = b["self"] if name == "mv" else b["mat"]
        n, k = m_.shape
        return OpCost(2 * n * k, total_io(func, args, kwargs, out), "matmul",
                      f"2·M·K (M={n} K={k})", tensor_core=True)
    elif name in ("dot", "vdot"):
        k = b["self"].numel()
        return OpCost(2 * k, total_io(func, args, kwargs, out), "matmul", f"2·K (K={k})",
                      tensor_core=True)
    else:
        raise KeyError(name)
    m, n, k = _mm_dims(a_, w)
    batch = a_.shape[0] if a_.dim() == 3 else 1
    flops = 2 * batch * m * n * k
    dims = (f"B={batch} " if a_.dim() == 3 else "") + f"M={m} N={n} K={k}"
    formula = "2·B·M·N·K" if a_.dim() == 3 else "2·M·N·K"
    return OpCost(flops, total_io(func, args, kwargs, out), "matmul", f"{formula} ({dims})",
                  tensor_core=True)


def grouped_matmul_formula(func, args, kwargs, out) -> OpCost:
    """_grouped_mm (mixture-of-experts layers): every routed row meets one group's matrix,
    so the FLOPs do not depend on how rows are routed: [M, K] x [G, K, N] -> [M, N] is
    2·M·K·N; [M, K] x [K, N] grouped along K -> [G, M, N] (weight gradients) is 2·M·K·N;
    [G, M, K] x [G, K, N] is 2·G·M·K·N. Bytes: every operand once (every expert's weights
    read, as when each gets rows)."""
    b = bind(func, args, kwargs)
    a_, w = b["self"], b["mat2"]
    if a_.dim() == 3 and w.dim() == 3:
        g, m, k = a_.shape
        n = w.shape[-1]
        flops, dims = 2 * g * m * k * n, f"G={g} M={m} K={k} N={n}"
    elif a_.dim() == 3:  # [G, M, K] x [K?, N] grouped along N
        g, m, k = a_.shape
        n = w.shape[-1]
        flops, dims = 2 * m * k * n, f"M={m} K={k} N={n} over {g} groups"
    else:
        m, k = a_.shape
        n = w.shape[-1]
        flops, dims = 2 * m * k * n, f"M={m} K={k} N={n}"
    return OpCost(flops, total_io(func, args, kwargs, out), "matmul",
                  f"2·M·K·N, rows routed to groups ({dims})", tensor_core=True)


def _attention_dims(q: Tensor, k: Tensor, v: Tensor) -> tuple[int, int, int, int, int, int]:
    """(batch, query heads, query length, key length, qk head dim, v head dim) of
    [B, H, S, D] tensors."""
    return q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3]


def attention_formula(func, args, kwargs, out) -> OpCost:
    """Fused scaled-dot-product attention: QKᵀ and PV, 2·B·H·Sq·Sk·(Dqk + Dv);
    the backward recomputes QKᵀ and forms dP, dV, dQ, dK: 2·B·H·Sq·Sk·(3·Dqk + 2·Dv).
    Causal counts half. Bytes: q, k, v (at their own head count), mask, outputs."""
    b = bind(func, args, kwargs)
    backward = func.overloadpacket.__name__.endswith("_backward")
    q, k, v = (args[1], args[2], args[3]) if backward else (args[0], args[1], args[2])
    batch, h, sq, sk, dqk, dv = _attention_dims(q, k, v)
    causal = bool(b.get("is_causal", False))
    per = (3 * dqk + 2 * dv) if backward else (dqk + dv)
    flops = 2 * batch * h * sq * sk * per
    if causal:
        flops //= 2
    detail = (f"2·B·H·Sq·Sk·({'3·Dqk+2·Dv' if backward else 'Dqk+Dv'})"
              f"{' / 2 causal' if causal else ''} (B={batch} H={h} Sq={sq} Sk={sk} "
              f"Dqk={dqk} Dv={dv})")
    return OpCost(flops, total_io(func, args, kwargs, out), "attention", detail, tensor_core=True)


def _conv_flops(x_shape, w_shape, out_shape, transposed: bool) -> int:
    """2 · N · Cout · Cin/groups · prod(kernel) · prod(spatial), spatial being the output's
    (the input's for a transposed convolution): the count flop_counter uses."""
    spatial = (x_shape if transposed else out_shape)[2:]
    c_out, c_in_per_group, *kernel = w_shape
    return 2 * x_shape[0] * c_out * c_in_per_group * math.prod(kernel) * math.prod(spatial)


def convolution(func, args, kwargs, out) -> OpCost:
    b = bind(func, args, kwargs)
    x, w = b["input"], b["weight"]
    transposed = bool(b.get("transposed", False))
    flops = _conv_flops(list(x.shape), list(w.shape), list(tensors(out)[0].shape), transposed)
    return OpCost(flops, total_io(func, args, kwargs, out), "conv",
                  f"2·N·Cout·Cin/g·prod(kernel)·prod(spatial) (x={list(x.shape)} "
                  f"w={list(w.shape)})", tensor_core=True)


def convolution_backward(func, args, kwargs, out) -> OpCost:
    """Each requested gradient (input, weight) is a convolution of the forward's size."""
    b = bind(func, args, kwargs)
    grad_out, x, w = b["grad_output"], b["input"], b["weight"]
    transposed = bool(b["transposed"])
    mask = list(b["output_mask"])
    one = _conv_flops(list(x.shape), list(w.shape), list(grad_out.shape), transposed)
    n = int(mask[0]) + int(mask[1])
    return OpCost(one * n, total_io(func, args, kwargs, out), "conv",
                  f"{n} x forward convolution ({'dx ' if mask[0] else ''}{'dw' if mask[1] else ''})",
                  tensor_core=True)


def pointwise(per_element: int, via: str = "") -> Formula:
    def formula(func, args, kwargs, out) -> OpCost:
        n = out_elements(func, args, kwargs, out)
        return OpCost(per_element * n, total_io(func, args, kwargs, out), "pointwise",
                      f"{per_element} FLOP x {n} elements{via}")
    return formula


def reduction(per_element: int, via: str = "") -> Formula:
    def formula(func, args, kwargs, out) -> OpCost:
        n = sum(t.numel() for t in tensors(args)[:1])
        return OpCost(per_element * n, total_io(func, args, kwargs, out), "reduction",
                      f"{per_element} FLOP x {n} input elements{via}")
    return formula


def per_input_element(per_element: int, label: str) -> Formula:
    """Norms and softmax: a fixed count per element of the first input."""
    def formula(func, args, kwargs, out) -> OpCost:
        n = tensors(args)[0].numel()
        return OpCost(per_element * n, total_io(func, args, kwargs, out), label,
                      f"{per_element} FLOP x {n} elements")
    return formula


def layer_norm_backward(func, args, kwargs, out) -> OpCost:
    """dx 10, dweight 2, dbias 1 FLOP per element, for the gradients asked for."""
    b = bind(func, args, kwargs)
    n = b["grad_out"].numel()
    mask = list(b["output_mask"])
    per = 10 * mask[0] + 2 * mask[1] + 1 * mask[2]
    return OpCost(per * n, total_io(func, args, kwargs, out), "norm", f"{per} FLOP x {n} elements")


def rms_norm_backward(func, args, kwargs, out) -> OpCost:
    b = bind(func, args, kwargs)
    n = b["grad_out"].numel()
    mask = list(b["output_mask"])
    per = 7 * mask[0] + 2 * mask[1]
    return OpCost(per * n, total_io(func, args, kwargs, out), "norm", f"{per} FLOP x {n} elements")


def copy(label: str = "copy", skip_read: tuple[str, ...] = ()) -> Formula:
    """Data moved, no arithmetic: read what it reads, write what it writes."""
    def formula(func, args, kwargs, out) -> OpCost:
        r, w = io_bytes(func, args, kwargs, out, skip_read=skip_read)
        return OpCost(0, r + w, label, f"read {r} B + write {w} B")
    return formula


def fill(func, args, kwargs, out) -> OpCost:
    """Creates or overwrites a tensor with values computed from nothing but its shape."""
    bound = bind(func, args, kwargs)
    w = sum(tensor_bytes(t) for t in unique_tensors(tensors(out) + written_args(func, bound)))
    return OpCost(0, w, "fill", f"write {w} B")


def gather_rows(func, args, kwargs, out) -> OpCost:
    """embedding, index_select, gather, index: read the indices and only the gathered
    elements (as many as the output holds), write the output."""
    b = bind(func, args, kwargs)
    name = func.overloadpacket.__name__
    index_names = {"embedding": "indices", "index_select": "index", "gather": "index",
                   "index": "indices", "_unsafe_index": "indices"}
    idx = sum(tensor_bytes(t) for t in unique_tensors(tensors(b.get(index_names.get(name, "index")))))
    outs = tensors(out)
    gathered = sum(t.numel() for t in outs) * outs[0].element_size()
    written = sum(tensor_bytes(t) for t in outs)
    return OpCost(0, idx + gathered + written, "gather",
                  f"read indices {idx} B + gathered {gathered} B, write {written} B")


def embedding_backward(func, args, kwargs, out) -> OpCost:
    """Scatter-add of the gradient rows into a zeroed [num_weights, D] table."""
    b = bind(func, args, kwargs)
    grad = b["grad_output"] if "grad_output" in b else b["grad"]
    r, w = io_bytes(func, args, kwargs, out)
    return OpCost(grad.numel(), r + w, "scatter", f"{grad.numel()} adds; read {r} B + write {w} B")


def index_put(func, args, kwargs, out) -> OpCost:
    """Reads indices and values, writes as many elements as the values hold (and reads
    them first when accumulating)."""
    b = bind(func, args, kwargs)
    values = b["values"]
    idx = sum(tensor_bytes(t) for t in tensors(b["indices"]))
    n = values.numel()
    for t in tensors(b["indices"]):
        n = max(n, t.numel())
    write = n * b["self"].element_size()
    acc = bool(b.get("accumulate", False))
    total = idx + tensor_bytes(values) + write * (2 if acc else 1)
    if func.overloadpacket.__name__ == "index_put":  # functional: copies self first
        total += 2 * tensor_bytes(b["self"])
    return OpCost(n if acc else 0, total, "scatter", f"{n} elements written"
                  f"{' and accumulated' if acc else ''}")


def nll_loss(func, args, kwargs, out) -> OpCost:
    """Forward: read the targets and the one log-probability each picks; backward: write
    the whole gradient (zeros and one value per target)."""
    b = bind(func, args, kwargs)
    target = b["target"]
    n = target.numel()
    t_bytes = tensor_bytes(target) + sum(tensor_bytes(t) for t in tensors(b.get("weight")))
    if func.overloadpacket.__name__.endswith("_backward"):
        written = sum(tensor_bytes(t) for t in tensors(out))
        small = sum(tensor_bytes(t) for t in tensors(b["grad_output"]) + tensors(b["total_weight"]))
        return OpCost(n, t_bytes + small + written, "loss",
                      f"write grad {written} B, read targets {tensor_bytes(target)} B")
    picked = n * b["self"].element_size()
    written = sum(tensor_bytes(t) for t in tensors(out))
    return OpCost(n, t_bytes + picked + written, "loss",
                  f"read targets {tensor_bytes(target)} B + {n} picked values, write {written} B")


def foreach(per_element: int) -> Formula:
    """_foreach_* over lists of tensors: elementwise over every member of the lists."""
    def formula(func, args, kwargs, out) -> OpCost:
        first = tensors(args[0]) if args else []
        n = sum(t.numel() for t in first)
        return OpCost(per_element * n, total_io(func, args, kwargs, out), "foreach",
                      f"{per_element} FLOP x {n} elements over {len(first)} tensors")
    return formula


def no_data(label: str) -> Formula:
    def formula(func, args, kwargs, out) -> OpCost:
        return OpCost(0, 0, label, {"view": "metadata only (no data moved)",
                                    "alloc": "allocation (no data written)",
                                    "marker": "profiler marker"}[label], kernel=False)
    return formula


def scalar_read(func, args, kwargs, out) -> OpCost:
    t = tensors(args)[0]
    return OpCost(0, t.element_size(), "sync",
                  "read one element to the host (waits for the device)")


# ---------------------------------------------------------------------------------------
# the table: op name (overload packet) -> formula
# ---------------------------------------------------------------------------------------

_POINTWISE_FLOPS = {
    1: "add add_ sub sub_ rsub mul mul_ div div_ neg neg_ abs reciprocal maximum minimum "
       "clamp clamp_ clamp_min clamp_min_ clamp_max clamp_max_ relu relu_ threshold "
       "threshold_backward where masked_fill masked_fill_ eq ne lt le gt ge sign floor "
       "ceil round trunc fmod remainder exp exp_ log log_ log1p expm1 sqrt sqrt_ rsqrt "
       "rsqrt_ sin cos tanh erf pow pow_ square logical_not logical_and logical_or bitwise_not "
       "bitwise_and bitwise_or isnan isinf nan_to_num hardtanh leaky_relu",
    2: "floor_divide lerp lerp_ addcmul addcmul_ addcdiv addcdiv_ tanh_backward native_dropout "
       "native_dropout_backward sigmoid_backward",
    3: "sigmoid sigmoid_ mse_loss",
    4: "silu silu_ hardswish mish elu",
    6: "silu_backward mse_loss_backward softplus binary_cross_entropy_with_logits",
    8: "gelu gelu_ gelu_backward",
}

_FORMULAS: dict[str, Formula] = {}
for _k, _names in _POINTWISE_FLOPS.items():
    for _n in _names.split():
        _FORMULAS[_n] = pointwise(_k)

for _n in "mm addmm bmm baddbmm mv addmv dot vdot _scaled_mm _int_mm".split():
    _FORMULAS[_n] = matmul_formula
for _n in ("_scaled_dot_product_flash_attention _scaled_dot_product_efficient_attention "
           "_scaled_dot_product_cudnn_attention _scaled_dot_product_flash_attention_for_cpu "
           "_scaled_dot_product_fused_attention_overrideable").split():
    _FORMULAS[_n] = attention_formula
    _FORMULAS[_n + "_backward"] = attention_formula
_FORMULAS["convolution"] = convolution
_FORMULAS["_grouped_mm"] = grouped_matmul_formula
_FORMULAS["convolution_backward"] = convolution_backward

for _n, _k in {"sum": 1, "mean": 1, "amax": 1, "amin": 1, "max": 1, "min": 1, "prod": 1,
               "any": 1, "all": 1, "argmax": 1, "argmin": 1, "nansum": 1, "cumsum": 1,
               "cumprod": 1, "count_nonzero": 1, "linalg_vector_norm": 2, "norm": 2,
               "logsumexp": 3, "var": 3, "std": 3, "var_mean": 3, "std_mean": 3,
               "topk": 1, "histc": 1, "sort": 1}.items():
    _FORMULAS[_n] = reduction(_k)

_FORMULAS.update({
    "native_layer_norm": per_input_element(7, "norm"),
    "native_layer_norm_backward": layer_norm_backward,
    "_fused_rms_norm": per_input_element(4, "norm"),
    "_fused_rms_norm_backward": rms_norm_backward,
    "native_group_norm": per_input_element(7, "norm"),
    "native_group_norm_backward": per_input_element(12, "norm"),
    "native_batch_norm": per_input_element(7, "norm"),
    "_native_batch_norm_legit": per_input_element(7, "norm"),
    "_native_batch_norm_legit_no_training": per_input_element(4, "norm"),
    "native_batch_norm_backward": per_input_element(12, "norm"),
    "_softmax": per_input_element(5, "softmax"),
    "_log_softmax": per_input_element(5, "softmax"),
    "_softmax_backward_data": per_input_element(4, "softmax"),
    "_log_softmax_backward_data": per_input_element(4, "softmax"),
    "nll_loss_forward": nll_loss, "nll_loss_backward": nll_loss,
    "nll_loss2d_forward": nll_loss, "nll_loss2d_backward": nll_loss,
    "embedding": gather_rows, "index_select": gather_rows, "gather": gather_rows,
    "index": gather_rows, "_unsafe_index": gather_rows,
    "embedding_dense_backward": embedding_backward,
    "index_put": index_put, "index_put_": index_put, "_index_put_impl_": index_put,
    "_local_scalar_dense": scalar_read,
    # a device-side check of one value (one_hot's range check): read it, launch a kernel
    "_assert_async": copy("check"),
    "copy_": copy(skip_read=("self",)),
    "fill_": fill, "zero_": fill, "zeros": fill, "ones": fill, "full": fill,
    "zeros_like": fill, "ones_like": fill, "full_like": fill, "new_zeros": fill,
    "new_ones": fill, "new_full": fill, "scalar_tensor": fill, "arange": fill,
    "linspace": fill, "eye": fill, "rand": fill, "randn": fill, "randint": fill,
    "rand_like": fill, "randn_like": fill, "randint_like": fill, "normal_": fill,
    "uniform_": fill, "bernoulli_": fill, "randperm": fill,
    "_fused_adamw_": foreach(16), "_fused_adam_": foreach(15), "_fused_sgd_": foreach(4),
})
for _n in ("_to_copy clone cat stack constant_pad_nd repeat repeat_interleave roll flip tril "
           "triu slice_backward select_backward expand_copy lift_fresh_copy scatter scatter_ "
           "scatter_add scatter_add_ index_add index_add_ masked_scatter masked_select "
           "nonzero nonzero_static split_with_sizes_copy unbind_copy bernoulli "
           "view_copy permute_copy transpose_copy t_copy").split():
    _FORMULAS[_n] = copy()
for _n in ("empty empty_like empty_strided new_empty new_empty_strided empty_permuted "
           "resize_ set_").split():
    _FORMULAS[_n] = no_data("alloc")
_FORMULAS["_unsafe_view"] = no_data("view")  # aliases its input, though the schema says not
_FORMULAS["detach_"] = no_data("view")  # in place, on metadata only

_FOREACH_FLOPS = {"add": 1, "sub": 1, "mul": 1, "div": 1, "neg": 1, "sqrt": 1, "rsqrt": 1,
                  "reciprocal": 1, "maximum": 1, "minimum": 1, "clamp_min": 1, "clamp_max": 1,
                  "abs": 1, "exp": 1, "sign": 1, "pow": 1, "lerp": 2, "addcmul": 2,
                  "addcdiv": 2, "copy": 0, "zero": 0, "norm": 2}


# speedlight's own ops (what a patched model runs), and a team's registered through
# speedlight.ops.registration: costed by their OpSpec's cost, at the Case their case_of
# reads from the call's arguments. An op without a case_of is put at its tensors read
# and written once and 8 FLOP per element of its first input, and says so.
def _speedlight_op(func, args, kwargs, out) -> OpCost:
    call = func.overloadpacket.__name__
    direction = "bwd" if call.endswith("_bwd") else "fwd"
    bound = bind(func, args, kwargs)
    for spec in _specs():
        case = spec.case_of(call, bound) if spec.case_of is not None else None
        if case is None:
            continue
        c = spec.cost(case, direction)
        if c is not None:
            return OpCost(int(c.flops), int(c.bytes), "fused",
                          f"{spec.name} {direction} cost (its OpSpec) at {case.id}",
                          tensor_core=spec.family in TENSOR_CORE_FAMILIES, case=case,
                          op_name=spec.name)
    n = tensors(args)[0].numel()
    return OpCost(8 * n, total_io(func, args, kwargs, out), "fused",
                  f"{call}: no OpSpec reads this call; its tensors read and written once, "
                  f"8 FLOP x {n} elements (estimate)")


_SPECS: list = []


def _specs() -> list:
    """The OpSpecs that can cost a speedlight op (built-in ones, loaded on first use)."""
    if not _SPECS:
        from speedlight import registry
        _SPECS.extend(registry.builtin_specs())
    return _SPECS


def formula_for(func) -> Formula | None:
    """The formula of an op, or None when speedlight has none for it."""
    if func.namespace == "profiler":
        return no_data("marker")
    if func.namespace == "speedlight":
        return _speedlight_op
    name = func.overloadpacket.__name__
    if name in _FORMULAS:
        return _FORMULAS[name]
    if name.startswith("_foreach_"):
        base = name[len("_foreach_"):].rstrip("_")
        if base in _FOREACH_FLOPS:
            return foreach(_FOREACH_FLOPS[base])
    if func.is_view:
        return no_data("view")
    if torch.Tag.pointwise in func.tags:
        return pointwise(1, " (pointwise by its torch tag)")
    if torch.Tag.reduction in func.tags:
        return reduction(1, " (reduction by its torch tag)")
    return None


def estimate(func, args: tuple, kwargs: dict | None, out: Any) -> OpCost | None:
    """The cost of one call of `func` (an aten OpOverload) with these arguments and
    outputs, or None when no formula covers it."""
    formula = formula_for(func)
    if formula is None:
        return None
    return formula(func, args, kwargs or {}, out)


def known_ops() -> list[str]:
    """Names of the ops with an explicit formula (pointwise and reduction ops are also
    covered by their torch tags, and views by their schema)."""
    return sorted(_FORMULAS)
