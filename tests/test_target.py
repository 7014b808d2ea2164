"""speedlight.target: one resolution of "which GPU" for every tool, one peak rule, one
error for an unknown GPU."""

from types import SimpleNamespace

import pytest
import torch

from speedlight import cli, hardware, target
from speedlight.bench import metrics
from speedlight.target import TargetError, peak_key, resolve

TOOLS = {  # the cheapest command line of each tool; each resolves its target before work
    "verify": ["verify", "--ops", "softmax"],
    "bench": ["bench", "--ops", "softmax"],
    "inspect": ["inspect", "softmax"],
    "profile": ["profile"],
    "report": ["report"],
}


def test_without_flags_the_default_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("SPEEDLIGHT_CACHE", str(tmp_path))
    t = resolve(None, None, "cpu")
    assert t.sku.key == target.DEFAULT_SKU and t.is_default and not t.in_use
    assert t.arch_name == "sm_90a" and t.sm_count == 132 and t.roof.source == "datasheet"
    assert "the default" in t.describe() and "--target picks another" in t.describe()


@pytest.mark.parametrize("flags,key,arch", [
    (("h200", None), "h200", "sm_90a"),
    (("h100", None), "h100-sxm", "sm_90a"),
    (("H100-PCIe", None), "h100-pcie", "sm_90a"),
    (("sm_90a", None), "h200", "sm_90a"),  # an arch names its flagship
    (("sm_90a", "h100-sxm"), "h100-sxm", "sm_90a"),  # unless --sku says otherwise
    (("sm_80", None), "a100-sxm", "sm_80"),
    (("sm_100a", None), "b200", "sm_100a"),
    ((None, "l4"), "l4", "sm_89"),
], ids=["sku", "alias", "torch-name", "arch", "arch-sku", "sm80", "sm100", "sku-alone"])
def test_a_sku_or_an_arch(flags, key, arch):
    t = resolve(*flags, device="cpu")
    assert (t.sku.key, t.arch_name) == (key, arch)
    assert t.limits.compute_capability == t.compute_capability and not t.native


@pytest.mark.parametrize("flags,message", [
    (("tpu-v5", None), "'tpu-v5' is not a known GPU; --target takes SKUs: a100-sxm"),
    (("sm_75", None), "archs: sm_80"),
    (("sm_86", None), "no SKU of sm_86"),
    (("h100", "h200"), "names a SKU already"),
    (("sm_90a", "voodoo"), "--sku 'voodoo' is not a known GPU"),
    (("native", None), "--target native means the GPU in use"),
], ids=["unknown", "unknown-arch", "arch-without-sku", "two-skus", "bad-sku", "native-on-cpu"])
def test_bad_targets_are_one_clear_error(flags, message):
    if flags[0] == "native" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU: native is valid here")
    with pytest.raises(TargetError, match=message):
        resolve(*flags, device="cpu")


def test_cached_probe_ceilings_are_preferred(monkeypatch, tmp_path):
    monkeypatch.setenv("SPEEDLIGHT_CACHE", str(tmp_path))
    hardware.save_ceilings(hardware.Ceilings("NVIDIA H200", "580.1", 4.3e12, {"bf16": 7.9e14},
                                             measured_at="2026-11-01T00:00:00"))
    t = resolve("h200")
    assert t.roof.source == "measured" and t.roof.bandwidth == 4.3e12
    assert t.roof.flops["bf16"] == 7.9e14 and t.roof.flops["fp32"] == 67e12  # the rest: datasheet
    assert "measured by speedlight probe" in t.roof_note
    assert resolve("a100").roof.source == "datasheet"


def test_one_peak_rule():
    assert peak_key(torch.bfloat16, tensor_core=False) == "fp32"  # norms: CUDA cores
    assert peak_key("bf16", tensor_core=True) == "bf16"
    assert peak_key(torch.float16, tensor_core=True) == "fp16"
    assert peak_key("float8_e4m3fn", tensor_core=True) == "fp8"
    assert peak_key(torch.float32, tensor_core=True, tf32=True) == "tf32"
    assert peak_key(torch.float32, tensor_core=True, tf32=False) == "fp32"
    was = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert peak_key("fp32", tensor_core=True) == "tf32"
        torch.set_float32_matmul_precision("highest")
        assert peak_key("fp32", tensor_core=True) == "fp32"
    finally:
        torch.set_float32_matmul_precision(was)


class _Resolved(Exception):
    """Stops a command right after it resolved its target."""


def _resolved_by(tool: str, flags: list[str], monkeypatch, tmp_path) -> target.Target:
    seen = []

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        raise _Resolved

    real = target.resolve
    monkeypatch.setattr(target, "resolve", spy)
    with pytest.raises(_Resolved):
        cli.main(TOOLS[tool] + flags + ["--out", str(tmp_path / tool)])
    monkeypatch.setattr(target, "resolve", real)
    return seen[0]


@pytest.mark.parametrize("flags", [[], ["--target", "sm_90a", "--sku", "h100-sxm"],
                                   ["--target", "b200"]], ids=["default", "arch-sku", "sku"])
def test_every_tool_resolves_the_same_target_from_the_same_flags(flags, monkeypatch, tmp_path):
    got = {tool: _resolved_by(tool, flags, monkeypatch, tmp_path) for tool in TOOLS}
    want = resolve(*(flags[1::2] + [None, None])[:2], device="cpu")
    for tool, t in got.items():
        assert t == want, tool


def test_every_tool_gives_the_same_error_for_an_unknown_target(tmp_path):
    messages = {}
    for tool, argv in TOOLS.items():
        with pytest.raises(SystemExit) as e:
            cli.main(argv + ["--target", "h999", "--out", str(tmp_path / tool)])
        messages[tool] = str(e.value).removeprefix(f"speedlight {tool}: ")
    assert len(set(messages.values())) == 1, messages
    assert "'h999' is not a known GPU" in messages["report"] and "sm_90a" in messages["report"]


def _pretend_gpu(monkeypatch, name, cc, sms):
    props = SimpleNamespace(name=name, major=cc[0], minor=cc[1], multi_processor_count=sms,
                            total_memory=24 * 10**9, L2_cache_size=72 * 2**20)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)


def test_the_gpu_in_use_is_the_target_unless_flags_say_otherwise(monkeypatch, tmp_path):
    monkeypatch.setenv("SPEEDLIGHT_CACHE", str(tmp_path))
    _pretend_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", (9, 0), 132)
    here = resolve(None, None, "cuda")
    assert here.sku.key == "h100-sxm" and here.in_use and here.native
    assert here.origin == "the GPU in use" and metrics.device_roof(here)[0] is here.roof
    other = resolve("b200", None, "cuda")
    assert not other.in_use and not other.native
    assert "not the device the times are measured on" in metrics.device_roof(other)[1]


def test_a_gpu_without_a_datasheet_still_resolves(monkeypatch, tmp_path):
    monkeypatch.setenv("SPEEDLIGHT_CACHE", str(tmp_path))
    _pretend_gpu(monkeypatch, "NVIDIA GeForce RTX 4090", (8, 9), 128)
    t = resolve(None, None, "cuda")
    assert (t.sku.name, t.sm_count, t.arch_name) == ("NVIDIA GeForce RTX 4090", 128, "sm_89")
    assert t.roof is None and "no datasheet" in t.roof_note and t.in_use
    roof, note = metrics.device_roof(t)
    assert roof is None and "speedlight probe" in note
    hardware.save_ceilings(hardware.Ceilings("NVIDIA GeForce RTX 4090", "580.1", 0.9e12,
                                             {"bf16": 1.5e14}, measured_at="2026-11-01"))
    t = resolve(None, None, "cuda")
    assert t.roof.source == "measured" and t.roof.bandwidth == 0.9e12
