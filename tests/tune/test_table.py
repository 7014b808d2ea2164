"""Tuned tables at launch: an entry for the shape's bucket is used, a shape without one
falls back to the launch rule, a user's entry wins over the shipped one, and a table that
cannot be used warns and falls back. Launches are captured dry (inspect's recorder, sized
for an H100) so the configuration each one was given is read without running it."""

import json

import pytest
import torch

from speedlight import tuning
from speedlight.inspect.launches import Recorder, intercept
from speedlight.launch import for_target, launch_sku
from speedlight.ops._gemm import launch_config
from speedlight.ops.matmul import matmul
from speedlight.ops.rms_norm import FWD_TILE, rms_norm
from speedlight.tune import sweep
from tests.conftest import gpu_target

SKU = "h100-sxm"
TUNED = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 8,
         "num_stages": 5}
USER = dict(TUNED, BLOCK_N=128, num_stages=3)


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """Empty shipped and user table folders; returns a writer of either."""
    shipped = tmp_path / "shipped"
    monkeypatch.setattr(tuning, "SHIPPED_DIR", shipped)
    monkeypatch.setenv("SPEEDLIGHT_CACHE", str(tmp_path / "cache"))
    tuning.reload()

    def write(where: str, entries: dict | str):
        path = tuning.shipped_path(SKU) if where == "shipped" else tuning.user_path(SKU)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = entries if isinstance(entries, str) else json.dumps(
            {"format": 1, "sku": SKU, "entries": entries})
        path.write_text(text)
        tuning.reload()
    yield write
    tuning.reload()


def launched(fn, *args):
    """The configuration of each launch `fn(*args)` makes on an H100 (dry: nothing runs)."""
    rec = Recorder(90, "dry")
    with for_target(gpu_target(132)), intercept(rec), torch.no_grad():
        fn(*args)
    out = []
    for launch in rec.launches:
        cfg = {a.name: a.value for a in launch.args if a.name in launch.declared
               and a.name.startswith(("BLOCK_", "GROUP_"))}
        out.append(dict(cfg, num_warps=launch.num_warps, num_stages=launch.num_stages))
    return out


def rule(m, n, k):
    with for_target(gpu_target(132)):
        return launch_config(m, n, k, torch.bfloat16, torch.device("cpu")).as_config()


def gemm(m, n, k, device):
    a = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    b = torch.randn(k, n, dtype=torch.bfloat16, device=device)
    return matmul, a, b


def test_an_entry_is_used_at_launch_and_a_shape_without_one_takes_the_rule(tables, device):
    # M 50 falls in the M 64 bucket; K 128 has no entry
    tables("shipped", {"matmul": {"m64-n64-k64-bf16": {"config": TUNED, "impl": None}}})
    assert launched(*gemm(50, 64, 64, device)) == [TUNED]
    assert launched(*gemm(64, 64, 128, device)) == [rule(64, 64, 128)]
    assert rule(64, 64, 128) != TUNED


def test_the_users_entry_wins_over_the_shipped_one(tables, device):
    tables("shipped", {"matmul": {"m64-n64-k64-bf16": {"config": TUNED},
                                  "m64-n64-k128-bf16": {"config": TUNED}}})
    tables("user", {"matmul": {"m64-n64-k64-bf16": {"config": USER}}})
    assert launched(*gemm(64, 64, 64, device)) == [USER]
    assert launched(*gemm(64, 64, 128, device)) == [TUNED]  # the shipped entry the user's lacks


def test_no_table_is_read_under_the_interpreter_or_without_a_gpu(tables):
    tables("shipped", {"matmul": {"m64-n64-k64-bf16": {"config": TUNED}}})
    assert launch_sku("cpu") is None
    assert tuning.lookup("matmul", "m64-n64-k64-bf16", launch_sku("cpu")) is None
    with for_target(gpu_target(132)):
        assert tuning.lookup("matmul", "m64-n64-k64-bf16", launch_sku("cpu")) == TUNED


@pytest.mark.parametrize("text, says", [
    pytest.param("{not json", "Expecting property name", id="not-json"),
    pytest.param(json.dumps({"format": 99, "entries": {}}), "format 99", id="format"),
    pytest.param(json.dumps({"format": 1, "entries": {"matmul": {"m64-n64-k64-bf16": {}}}}),
                 "has no 'config'", id="no-config"),
])
def test_a_corrupt_table_warns_naming_the_file_and_the_rule_applies(tables, device, text, says):
    tables("shipped", {"matmul": {"m64-n64-k64-bf16": {"config": TUNED}}})
    tables("user", text)
    with pytest.warns(tuning.TunedTableWarning, match=says) as caught:
        got = launched(*gemm(64, 64, 64, device))
    assert str(tuning.user_path(SKU)) in str(caught[0].message)
    assert got == [TUNED]  # the user's file is ignored; the shipped one still applies


def test_an_entry_outside_the_space_warns_naming_the_file_and_the_rule_applies(tables, device):
    tables("shipped", {"matmul": {"m64-n64-k64-bf16": {"config": TUNED}}})
    tables("user", {"matmul": {"m64-n64-k64-bf16": {"config": dict(TUNED, BLOCK_M=96)}}})
    with pytest.warns(tuning.TunedTableWarning,
                      match="not a point of its configuration space") as caught:
        assert launched(*gemm(64, 64, 64, device)) == [rule(64, 64, 64)]
    assert str(tuning.user_path(SKU)) in str(caught[0].message)


def test_rms_norm_reads_its_entry_per_hidden_size(tables, device):
    tables("shipped", {"rms_norm": {"hidden512-bf16": {
        "config": {"tile": 2048, "warps_per_sm": 16}}}})
    x = torch.randn(64, 512, dtype=torch.bfloat16, device=device)
    tuned = launched(rms_norm, x)[0]
    assert tuned["BLOCK_M"] == 2048 // 512  # the rule's tile (FWD_TILE) holds 8 rows
    x = torch.randn(64, 256, dtype=torch.bfloat16, device=device)
    assert launched(rms_norm, x)[0]["BLOCK_M"] == FWD_TILE // 256


def test_softmax_reads_its_entry_per_row_length(tables, device):
    from speedlight.ops.softmax import softmax

    tables("shipped", {"softmax": {"cols512-bf16": {"config": {"tile": 1024}}}})
    x = torch.randn(64, 512, dtype=torch.bfloat16, device=device)
    assert launched(softmax, x)[0]["BLOCK_M"] == 1024 // 512  # the rule's 4096: 8 rows
    x = torch.randn(64, 256, dtype=torch.bfloat16, device=device)
    assert launched(softmax, x)[0]["BLOCK_M"] == 4096 // 256


def test_winners_written_by_tune_are_read_back(tables, device, tmp_path):
    rows = [{"status": "best", "bucket": "m64-n64-k64-bf16", "sku": SKU, "op": "matmul",
             "config": TUNED, "median_us": 10.0, "rule_us": 12.0, "speedup": 1.2,
             "verified": "pass", "case_id": "matmul-m64-n64-k64-bf16"},
            {"status": "survivor", "bucket": "m64-n64-k64-bf16", "sku": SKU, "op": "matmul",
             "config": USER}]
    entries = sweep.winners(rows)[SKU]
    assert entries["matmul"]["m64-n64-k64-bf16"]["config"] == TUNED
    assert entries["matmul"]["m64-n64-k64-bf16"]["impl"] is None  # reserved key
    tuning.write(tuning.user_path(SKU), SKU, entries)
    tuning.reload()
    assert launched(*gemm(64, 64, 64, device)) == [TUNED]

