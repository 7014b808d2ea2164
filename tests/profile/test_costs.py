"""Golden tests: every FLOP/byte formula against values computed by hand in the comments."""

import pytest
import torch

from speedlight.workloads import costs

aten = torch.ops.aten
F32, BF16, I64 = torch.float32, torch.bfloat16, torch.int64


def meta(*shape, dtype=F32):
    return torch.empty(shape, dtype=dtype, device="meta")


def cost(func, *args, **kwargs):
    """Run the op (on meta tensors: shapes only) and count it."""
    return costs.estimate(func, args, kwargs, func(*args, **kwargs))


def check(c, flops, nbytes, formula):
    assert c is not None
    assert (c.flops, c.bytes, c.formula) == (flops, nbytes, formula), c.detail


# -- matmul ---------------------------------------------------------------------------------

def test_mm():
    # 2·M·N·K = 2·64·32·128; read a (64·128) and b (128·32), write 64·32, fp32
    c = cost(aten.mm.default, meta(64, 128), meta(128, 32))
    check(c, 524_288, (8192 + 4096 + 2048) * 4, "matmul")
    assert c.tensor_core and c.kernel


def test_addmm_counts_the_bias_read_not_its_flops():
    c = cost(aten.addmm.default, meta(32), meta(64, 128), meta(128, 32))
    check(c, 524_288, (32 + 8192 + 4096 + 2048) * 4, "matmul")


def test_bmm_and_baddbmm_bf16():
    # 2·B·M·N·K = 2·8·64·32·128; bytes (8·64·128 + 8·128·32 + 8·64·32)·2
    check(cost(aten.bmm.default, meta(8, 64, 128, dtype=BF16), meta(8, 128, 32, dtype=BF16)),
          4_194_304, 229_376, "matmul")
    check(cost(aten.baddbmm.default, meta(8, 64, 32, dtype=BF16), meta(8, 64, 128, dtype=BF16),
               meta(8, 128, 32, dtype=BF16)), 4_194_304, 229_376 + 8 * 64 * 32 * 2, "matmul")


def test_mv_and_dot():
    check(cost(aten.mv.default, meta(64, 128), meta(128)), 2 * 64 * 128, (8192 + 128 + 64) * 4, "matmul")
    check(cost(aten.dot.default, meta(100), meta(100)), 200, (100 + 100 + 1) * 4, "matmul")


# -- attention ------------------------------------------------------------------------------

Q, KV = (2, 4, 128, 64), (2, 2, 128, 64)  # batch 2, 4 query heads, 2 kv heads (GQA), 128 tokens


def test_attention_forward_and_causal_half():
    q, k, v = meta(*Q), meta(*KV), meta(*KV)
    # 2·B·H·Sq·Sk·(Dqk + Dv) = 2·2·4·128·128·128
    full = 33_554_432
    # read q (2·4·128·64) and k, v at 2 heads; write out (as q) and logsumexp (2·4·128), fp32
    nbytes = (65536 + 2 * 32768 + 65536 + 1024) * 4
    check(cost(aten._scaled_dot_product_flash_attention_for_cpu.default, q, k, v, 0.0, False),
          full, nbytes, "attention")
    check(cost(aten._scaled_dot_product_flash_attention_for_cpu.default, q, k, v, 0.0, True),
          full // 2, nbytes, "attention")


def test_attention_backward():
    q, k, v = meta(*Q), meta(*KV), meta(*KV)
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, False)
    # 2·B·H·Sq·Sk·(3·Dqk + 2·Dv) = 2·2·4·128·128·320
    grad_out = meta(*Q)
    c = cost(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, grad_out, q, k, v, out,
             lse, 0.0, True)
    # read dO, q, k, v, out, lse; write dq, dk, dv
    nbytes = (65536 * 3 + 32768 * 2 + 1024 + 65536 + 32768 * 2) * 4
    check(c, 83_886_080 // 2, nbytes, "attention")


# -- convolution ----------------------------------------------------------------------------

def test_convolution():
    x, w, b = meta(2, 3, 32, 32), meta(8, 3, 3, 3), meta(8)
    # 2·N·Cout·Cin·kh·kw·Hout·Wout = 2·2·8·3·9·1024
    c = cost(aten.convolution.default, x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    check(c, 884_736, (2 * 3 * 1024 + 8 * 27 + 8 + 2 * 8 * 1024) * 4, "conv")


def test_grouped_convolution_counts_input_channels_per_group():
    x, w = meta(2, 4, 16, 16), meta(8, 2, 3, 3)  # groups 2: each output channel sees 2 inputs
    c = cost(aten.convolution.default, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 2)
    check(c, 2 * 2 * 8 * 2 * 9 * 256, (2 * 4 * 256 + 8 * 18 + 2 * 8 * 256) * 4, "conv")


def test_convolution_backward_is_one_forward_per_gradient():
    x, w, go = meta(2, 3, 32, 32), meta(8, 3, 3, 3), meta(2, 8, 32, 32)
    args = (go, x, w, [8], [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    # read dy, x, w; write dx (as x) and dw (as w)
    check(cost(aten.convolution_backward.default, *args, [True, True, False]),
          2 * 884_736, (16384 + 6144 + 216 + 6144 + 216) * 4, "conv")
    check(cost(aten.convolution_backward.default, *args, [False, True, False]),
          884_736, (16384 + 6144 + 216 + 216) * 4, "conv")


# -- pointwise, reductions, norms, softmax ----------------------------------------------------

def test_pointwise_reads_a_broadcast_input_once():
    # 32 outputs; read x (32) and the row (8) once, write 32
    check(cost(aten.add.Tensor, meta(4, 8), meta(8)), 32, (32 + 8 + 32) * 4, "pointwise")
    row = meta(1, 8).expand(4, 8)  # stride 0 on dim 0: 8 distinct elements
    check(cost(aten.mul.Tensor, meta(4, 8), row), 32, (32 + 8 + 32) * 4, "pointwise")


def test_pointwise_flop_weights_and_same_input_twice():
    check(cost(aten.silu.default, meta(1000)), 4000, 8000, "pointwise")  # sigmoid (3) + mul
    x = meta(32)
    check(cost(aten.mul.Tensor, x, x), 32, 2 * 128, "pointwise")  # x read once


def test_in_place_reads_and_writes_self():
    x, y = torch.zeros(32), torch.ones(32)
    check(cost(aten.add_.Tensor, x, y), 32, (32 + 32 + 32) * 4, "pointwise")


def test_pointwise_by_tag():
    c = cost(aten.hypot.default, meta(10), meta(10))
    check(c, 10, 120, "pointwise")
    assert "torch tag" in c.detail


def test_reductions():
    x = meta(16, 256)
    check(cost(aten.sum.dim_IntList, x, [-1]), 4096, (4096 + 16) * 4, "reduction")
    check(cost(aten.var.correction, x, [-1]), 3 * 4096, (4096 + 16) * 4, "reduction")


def test_layer_norm_forward_and_backward():
    x, w, b = meta(16, 256), meta(256), meta(256)
    # read x, w, b; write y, mean, rstd (16 rows each)
    check(cost(aten.native_layer_norm.default, x, [256], w, b, 1e-5),
          7 * 4096, (4096 + 256 + 256 + 4096 + 16 + 16) * 4, "norm")
    mean, rstd = meta(16, 1), meta(16, 1)
    # dx 10, dw 2, db 1 per element; read dy, x, mean, rstd, w, b; write dx, dw, db
    check(cost(aten.native_layer_norm_backward.default, meta(16, 256), x, [256], mean, rstd, w, b,
               [True, True, True]),
          13 * 4096, (4096 + 4096 + 16 + 16 + 256 + 256 + 4096 + 256 + 256) * 4, "norm")


def test_fused_rms_norm():
    x, w = meta(16, 256), meta(256)
    # 4 per element; read x, w; write y and rstd (16 rows)
    check(cost(aten._fused_rms_norm.default, x, [256], w, 1e-6), 4 * 4096,
          (4096 + 256 + 4096 + 16) * 4, "norm")


def test_fused_rms_norm_backward():
    dy, x, rstd, w = meta(16, 256), meta(16, 256), meta(16, 1), meta(256)
    # dx 7, dw 2 per element; read dy, x, rstd, w; write dx, dw
    check(cost(aten._fused_rms_norm_backward.default, dy, x, [256], rstd, w, [True, True]),
          9 * 4096, (4096 + 4096 + 16 + 256 + 4096 + 256) * 4, "norm")
    check(cost(aten._fused_rms_norm_backward.default, dy, x, [256], rstd, w, [True, False]),
          7 * 4096, (4096 + 4096 + 16 + 256 + 4096) * 4, "norm")


def test_softmax_forward_and_backward():
    x = meta(16, 1000)
    check(cost(aten._softmax.default, x, -1, False), 5 * 16000, 2 * 16000 * 4, "softmax")
    # read dy and y, write dx
    check(cost(aten._log_softmax_backward_data.default, meta(16, 1000), x, -1, F32), 4 * 16000,
          3 * 16000 * 4, "softmax")


# -- loss, gathers, copies ------------------------------------------------------------------

def test_nll_loss_reads_one_value_per_target():
    logp, target = meta(16, 1000), meta(16, dtype=I64)
    # read 16 targets (int64) and the 16 values they pick; write the loss and total weight
    check(cost(aten.nll_loss_forward.default, logp, target, None, 1, -100), 16, 16 * 8 + 16 * 4 + 4 + 4, "loss")


def test_nll_loss_backward_writes_the_whole_gradient():
    logp, target = meta(16, 1000), meta(16, dtype=I64)
    c = cost(aten.nll_loss_backward.default, meta(), logp, target, None, 1, -100, meta())
    check(c, 16, 16 * 8 + 4 + 4 + 16000 * 4, "loss")


def test_embedding_reads_only_the_gathered_rows():
    w, idx = meta(1000, 64), meta(2, 16, dtype=I64)
    # read 32 indices and 32 rows of 64, write 32 rows
    check(cost(aten.embedding.default, w, idx), 0, 32 * 8 + 2 * 32 * 64 * 4, "gather")


def test_embedding_backward_writes_the_table():
    c = cost(aten.embedding_dense_backward.default, meta(2, 16, 64), meta(2, 16, dtype=I64), 1000, -1, False)
    check(c, 2048, (2048 + 1000 * 64) * 4 + 32 * 8, "scatter")


def test_index_select_and_gather():
    check(cost(aten.index_select.default, meta(100, 64), 0, meta(10, dtype=I64)), 0,
          10 * 8 + 2 * 640 * 4, "gather")
    check(cost(aten.gather.default, meta(16, 1000), 1, meta(16, 1, dtype=I64)), 0,
          16 * 8 + 2 * 16 * 4, "gather")


def test_index_put():
    x, idx, v = torch.zeros(100, 64), torch.arange(10), torch.ones(10, 64)
    # read 10 indices and the values; write 640 elements (and read them when accumulating)
    check(cost(aten.index_put_.default, x, (idx,), v), 0, 80 + 2560 + 2560, "scatter")
    check(cost(aten.index_put_.default, x, (idx,), v, True), 640, 80 + 2560 + 2 * 2560, "scatter")


def test_copies():
    x = meta(16, 256)
    check(cost(aten._to_copy.default, x, dtype=BF16), 0, 4096 * 4 + 4096 * 2, "copy")
    check(cost(aten.cat.default, [meta(4, 8), meta(4, 8)]), 0, (32 + 32 + 64) * 4, "copy")
    dst, src = torch.zeros(32, dtype=BF16), torch.ones(32)
    check(cost(aten.copy_.default, dst, src), 0, 32 * 4 + 32 * 2, "copy")  # dst written, not read
    check(cost(aten.slice_backward.default, meta(4, 8), [4, 16], 1, 0, 8, 1), 0, (32 + 64) * 4, "copy")


def test_fills_write_only():
    check(cost(aten.zeros.default, [16, 256], dtype=F32, device="meta"), 0, 16384, "fill")
    check(cost(aten.fill_.Scalar, torch.zeros(32), 1.0), 0, 128, "fill")


def test_views_allocations_and_markers_launch_nothing():
    x = meta(4, 8)
    for c in (cost(aten.view.default, x, [32]), cost(aten.t.default, x),
              cost(aten.expand.default, meta(1, 8), [4, 8]), cost(aten._unsafe_view.default, x, [8, 4])):
        check(c, 0, 0, "view")
        assert not c.kernel
    c = cost(aten.empty.memory_format, [1024], device="meta")
    check(c, 0, 0, "alloc")
    assert not c.kernel
    marker = costs.formula_for(torch.ops.profiler._record_function_exit._RecordFunction)
    assert marker is not None and not marker(None, (), {}, None).kernel


def test_foreach_over_lists():
    a, b, c, d = torch.zeros(10), torch.zeros(20), torch.ones(10), torch.ones(20)
    # 30 elements; read all four tensors, write a and b in place
    check(cost(aten._foreach_add_.List, [a, b], [c, d]), 30, (60 + 30) * 4, "foreach")


def test_fused_adamw_counts_what_its_schema_writes():
    p, g, m, v = (torch.zeros(10) for _ in range(4))
    step = torch.zeros(())
    c = cost(aten._fused_adamw_.default, [p], [g], [m], [v], [], [step], lr=1e-3, beta1=0.9,
             beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
    # read p, g, m, v, step; write p, g (the schema marks grads written), m, v
    check(c, 160, (40 * 4 + 4) + 40 * 4, "foreach")


def test_scalar_read_is_a_sync():
    check(cost(aten._local_scalar_dense.default, torch.ones(1)), 0, 4, "sync")


def test_ops_without_a_formula_are_none():
    assert costs.formula_for(aten.median.default) is None
    assert cost(aten.median.default, meta(10)) is None


@pytest.mark.parametrize("name", costs.known_ops())
def test_every_known_name_is_an_aten_op(name):
    assert hasattr(aten, name), f"{name} is in the formula table but is no aten op"


def test_every_speedlight_op_call_is_costed_by_its_opspec():
    """Each registered op a built-in op calls (forward, inference and backward) is costed
    by that op's OpSpec.cost at the case the call reads, not by a flat estimate."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from speedlight import registry

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.namespace == "speedlight":
                calls.append((func, args, kwargs or {}, out))
            return out

    for spec in registry.builtin_specs():
        case = next(c for c in spec.cases("quick") if all(v for _, v in c.params))
        inputs = spec.make_inputs(case, "cpu")
        calls = []
        with Record():
            with torch.no_grad():  # the inference op
                spec.impl(**inputs)
            leaves = {n: inputs[n].detach().requires_grad_() for n in spec.grad_inputs
                      if isinstance(inputs.get(n), torch.Tensor)}
            out = spec.impl(**{**inputs, **leaves})
            outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o.requires_grad]
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        assert {f.overloadpacket.__name__.rsplit("_", 1)[1] for f, *_ in calls} >= {"fwd", "bwd"}
        for func, args, kwargs, out in calls:
            c = costs.estimate(func, args, kwargs, out)
            direction = "bwd" if func.overloadpacket.__name__.endswith("_bwd") else "fwd"
            assert c.detail.startswith(f"{spec.name} {direction} cost (its OpSpec)"), c.detail
            at = spec.case_of(func.overloadpacket.__name__, costs.bind(func, args, kwargs))
            assert at.params == case.params, (at.id, case.id)
            assert c.bytes == spec.cost(at, direction).bytes
