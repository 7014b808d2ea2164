"""Every op lands on its module (backward ops too), gets its time, and an op without a
formula is listed with the share of time it takes."""

import time

import torch
from torch import nn

from speedlight.profile import display
from tests.profile.util import profile_model

LIB = torch.library.Library("sltest", "DEF")  # noqa: TOR901 - a test-only op namespace
LIB.define("mystery(Tensor x) -> Tensor")
MYSTERY_S = 0.02


def _mystery_cpu(x):
    time.sleep(MYSTERY_S)  # stands for a costly op speedlight has no formula for
    return x * 2


LIB.impl("mystery", _mystery_cpu, "CPU")
LIB.impl("mystery", lambda x: torch.empty_like(x), "Meta")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 32)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.proj(x))


class Net(nn.Module):
    def __init__(self, mystery=False):
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(32, 4, bias=False)
        self.mystery = mystery

    def forward(self, x):
        h = self.block(x)
        if self.mystery:
            h = torch.ops.sltest.mystery(h)
        return self.head(h)


def test_forward_backward_and_optimizer_ops_land_where_they_ran():
    torch.manual_seed(0)
    cap, res, _ = profile_model(Net(), torch.randn(8, 16))
    rows = res["rows"]
    fwd = [r for r in rows if r["phase"] == "forward" and r["name"] in ("addmm", "mm", "relu")]
    assert [(r["name"], r["module"], r["module_class"]) for r in fwd] == [
        ("addmm", "block.proj", "Linear"), ("relu", "block.act", "ReLU"), ("mm", "head", "Linear")]
    addmm = fwd[0]
    bwd = [r for r in rows if r["phase"] == "backward" and r["fwd_index"] == addmm["index"]]
    assert bwd and all(r["module"] == "block.proj" and r["grad_fn"] == "AddmmBackward0" for r in bwd)
    assert any(r["name"] == "mm" for r in bwd), "the weight gradient matmul is block.proj's"
    relu_bwd = [r for r in rows if r["name"] == "threshold_backward"]
    assert [r["module"] for r in relu_bwd] == ["block.act"]
    acc = [r for r in rows if r["grad_fn"] == "AccumulateGrad"]
    assert {r["module"] for r in acc} == {"block.proj", "head"}
    opt = [r for r in rows if r["phase"] == "optimizer"]
    assert opt and all(r["module"] is None and r["place"] == "(optimizer)" for r in opt)


def test_default_model_ops_land_on_their_layer():
    from speedlight.workloads import models
    w = models.build(None, batch=1, seq=16, train=True, dtype=torch.float32, device=torch.device("cpu"))
    cap, res, _ = profile_model(w.model, w.inputs, loss_fn=lambda out: out.loss)
    rows = res["rows"]
    hidden, inter = w.config["hidden_size"], w.config["intermediate_size"]
    down = [r for r in rows if r["name"] == "mm" and r["phase"] == "forward" and r["inputs"][0]["shape"][-1] == inter]
    assert [r["module"] for r in down] == [f"model.layers.{i}.mlp.down_proj" for i in range(2)]
    assert all(r["inputs"][1]["shape"] == [inter, hidden] for r in down)
    attn = [r for r in rows if "attention" in r["name"]]
    assert {r["module"] for r in attn} == {f"model.layers.{i}.self_attn" for i in range(2)}
    assert {r["phase"] for r in attn} == {"forward", "backward"}
    # the loss is computed in the root module's forward; its backward goes back there too
    nll = [r for r in rows if r["name"].startswith("nll_loss")]
    assert [(r["phase"], r["module"]) for r in nll] == [("forward", ""), ("backward", "")]


def test_every_op_gets_a_measured_time():
    torch.manual_seed(0)
    cap, res, _ = profile_model(Net(), torch.randn(8, 16), steps=2)
    kernels = [r for r in res["rows"] if r["launches_kernel"]]
    assert all(len(r["time_samples_s"]) == 2 for r in res["rows"])
    assert all(r["time_s"] > 0 for r in kernels)
    assert res["summary"]["op_time_s"] == sum(r["time_s"] for r in res["rows"])
    assert len(cap.step_times) == 2 and all(t > 0 for t in cap.step_times)


def test_an_op_without_a_formula_is_listed_with_its_time_share(capsys):
    torch.manual_seed(0)
    cap, res, _ = profile_model(Net(mystery=True), torch.randn(8, 16), train=False)
    unknown = [r for r in res["rows"] if r["formula"] is None]
    assert [r["op"] for r in unknown] == ["sltest.mystery.default"]
    assert unknown[0]["flops"] is None and unknown[0]["bound"] == "unknown"
    assert unknown[0]["time_s"] >= MYSTERY_S * 0.9
    u = res["summary"]["uncounted"]
    assert u["ops"] == 1 and u["names"] == ["sltest.mystery.default"]
    assert u["time_share"] == unknown[0]["time_s"] / res["summary"]["op_time_s"]
    assert u["time_share"] > 0.5  # the sleep dominates this tiny model
    # the terminal lists it with that share
    doc = {"rows": res["rows"], "summary": res["summary"]}
    display.uncounted(doc, display.Console(width=200))
    out = capsys.readouterr().out
    assert "sltest.mystery.default" in out and f"{100 * u['time_share']:.1f}%" in out
