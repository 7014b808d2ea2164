"""Our FLOPs equal torch.utils.flop_counter's wherever both count an op."""

from collections import Counter

import pytest
import torch
from torch import nn
from torch.utils import flop_counter

from speedlight.workloads import costs, models
from speedlight.profile.capture import OpRecorder

aten = torch.ops.aten


class Net(nn.Module):
    """Conv, linear with and without bias, bmm and baddbmm, forward and backward."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.lin = nn.Linear(8 * 8 * 8, 32)
        self.proj = nn.Linear(32, 16, bias=False)

    def forward(self, x):
        h = self.conv2(self.conv(x).relu()).flatten(1)
        h = self.lin(h)
        a, b = h.view(-1, 4, 8), h.view(-1, 8, 4)
        s = torch.baddbmm(torch.bmm(a, b), a, b)
        return self.proj(h).sum() + s.sum()


def ours(fn) -> Counter:
    rec = OpRecorder({}, {}, memory=None, timed=False)
    with rec:
        fn()
    found = Counter()
    for r in rec.ops:
        if r.cost is not None and r.cost.flops:
            found[r.name] += r.cost.flops
    return found


def theirs(fn) -> Counter:
    mode = flop_counter.FlopCounterMode(display=False)
    with mode:
        fn()
    return Counter({k.__name__: v for k, v in mode.get_flop_counts()["Global"].items()})


def assert_match(fn, expect: set[str]):
    a, b = ours(fn), theirs(fn)
    assert expect <= set(b), f"flop_counter counted only {sorted(b)}"
    for name, n in b.items():
        assert a[name] == n, f"{name}: ours {a[name]}, flop_counter {n}"


def test_matmuls_and_convolutions_forward_and_backward():
    torch.manual_seed(0)
    net, x = Net(), torch.randn(2, 3, 8, 8)
    assert_match(lambda: net(x).backward(),
                 {"convolution", "convolution_backward", "addmm", "mm", "bmm", "baddbmm"})


def test_default_model_training_step():
    w = models.build(None, batch=1, seq=16, train=True, dtype=torch.float32, device=torch.device("cpu"))
    assert_match(lambda: w.loss_fn(w.call()).backward(), {"mm"})


def test_default_model_under_inference_mode_decomposes_like_flop_counter():
    w = models.build(None, batch=1, seq=16, train=False, dtype=torch.float32, device=torch.device("cpu"))

    def forward():
        with torch.inference_mode():
            w.call()
    assert_match(forward, {"mm"})


@pytest.mark.parametrize("q,kv", [((2, 4, 128, 64), (2, 4, 128, 64)), ((1, 8, 37, 96), (1, 2, 53, 96))],
                         ids=["mha", "gqa-odd"])
def test_attention_formula_matches_flop_counter_and_halves_causal(q, kv):
    Q, K = torch.empty(q, device="meta"), torch.empty(kv, device="meta")
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu.default(Q, K, K, 0.0, False)
    fwd = lambda causal: costs.estimate(aten._scaled_dot_product_flash_attention_for_cpu.default,  # noqa: E731
                                        (Q, K, K, 0.0, causal), {}, (out, lse)).flops
    assert fwd(False) == flop_counter.sdpa_flop_count(q, kv, kv)
    assert fwd(True) == flop_counter.sdpa_flop_count(q, kv, kv) // 2
    grads = aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
        torch.empty(q, device="meta"), Q, K, K, out, lse, 0.0, False)
    bwd = costs.estimate(aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                         (torch.empty(q, device="meta"), Q, K, K, out, lse, 0.0, False), {}, grads)
    assert bwd.flops == flop_counter.sdpa_backward_flop_count(q, q, kv, kv)
