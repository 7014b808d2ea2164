"""The sweep on a CPU: matmul's configurations pruned by what inspect reads from the
kernels compiled for sm_90a, each rejection with its reason; the CLI lists them and writes
the rows. Compiles are what cost here (1-3 s each): every test caps them at two or three."""

import math

import pytest
import torch

from speedlight import cli, registry, results, target
from speedlight.ops._gemm import CONFIG_SPACE
from speedlight.tune import sweep

# 64 x 256 tiles, k-steps of 128, 5 stages: 5 * (64 * 128 + 128 * 256) * 2 bytes of operand
# buffers, far over the 227 KB one block may have on an H100
TOO_BIG = {"BLOCK_M": (64,), "BLOCK_N": (256,), "BLOCK_K": (128,), "GROUP_M": (8,),
           "num_warps": (4,), "num_stages": (5,)}


def _task(**kw):
    spec = registry.builtin_spec("matmul")
    case = next(c for c in spec.cases("quick") if c.label == "m64-n64-k64-linear")
    tgt = target.resolve("h100-sxm", None, "cpu")
    return sweep.tasks(spec, [case.with_(dtype=torch.bfloat16)], tgt, **kw)[0]


def test_pruning_gives_each_rejection_its_reason(device):
    task = _task(max_compiles=2)
    task = sweep.Task(**{**task.__dict__, "space": tuple(TOO_BIG.items())})
    rows = sweep.run_task(task, device)
    rule, big = rows
    assert rule["rule"] and rule["status"] == "survivor" and rule["bucket"] == "m64-n64-k64-bf16"
    assert rule["timing"].startswith("skipped: ") and rule["spill_bytes"] == 0
    # ranked by its predicted time on the H100 before any GPU time (the only survivor: first)
    assert rule["predicted_us"] > 0 and rule["predicted_rank"] == 1 and rule["predicted_bound"]
    assert set(rule["config"]) == set(CONFIG_SPACE)
    assert big["status"] == "pruned" and big["smem"] > big["smem_limit"]
    assert [r["kind"] for r in big["reasons"]] == ["smem-limit"]
    assert "shared memory" in big["reasons"][0]["message"]


def test_the_cap_bounds_the_compiles(device):
    # one compile (the rule): everything past it is left over the cap and counted
    rows = sweep.run_task(_task(max_compiles=1), device)
    assert [r["status"] for r in rows] == ["survivor", "not-compiled"]
    assert rows[1]["count"] == len(sweep.ordered(CONFIG_SPACE, rows[0]["config"])) - 1


def test_a_shape_without_a_launch_is_skipped_with_the_reason(device):
    spec = registry.builtin_spec("matmul")
    case = next(c for c in spec.cases("quick") if c.label.startswith("m0-"))
    tgt = target.resolve("h100-sxm", None, torch.device("cpu"))
    rows = sweep.run_task(sweep.tasks(spec, [case], tgt)[0], device)
    assert [r["status"] for r in rows] == ["skip"] and "no launch" in rows[0]["reason"]


def test_an_op_without_a_space_is_refused():
    spec = registry.builtin_spec("layer_norm")
    tgt = target.resolve("h100-sxm", None, torch.device("cpu"))
    with pytest.raises(ValueError, match="declares no configuration space"):
        sweep.tasks(spec, spec.cases("quick")[:1], tgt)


def test_cli_prunes_lists_and_writes_rows(tmp_path, capsys, device, monkeypatch):
    # an H100 PCIe: not the GPU in use on any machine this runs on, so nothing is timed
    monkeypatch.setenv("SPEEDLIGHT_CACHE", str(tmp_path / "cache"))
    code = cli.main(["tune", "matmul", "--device", device.type, "--cases", "m64-n64-k64",
                     "--max-compiles", "2", "--target", "h100-pcie", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "timing is skipped" in out and "survivor (rule)" in out
    rows = results.read_jsonl(tmp_path / "tune.jsonl")
    assert {r["status"] for r in rows} >= {"survivor", "not-compiled"}
    assert all(r["sku"] == "h100-pcie" and r["tool"] == "tune" for r in rows)
    assert not (tmp_path / "tuned").exists()  # nothing timed: no table


def test_cli_refuses_an_op_without_a_space(tmp_path, device):
    with pytest.raises(SystemExit, match="declares no configuration space"):
        cli.main(["tune", "layer_norm", "--device", device.type, "--out", str(tmp_path)])


def test_timing_then_verification_picks_a_verified_best(device):
    # timed under the interpreter here (the CLI times only on the target GPU): the path a
    # GPU run takes, survivors timed, the fastest verified, its entry ready for the table
    task = _task(max_compiles=2, time=True)
    space = dict(TOO_BIG, BLOCK_N=(64,), BLOCK_K=(64,), num_stages=(3,))
    rows = sweep.run_task(sweep.Task(**{**task.__dict__, "space": tuple(space.items())}), device)
    assert len(rows) == 2 and all("median_us" in r for r in rows)
    best = [r for r in rows if r["status"] == "best"]
    assert len(best) == 1 and best[0]["verified"] == "pass"
    assert best[0]["rule_us"] == next(r["median_us"] for r in rows if r["rule"])
    entry = sweep.winners(rows)["h100-sxm"]["matmul"]["m64-n64-k64-bf16"]
    assert entry["config"] == best[0]["config"] and entry["verified"]


def test_an_amd_target_sweeps_its_knobs_too(device):
    # captured only (nothing compiled): the rule's point and the space counted past the cap
    spec = registry.builtin_spec("matmul")
    case = next(c for c in spec.cases("quick") if c.label == "m64-n64-k64-linear")
    tgt = target.resolve("mi300x", None, "cpu")
    (task,) = sweep.tasks(spec, [case.with_(dtype=torch.bfloat16)], tgt, max_compiles=1)
    st = sweep._prepare(task, torch.device(device))
    space = spec.configs.space_for("gfx942")
    assert set(space) == set(CONFIG_SPACE) | {"waves_per_eu", "matrix_instr_nonkdim", "kpack"}
    ((rule, row),) = st.staged
    assert row["rule"] and row["config"] == rule.config and set(rule.config) == set(space)
    assert {l.options.get("waves_per_eu") for l in rule.launches} == {rule.config["waves_per_eu"]}
    assert st.over == math.prod(len(v) for v in space.values()) - 1


def test_attention_has_a_space_on_amd_targets_only(device):
    # the forward's HIP knobs: nothing to tune on an NVIDIA target, the knobs on an AMD one
    spec = registry.builtin_spec("attention")
    with pytest.raises(ValueError, match="no configuration space to tune on sm_90a"):
        sweep.tasks(spec, spec.cases("quick")[:1], target.resolve("h100-sxm", None, "cpu"))
    tgt = target.resolve("mi300x", None, "cpu")
    (task,) = sweep.tasks(spec, spec.cases("quick")[:1], tgt, max_compiles=1)
    st = sweep._prepare(task, torch.device(device))
    ((rule, row),) = st.staged
    assert row["rule"] and rule.config == {"waves_per_eu": 0, "matrix_instr_nonkdim": 0, "kpack": 1}
    (fwd,) = [l for l in rule.launches if l.kernel == "_attention_fwd_kernel"]
    assert {k: fwd.options[k] for k in rule.config} == rule.config
    assert st.over == 4 * 3 * 2 - 1 and row["bucket"].startswith("d")
