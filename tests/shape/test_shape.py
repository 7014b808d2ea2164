"""speedlight shape on the three worked examples in examples/shape/: its numbers against
hand counts, its advice, and the spec file it writes going through `speedlight verify`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import speedlight.shape
from speedlight import cli, hardware
from speedlight.shape import InputSpec, parse_shapes, traced_cost
from speedlight.shape.trace import load_function

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "shape"
H200 = hardware.DEVICES["h200"]
BW = H200.dram_bandwidth


def _fn(name: str):
    return load_function(f"{EXAMPLES / name}.py:{name}")[0]


def _shape(name, shapes, compile=False, **kw):
    """The floors and advice (torch.compile's kernels are read in a test of their own)."""
    return speedlight.shape(_fn(name), *parse_shapes(shapes), target="h200", compile=compile, **kw)


def test_norm_variant_against_hand_counts():
    doc = _shape("offset_rms_norm", "x=[8,4096,4096]:bf16,w=[4096]:bf16")
    n, rows, h = 8 * 4096 * 4096, 8 * 4096, 4096
    (fwd,) = doc["phases"]
    # fused: read x (bf16) and w once, write y (bf16) once
    assert fwd["fused"]["bytes"] == 2 * n + 2 * h + 2 * n
    # pow, mean, mul (rstd), mul (weight): 1 FLOP/element; +eps and rsqrt per row; 1 + w per weight
    assert fwd["fused"]["flops"] == 4 * n + 2 * rows + h
    assert fwd["fused"]["bound"] == "bandwidth"
    assert fwd["fused"]["floor_s"] == pytest.approx((4 * n + 2 * h) / BW)
    # eager: 3 casts, pow, mean, +eps, rsqrt, *rstd, 1+w, *w: 10 kernels, each tensor through DRAM
    assert fwd["eager"]["launches"] == 10
    assert fwd["eager"]["bytes"] == 40 * n + 24 * rows + 18 * h
    assert fwd["gain"] == pytest.approx((40 * n + 24 * rows + 18 * h) / (4 * n + 2 * h), rel=0.02)
    kinds = {a["kind"] for a in doc["advice"]}
    assert "recompute" in kinds  # the fp32 copy of x is twice the bf16 inputs
    fp8 = next(a for a in doc["advice"] if a["title"] == "store in fp8")
    assert f"{4 * n + 2 * h:,} -> {2 * n + h:,}" in fp8["number"]


def test_gated_activation_forward_and_backward_against_hand_counts():
    doc = _shape("mish_glu", "x=[4096,28672]:bf16", train=True)
    t, i = 4096, 14336
    fwd, bwd = doc["phases"]
    # softplus 6, tanh 1, two muls 1 each, per output element
    assert fwd["fused"]["flops"] == 9 * t * i
    assert fwd["fused"]["bytes"] == 2 * (t * 2 * i) + 2 * (t * i)  # read x, write y
    assert fwd["eager"]["launches"] == 4
    # backward: read x and dy, write dx
    assert bwd["fused"]["bytes"] == 2 * (t * 2 * i) + 2 * (t * i) + 2 * (t * 2 * i)
    assert bwd["fused"]["bound"] == "bandwidth"
    assert bwd["eager"]["launches"] == 8  # 4 muls, tanh', softplus', add, cat
    assert bwd["eager"]["uncounted"] == ["aten.softplus_backward.default"]
    assert [g["name"] for g in doc["grads"]] == ["dx"]


def test_attention_score_variant_against_hand_counts():
    doc = _shape("softcap_attention", "q=[1,16,2000,72]:bf16,k=[1,16,2000,72]:bf16,v=[1,16,2000,72]:bf16")
    b, h, s, d = 1, 16, 2000, 72
    (fwd,) = doc["phases"]
    mm = 2 * b * h * s * s * d  # QK^T and PV each
    pointwise = 4 * b * h * s * s  # *scale, /cap, tanh, *cap
    softmax = 5 * b * h * s * s
    assert fwd["fused"]["flops"] == 2 * mm + pointwise + softmax
    assert fwd["fused"]["bytes"] == 4 * b * h * s * d * 2  # q, k, v read, out written
    assert fwd["fused"]["bound"] == "arithmetic"
    peak = H200.peak_flops
    assert fwd["fused"]["floor_s"] == pytest.approx(2 * mm / peak["bf16"] + (pointwise + softmax) / peak["fp32"])
    assert fwd["eager"]["launches"] == 9
    titles = [a["title"] for a in doc["advice"]]
    assert "an intermediate larger than the inputs" in titles  # the [S, S] scores
    tile = [a for a in doc["advice"] if a["title"] == "matmul sizes off the tensor-core tile multiple"]
    assert tile and "pad K to 80" in tile[0]["number"]


def test_reduction_over_a_non_contiguous_dim_and_misaligned_rows_are_advised():
    def col_softmax(x):
        return torch.softmax(x.transpose(0, 1), dim=-1)

    doc = speedlight.shape(col_softmax, torch.empty(1001, 64, dtype=torch.bfloat16, device="meta"),
                           target="h200", compile=False)
    strided = [a for a in doc["advice"] if a["kind"] == "layout"]
    assert strided and "stride there is 64 elements" in strided[0]["evidence"]
    assert "16x" in strided[0]["number"]  # 32-byte sectors of 2-byte elements
    doc = speedlight.shape(lambda x: x * 2, InputSpec("x", (4, 1001), torch.bfloat16), target="h200",
                           compile=False)
    (align,) = [a for a in doc["advice"] if a["kind"] == "alignment"]
    assert "2002 B" in align["evidence"] and "1008 elements" in align["number"]


def test_traced_cost_is_the_fused_floor():
    fn = _fn("offset_rms_norm")
    shapes = [("x", (3, 5, 5), torch.float32), ("w", (5,), torch.float32)]
    c = traced_cost(fn, shapes, "fwd")
    assert c.bytes == 4 * (75 + 5 + 75)
    assert c.flops == 4 * 75 + 2 * 15 + 5
    with pytest.raises(ValueError, match="mode"):
        traced_cost(fn, shapes, "sideways")
    # backward of the gated activation: read x and dy, write dx
    assert traced_cost(_fn("mish_glu"), [("x", (3, 10), torch.float32)], "bwd").bytes == 4 * (30 + 15 + 30)


@pytest.mark.parametrize("text, match", [
    pytest.param("x=[8,4096", "cannot read", id="unclosed"),
    pytest.param("x=[8,a]:bf16", "not an integer", id="not-int"),
    pytest.param("x=[8]:int8", "unknown dtype", id="dtype"),
    pytest.param("x=[8],x=[8]", "twice", id="twice"),
])
def test_bad_shapes_say_what_was_expected(text, match):
    with pytest.raises(ValueError, match=match):
        parse_shapes(text)


def test_bad_example_inputs_and_failing_functions_are_errors():
    with pytest.raises(TypeError, match="example input 0"):
        speedlight.shape(lambda x: x, 3)
    with pytest.raises(ValueError, match=r"x=\[2, 3\]:fp32, y=\[2, 3\]:fp32\) failed on fake tensors"):
        speedlight.shape(lambda x, y: x @ y, InputSpec("x", (2, 3), torch.float32),
                         InputSpec("y", (2, 3), torch.float32))


def test_cli_writes_json_html_and_a_spec_that_verify_accepts(tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli.main(["shape", f"{EXAMPLES / 'offset_rms_norm.py'}:offset_rms_norm", "--shapes",
                   "x=[8,4096,4096]:bf16,w=[4096]:bf16", "--target", "h200", "--out", str(out),
                   "--no-compile"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "fused (one kernel)" in printed and "bandwidth" in printed
    doc = json.loads((out / "shape.json").read_text())
    assert doc["phases"][0]["fused"]["bytes"] == 4 * 8 * 4096 * 4096 + 2 * 4096
    assert doc["inductor"] == {"status": "skipped", "reason": "not asked (--no-compile)"}
    pytest.importorskip("jinja2", reason="the HTML page needs jinja2")
    assert "fused (one kernel)" in (out / "shape.html").read_text()
    spec = Path(doc["spec_file"])
    rc = cli.main(["verify", "--spec", str(spec), "--only-spec", "--seeds", "1",
                   "--dtypes", "fp32,bf16", "--out", str(tmp_path / "v")])
    assert rc == 0
    rows = [json.loads(line) for line in (tmp_path / "v" / "verify.jsonl").read_text().splitlines()]
    assert rows and all(r["status"] == "pass" for r in rows)
    assert {r["case"]["params"]["b"] for r in rows} == {5, 6}  # the quick suite: small, odd


def test_spec_suites_keep_a_dimension_the_function_needs_even():
    from speedlight.shape import specfile

    inputs = parse_shapes("x=[4096,28672]:bf16")
    values, notes = specfile.suite_values(inputs, _fn("mish_glu"))  # chunk(2) needs an even width
    assert values["model"] == [{"a": 4096, "b": 28672}]
    assert all(c["b"] % 2 == 0 for s in values.values() for c in s)
    assert {c["a"] for c in values["full"]} == {4095, 4096, 4097}  # rows stay odd neighbours
    assert values["quick"][0] == {"a": 3, "b": 10} and notes == []


def test_speedlight_shape_is_the_function_after_import_speedlight():
    import subprocess
    import sys

    code = ("import torch, speedlight\n"
            "d = speedlight.shape(lambda x: x.sum(-1), torch.empty(4, 8, device='meta'), compile=False)\n"
            "print(d['phases'][0]['fused']['bytes'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == str(4 * 8 * 4 + 4 * 4)  # read x, write the row sums


def test_inductor_kernels_read_by_inspect_against_hand_counts():
    """torch.compile's Triton kernels for the norm variant, generated on this CPU, run
    through the interpreter and compiled for sm_90a: what each moves, by hand."""
    rows, h = 64, 256
    doc = _shape("offset_rms_norm", f"x=[{rows},{h}]:bf16,w=[{h}]:bf16", compile=True, train=True)
    ind = doc["inductor"]
    assert ind["status"] == "ran", ind.get("reason")
    fwd = [k for k in ind["kernels"] if k["phase"] == "forward"]
    bwd = [k for k in ind["kernels"] if k["phase"] == "backward"]
    assert len(fwd) == 1 and len(bwd) >= 1  # inductor fuses the whole forward
    (k,) = fwd
    # read x (bf16) and w once; write y (bf16) and the saved rstd (fp32 per row) once
    assert (k["read_bytes"], k["written_bytes"]) == (2 * rows * h + 2 * h, 2 * rows * h + 4 * rows)
    assert ind["phases"]["forward"]["fused_floor_bytes"] == 4 * rows * h + 2 * h
    assert ind["phases"]["forward"]["bytes_over_floor"] == pytest.approx(
        (4 * rows * h + 2 * h + 4 * rows) / (4 * rows * h + 2 * h))
    for kernel in ind["kernels"]:  # every kernel compiled for sm_90a and read
        assert "error" not in kernel, kernel
        assert kernel["registers"] > 0 and kernel["spill_bytes"] == 0
        assert kernel["loaded"] is not None  # small enough to run in full: bytes measured
    x_loads = [a for a in k["accesses"] if a["kind"] == "load" and a["possible_bits"] == 128]
    assert x_loads and all(a["bits"] in (16, 32, 64, 128) for a in x_loads)
    assert ind["where"].endswith("sm_90a") and ind["extern_calls"] == {}


def test_inductor_without_the_interpreter_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    doc = _shape("offset_rms_norm", "x=[4,8]:fp32,w=[8]:fp32", compile=True)
    assert doc["inductor"]["status"] == "skipped"
    assert "TRITON_INTERPRET=1" in doc["inductor"]["reason"]
