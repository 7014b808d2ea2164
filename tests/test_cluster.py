"""`--ray`: verify, bench and tune sweeps over a local Ray cluster of CPU workers running the
Triton interpreter write the rows a local run writes; a worker that dies loses nothing.

One Ray instance for the module (a few seconds to start), on one xdist worker."""

import ipaddress
import json
import os
import sys
from pathlib import Path

import pytest

from speedlight import cli, cluster, registry
from speedlight.verify import on_cluster as verify_on_cluster

pytestmark = pytest.mark.xdist_group("ray-cluster")

# what a local row and a --ray row must agree on (timings, run id, time and host aside)
SAME = ("tool", "op", "implementation", "case_id", "case", "status", "reason", "launches",
        "checks", "suite", "device", "runtime", "target", "torch", "triton")
MODEL = "TESTGPU"  # a GPU model (Ray accelerator type) the test cluster says it has


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="the ray extra is not installed "
                                            "(pip install -e '.[ray]')")
    # started as `--ray auto` starts one: a new instance (even where a `ray start` cluster
    # runs here), on the loopback only; it says it has a GPU model (a Ray accelerator type)
    cluster.start_local(120, cpus=2, resources={f"accelerator_type:{MODEL}": 1})
    yield ray
    ray.shutdown()


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def _listening(pids: set[int]) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the processes listen on, from /proc."""
    inodes = set()
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        inodes |= {link[8:-1] for link in links if link.startswith("socket:[")}
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            host, port = fields[1].split(":")
            raw = bytes.fromhex(host)  # each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            out.append((str(ipaddress.ip_address(raw)), int(port, 16)))
    return out


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc")
def test_the_local_cluster_listens_on_the_loopback_only(ray_cluster):
    """Every port of the cluster started here (GCS, raylet and its object manager, the
    workers) is on the loopback address, and the node says it is there."""
    def loopback(address):
        ip = ipaddress.ip_address(address)
        return ip.is_loopback or bool(getattr(ip, "ipv4_mapped", None)
                                      and ip.ipv4_mapped.is_loopback)

    ray = ray_cluster
    assert ray.get(ray.remote(lambda: 1).remote()) == 1  # a worker up and answering
    nodes = [n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]]
    assert nodes and all(loopback(a) for a in nodes), nodes
    ports = _listening(_descendants(os.getpid()) | {os.getpid()})
    assert len(ports) >= 3, ports  # the GCS, the raylet's two, a worker's
    assert all(loopback(a) for a, _ in ports), ports


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _by_case(rows):
    return {(r["case_id"], r["case"]["seed"], r["implementation"], r.get("mode")): r
            for r in rows}


def _verify(out, *extra):
    return cli.main(["verify", "--ops", "softmax", "--dtypes", "fp32", "--seeds", "1",
                     "--device", "cpu", "--out", str(out), *extra])


def test_a_ray_verify_sweep_writes_the_rows_of_a_local_run_though_a_worker_died(
        ray_cluster, tmp_path, monkeypatch):
    marker = tmp_path / "died-once"
    victim = "softmax-rows2-cols4096-fp32"
    monkeypatch.setenv(cluster.FAULT_ENV, f"{victim}@{marker}")
    assert _verify(tmp_path / "ray", "--ray") == 0
    assert marker.exists(), "the fault hook never fired: the retry was not exercised"
    monkeypatch.delenv(cluster.FAULT_ENV)
    assert _verify(tmp_path / "local") == 0

    local = _rows(tmp_path / "local" / "verify.jsonl")
    on_ray = _rows(tmp_path / "ray" / "verify.jsonl")
    assert len(on_ray) == len(local) == len(registry.builtin_spec("softmax").cases("quick"))
    local, on_ray = _by_case(local), _by_case(on_ray)
    assert local.keys() == on_ray.keys()
    for key, row in local.items():
        assert {f: on_ray[key].get(f) for f in SAME} == {f: row.get(f) for f in SAME}, key
        assert on_ray[key]["host"], "a --ray row names the host that ran it"
    assert on_ray[(victim, 0, "speedlight", None)]["status"] == "pass"
    assert len({r["run"] for r in on_ray.values()}) == 1


def _lost_sweep(tmp_path, cases, monkeypatch, fault):
    monkeypatch.setenv(cluster.FAULT_ENV, fault)
    spec = registry.builtin_spec("softmax")
    out = tmp_path / "verify.jsonl"
    done = verify_on_cluster.verify_on_ray([spec], lambda s: cases, out,
                                           cluster.RaySweep(device="cpu"), suite="quick",
                                           say=lambda line: None)
    return done, _rows(out)


def test_a_case_that_kills_its_worker_twice_is_an_error_row_and_the_rest_still_run(
        ray_cluster, tmp_path, monkeypatch):
    import torch

    spec = registry.builtin_spec("softmax")
    base = {c.id: c for c in spec.cases("quick")}
    killer = base["softmax-rows1-cols1-fp32"].with_(dtype=torch.float32)
    other = base["softmax-rows3-cols7-fp32"].with_(dtype=torch.float32)
    cases = [killer, killer.with_(seed=1), other]
    done, rows = _lost_sweep(tmp_path, cases, monkeypatch, fault="rows1-cols1")
    assert len(done) == len(rows) == 3
    by_seed = {(r["case_id"], r["case"]["seed"]): r for r in rows}
    for seed in (0, 1):
        lost = by_seed[(killer.id, seed)]
        assert lost["status"] == "error"
        assert "failed on both tries" in lost["reason"] and "WorkerCrashedError" in lost["reason"]
    assert by_seed[(other.id, 0)]["status"] == "pass"


def test_a_ray_bench_sweep_times_every_case_with_the_rows_of_a_local_run(
        ray_cluster, tmp_path):
    common = ["bench", "--ops", "softmax", "--suite", "quick", "--limit", "2", "--dtypes",
              "fp32", "--modes", "fwd", "--baselines", "torch-eager", "--device", "cpu",
              "--time-cap", "0.02", "--max-samples", "3"]
    assert cli.main(common + ["--out", str(tmp_path / "local")]) == 0
    assert cli.main(common + ["--out", str(tmp_path / "ray"), "--ray", "--ray-cpus", "1"]) == 0
    local = _by_case(_rows(tmp_path / "local" / "bench.jsonl"))
    on_ray = _by_case(_rows(tmp_path / "ray" / "bench.jsonl"))
    assert local.keys() == on_ray.keys() and len(local) == 4
    same = ("op", "implementation", "case_id", "mode", "dtype", "status", "verified",
            "verify_status", "device", "runtime", "representative")
    for key, row in local.items():
        assert {f: on_ray[key].get(f) for f in same} == {f: row.get(f) for f in same}, key
        assert on_ray[key]["samples_us"] and on_ray[key]["host"]


def _payload(**kw):
    return dict({"op": "softmax", "spec_files": [], "include_builtin": True, "max_gib": None,
                 "target": None, "sku": None, "suite": "quick", "run": "r", "impl": None}, **kw)


def test_a_worker_whose_set_up_raises_gives_error_rows_with_its_reason(ray_cluster):
    """A node without the op (e.g. a spec file missing there): each case tried twice, then
    an error naming what the worker raised."""
    import torch

    cases = [c.with_(dtype=torch.float32) for c in
                   registry.builtin_spec("softmax").cases("quick")[:2]]
    lost = []
    cluster.run_on_ray(verify_on_cluster.WORKER, [cluster.Group("g", _payload(op="nope"), cases)],
                       device="cpu", on_item=lambda *a: pytest.fail("the set-up cannot succeed"),
                       on_lost=lambda group, case, reason: lost.append((case.id, reason)))
    assert [case_id for case_id, _ in lost] == [c.id for c in cases]
    for _, reason in lost:
        assert reason.startswith("its worker failed on both tries (ValueError: unknown op(s) nope")


def test_each_gpu_model_runs_every_case_and_a_model_the_cluster_lacks_is_not_waited_for(
        ray_cluster, tmp_path):
    import torch

    assert cluster.gpu_models() == [MODEL]
    case = registry.builtin_spec("softmax").cases("quick")[0].with_(dtype=torch.float32)
    groups = cluster.on_each([cluster.Group("g", _payload(), [case])], [MODEL, "NOPE"])
    assert [g.gpu_model for g in groups] == [MODEL, "NOPE"]
    ran, lost = [], []
    cluster.run_on_ray(verify_on_cluster.WORKER, groups, device="cpu",
                       on_item=lambda group, c, value: ran.append((group.gpu_model, value[1].status)),
                       on_lost=lambda group, c, reason: lost.append((group.gpu_model, reason)))
    assert ran == [(MODEL, "pass")]
    assert lost == [("NOPE", "not run: the cluster has no NOPE GPU left")]
    with pytest.raises(SystemExit, match="--ray-gpu picks GPU models, but the tasks run on CPU"):
        _verify(tmp_path, "--ray", "--ray-gpu", MODEL)


def test_ctrl_c_cancels_the_sweep_and_keeps_the_rows_written(ray_cluster, tmp_path, monkeypatch):
    """KeyboardInterrupt in the driver (Ctrl-C) after the first row: it propagates, the row
    written stays, and the tasks still running are cancelled."""
    import torch

    monkeypatch.delenv(cluster.FAULT_ENV, raising=False)
    spec = registry.builtin_spec("softmax")
    cases = [c.with_(dtype=torch.float32) for c in spec.cases("quick")[:3]]
    got = []

    def on_item(group, case, value):
        got.append(value)
        raise KeyboardInterrupt

    groups = [cluster.Group(c.id, _payload(), [c]) for c in cases]
    with pytest.raises(KeyboardInterrupt):
        cluster.run_on_ray(verify_on_cluster.WORKER, groups, device="cpu", on_item=on_item,
                           on_lost=lambda *a: pytest.fail("nothing was lost"))
    assert len(got) == 1


def test_without_ray_installed_the_flag_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(SystemExit, match=r"pip install \"speedlight\[ray\]\""):
        _verify(tmp_path, "--ray")


def test_a_ray_tune_sweep_writes_the_rows_of_a_local_run(ray_cluster, tmp_path):
    common = ["tune", "rms_norm", "--cases", "hidden4096", "--max-compiles", "2",
              "--no-install", "--device", "cpu"]
    assert cli.main(common + ["--out", str(tmp_path / "local")]) == 0
    assert cli.main(common + ["--out", str(tmp_path / "ray"), "--ray"]) == 0
    aside = {"run", "timestamp", "host"}

    def rows(where):
        return sorted((json.dumps({k: v for k, v in r.items() if k not in aside}, sort_keys=True)
                       for r in _rows(tmp_path / where / "tune.jsonl")))
    local = rows("local")
    assert local and rows("ray") == local
