"""linear_cross_entropy's schedules: what the memory budget picks at the headline shape,
each schedule against the unfused computation, the memory each holds at a CPU-sized shape
(both settings), no zero-fill, cast pass or scaling by an upstream gradient of 1, and what
profile is told of the schedule."""

import pytest
import torch
import torch.nn.functional as F
from triton.runtime.interpreter import InterpretedFunction

import speedlight
from speedlight.launch import watch_launches
from speedlight.ops import linear_cross_entropy as op
from speedlight.ops import linear_cross_entropy_chunks as chunks
from speedlight.ops import linear_cross_entropy_schedule as sched
from speedlight.kernels.matmul import INTERPRETED
from tests.ops.test_linear_cross_entropy import LiveBytes, SeeThrough, inputs

BF16 = torch.bfloat16
N, H, V = sched.HEADLINE["tokens"], sched.HEADLINE["hidden"], sched.HEADLINE["vocab"]


def test_the_budget_picks_the_schedule_at_the_headline_shape():
    """16384 tokens of Llama 3's lm_head in bf16: the default budget (1 GiB) sums d_weight
    in itself over 4 chunks of 4096 tokens in 1.05 GB; the low-memory one (0.25 GB) takes
    vocabulary blocks (one rounding, a fourth matmul); 3 GB an fp32 accumulator; the
    whole logits a single chunk. The planner never rounds a bf16 d_weight more than
    MAX_HALF_ROUNDINGS times."""
    default, low = sched.headline(), sched.headline(sched.LOW_MEMORY_BUDGET)
    assert (default.kind, default.n_chunks, default.chunk_tokens) == ("in-place", 4, 4096)
    assert default.roundings == 4 and default.extra_bytes <= 1.1e9
    assert (low.kind, low.roundings) == ("vocab-major", 1) and low.extra_bytes <= 0.25e9
    assert low.n_blocks * low.vocab_block >= V and low.chunk_tokens * low.n_chunks >= N
    acc = sched.headline(3 * 10 ** 9)
    assert (acc.kind, acc.roundings) == ("fp32-accumulator", 1) and acc.extra_bytes <= 3e9
    assert sched.headline(N * V * 2).n_chunks == 1
    # an fp32 d_weight (fp32 master weights under autocast) is summed in itself
    assert sched.plan_schedule(N, V, H, BF16, torch.float32, weight_copy=True).kind == "in-place"
    # an explicit chunk size keeps token chunks
    forced = sched.plan_schedule(N, V, H, BF16, BF16, memory_budget=1, chunk_size=512)
    assert forced.kind == "in-place"
    for budget in [2 ** k for k in range(20, 34)]:
        s = sched.headline(budget)
        assert s.kind != "in-place" or s.roundings <= sched.MAX_HALF_ROUNDINGS, s
    flops = [sched.schedule_work(s, N, V, H, BF16)["flops"] for s in (default, low)]
    assert flops[1] == flops[0] * 4 // 3  # the logits once more


@pytest.mark.parametrize("setting", [None, sched.LOW_MEMORY_BUDGET], ids=["default", "low"])
def test_a_small_case_is_rounded_as_often_as_the_headline(setting):
    """What verify runs on a CPU (OpSpec.make_inputs' budget): the headline's schedule kind
    and, token-major, its chunk count."""
    want = sched.headline(setting, BF16)
    for n, v, h in ((37, 300, 32), (64, 2000, 16), (1000, 4000, 16)):
        got = sched.plan_schedule(n, v, h, BF16, BF16,
                         memory_budget=sched.budget_like(want, n, v, h, BF16))
        assert got.kind == want.kind and (got.kind == "vocab-major"
                                           or got.n_chunks == want.n_chunks), (n, v, got)
    case = op.SPEC.cases("quick")[1].with_(dtype=BF16)  # (37, 32, 300) at the default
    assert op.make_inputs(case, "cpu")["memory_budget"] == sched.budget_like(
        sched.headline(None, BF16), 37, 300, 32, BF16)


def _forced(monkeypatch, kind: str):
    """Make the launcher take `kind` whatever the dtypes (fp32 here, so that the result can
    be held to the unfused computation at fp32's precision): 3 chunks, 2 blocks."""
    real = chunks.plan_schedule

    def plan(n, vocab, hidden, mm_dtype, grad_dtype, **kwargs):
        if kwargs.get("grad_weight"):
            return sched.Schedule(kind, 7, 48 if kind == "vocab-major" else 0, 3,
                                  2 if kind == "vocab-major" else 0, 1, 0)
        return real(n, vocab, hidden, mm_dtype, grad_dtype, **kwargs)
    monkeypatch.setattr(chunks, "plan_schedule", plan)


def test_vocab_major_matches_linear_then_cross_entropy(monkeypatch, device):
    """Every option at once (bias, class weights, smoothing, z-loss, softcap, ignored
    tokens) with a per-token upstream gradient (reduction "none": the backward computes the
    gradients), at fp32's precision. (The fp32 accumulator runs in the quick suite's bf16
    and fp16 cases with explicit chunks, held to verify's rule.)"""
    kind = "vocab-major"
    h, w, t, b = inputs(20, 16, 96, device, bias=True)
    t[::4] = -100
    cw = torch.rand(96, generator=torch.Generator().manual_seed(3)).to(device)
    kwargs = dict(label_smoothing=0.1, z_loss=1e-3, softcap=20.0)
    _forced(monkeypatch, kind)
    for reduction, upstream in (("none", torch.randn(20)),):
        results = []
        for fn in (lambda *a: speedlight.linear_cross_entropy(*a, class_weight=cw,
                                                              reduction=reduction, **kwargs),
                   lambda *a: speedlight.cross_entropy(F.linear(*a[:2], a[3]), a[2], weight=cw,
                                                       reduction=reduction, **kwargs)):
            leaves = [x.detach().clone().requires_grad_() for x in (h, w, b)]
            loss = fn(leaves[0], leaves[1], t, leaves[2])
            results.append((loss, torch.autograd.grad(loss, leaves, upstream.to(device))))
        (loss, grads), (ref, ref_grads) = results
        torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
        for g, g_ref in zip(grads, ref_grads):
            torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not INTERPRETED, reason="follows the interpreter's launches")
def test_no_zero_fill_cast_pass_or_scaling_by_one(device, monkeypatch):
    """bf16 with explicit chunks takes the fp32 accumulator: the first chunk writes it
    (nothing zero-filled), the last chunk's GEMM (speedlight's, one launch) adds it and
    writes bf16 d_weight (no cast pass); the default budget's in-place sum writes d_weight
    itself from the first chunk on. In both, loss.backward() (upstream gradient 1) runs
    the scaling kernel, which reads 1 on the device and leaves the gradients alone: no
    aten op fills, casts or multiplies a [V, H] tensor."""
    n, hidden, vocab = 48, 24, 96
    h, w, t, _ = inputs(n, hidden, vocab, device, dtype=BF16)
    passes = {"fill_", "zero_", "zeros", "zeros_like", "full", "to", "_to_copy", "mul", "mul_"}

    class Passes(SeeThrough):
        """aten ops outside Triton launches (the interpreter converts and copies a
        launch's tensors itself: no GPU launch does)."""

        def __init__(self):
            super().__init__()
            self.found, self.launching = [], False

        def seen(self, func, args):
            self.name = func.overloadpacket.__name__

        def made(self, out, args):
            outs = out if isinstance(out, (tuple, list)) else (out,)
            if self.launching:
                return
            # (a `to` that changes nothing returns its input: no pass)
            ins = set() if self.name.endswith("_") else {
                a.data_ptr() for a in args if isinstance(a, torch.Tensor)}
            if self.name in passes and any(isinstance(o, torch.Tensor) and o.data_ptr() not in ins
                                           and tuple(o.shape) == (vocab, hidden) for o in outs):
                self.found.append(self.name)

    seen = Passes()
    run = InterpretedFunction.run

    def launch(*args, **kwargs):
        seen.launching = True
        try:
            return run(*args, **kwargs)
        finally:
            seen.launching = False

    monkeypatch.setattr(InterpretedFunction, "run", launch)
    for kwargs, kind in ((dict(chunk_size=16), "fp32-accumulator"),
                         (dict(memory_budget=16 * vocab * 2), "in-place")):
        assert sched.plan_schedule(n, vocab, hidden, BF16, BF16, **kwargs).kind == kind
        wl = w.clone().requires_grad_()
        seen.found = []
        with seen, watch_launches() as launched:
            speedlight.linear_cross_entropy(h, wl, t, **kwargs).backward()
        assert seen.found == [], (kind, seen.found)
        assert launched.count("_matmul_kernel") == (kind == "fp32-accumulator"), launched
        assert launched.count("_lce_scale_kernel") == 1, launched  # d_weight's (no d_hidden)
        ref = wl.detach().clone().requires_grad_()
        F.cross_entropy(F.linear(h, ref).float(), t).backward()
        torch.testing.assert_close(wl.grad.float(), ref.grad.float(), rtol=2e-2, atol=1e-4)


def test_the_scaling_kernel_multiplies_unless_the_gradient_is_one(device):
    x = torch.randn(5000, device=device, dtype=BF16)
    doubled = x.float() * 2.5
    y = x.clone()
    chunks.scale_in_place(y, torch.tensor(1.0, device=device))
    assert torch.equal(y, x)
    chunks.scale_in_place(y, torch.tensor(2.5, device=device))
    torch.testing.assert_close(y, doubled.to(BF16), rtol=0, atol=0)


def test_peak_memory_follows_the_schedule_at_a_cpu_shape(device):
    """The tracked allocations of a bf16 training call at a CPU-sized shape under each
    setting's budget (the headline's schedule scaled down: 4 chunks, or vocabulary
    blocks) stay within the plan's extra bytes beside the returned gradients; the
    low-memory schedule holds less than the default one."""
    n, hidden, vocab = 40, 16, 600
    case = op.SPEC.cases("quick")[1].with_(params=(("tokens", n), ("hidden", hidden),
                                                   ("vocab", vocab)), dtype=BF16)
    peaks = {}
    for name in (None, "low"):
        c = case.with_(flags=(("budget", op.LOW_MB),)) if name else case
        budget = op.case_budget(c)
        plan = sched.plan_schedule(n, vocab, hidden, BF16, BF16, memory_budget=budget)
        h, w, t, _ = inputs(n, hidden, vocab, device, dtype=BF16)
        hl, wl = h.clone().requires_grad_(), w.clone().requires_grad_()
        with LiveBytes() as mem:
            loss = speedlight.linear_cross_entropy(hl, wl, t, memory_budget=budget)
            loss.backward()
            del loss
        gradients = (n * hidden + vocab * hidden) * 2
        slack = 4096 + 12 * n  # the loss rows, the mean's divisor and scale, the statistics
        assert mem.peak <= plan.extra_bytes + gradients + slack, (name, plan, mem.peak)
        peaks[name] = (plan, mem.peak)
    assert peaks["low"][0].kind == "vocab-major" and peaks[None][0].kind == "in-place"
    assert peaks["low"][1] < peaks[None][1]


def test_profile_is_told_the_schedule():
    """case_of, which profile costs a call by, names the schedule and its chunk count."""
    h = torch.empty(N, H, device="meta", dtype=BF16)
    w = torch.empty(V, H, device="meta", dtype=BF16)
    args = {"hidden": h, "weight": w, "bias": None, "needs_grad": [True, True, False]}
    case = op.case_of("linear_cross_entropy_fwd", args)
    assert (case.flag("schedule"), case.flag("chunks")) == ("in-place", 4)
    low = op.case_of("linear_cross_entropy_fwd",
                     dict(args, memory_budget=sched.LOW_MEMORY_BUDGET))
    assert (low.flag("schedule"), low.flag("blocks")) == ("vocab-major", 17)
    assert "schedulevocab-major" in low.id
    # the cost stays the ideal's (three matmuls) whatever the schedule
    assert op.cost(low, "fwd").flops == op.cost(case, "fwd").flops
