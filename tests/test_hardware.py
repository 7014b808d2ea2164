import pytest

from speedlight import hardware

SKUS = ["a100-sxm", "h100-sxm", "h100-pcie", "h200", "b200", "l4"]


@pytest.mark.parametrize("key", SKUS)
def test_every_sku_has_cited_dense_numbers(key):
    d = hardware.DEVICES[key]
    for field in ("peak_flops", "dram_bandwidth", "sm_count", "l2_bytes"):
        assert d.sources.get(field), f"{key}: no source for {field}"
    assert d.peak("bf16") > d.peak("tf32") > d.peak("fp32")
    assert d.dram_bandwidth > 1e11 and d.memory_bytes >= 24e9


def test_h200_is_an_h100_with_more_memory():
    h100, h200 = hardware.DEVICES["h100-sxm"], hardware.DEVICES["h200"]
    assert h200.peak_flops == h100.peak_flops
    assert h200.dram_bandwidth > h100.dram_bandwidth and h200.memory_bytes > h100.memory_bytes


def test_dense_not_sparse():
    # H100 SXM's datasheet gives 1979 TFLOP/s bf16 with sparsity; dense is half.
    assert hardware.DEVICES["h100-sxm"].peak("bf16") == pytest.approx(989.4e12)


@pytest.mark.parametrize("name,key", [("NVIDIA H100 80GB HBM3", "h100-sxm"),
                                      ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H200", "h200"),
                                      ("NVIDIA A100-SXM4-80GB", "a100-sxm"), ("NVIDIA L4", "l4"),
                                      ("h100", "h100-sxm"), ("B200", "b200")])
def test_lookup_by_torch_name_or_alias(name, key):
    assert hardware.get_device_spec(name).key == key


def test_unknown_device():
    with pytest.raises(KeyError, match="no DeviceSpec"):
        hardware.get_device_spec("Voodoo 3")


def test_ceilings_cache_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEEDLIGHT_CACHE", str(tmp_path))
    c = hardware.Ceilings("NVIDIA H200", "580.1", 4.3e12, {"bf16": 7.9e14})
    hardware.save_ceilings(c)
    back = hardware.load_ceilings("NVIDIA H200", "580.1")
    assert back == c
    assert hardware.load_ceilings("NVIDIA H200", "999") is None
    roof = hardware.roof_for(hardware.DEVICES["h200"], back)
    assert roof.source == "measured" and roof.bandwidth == 4.3e12
    assert roof.flops["bf16"] == 7.9e14 and roof.flops["fp32"] == 67e12


def test_roof_floor_takes_the_larger_term():
    roof = hardware.roof_for(hardware.DEVICES["h200"])
    assert roof.source == "datasheet"
    assert roof.floor_seconds(0, 4.8e12, "bf16") == pytest.approx(1.0)
    assert roof.bound(10**15, 1, "bf16") == "compute"
    assert roof.bound(1, 10**12, "bf16") == "memory"
