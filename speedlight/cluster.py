"""Sweeps over a Ray cluster: groups of cases run as Ray tasks, one whole GPU each.

Vocabulary-level, like results.py: verify, bench and tune import it to spread their cases
over a cluster; it imports no tool and no kernel module. Ray is an optional dependency
(`pip install "speedlight[ray]"`), imported only when a sweep asks for it.

A sweep is a list of `Group`s (one per kernel specialisation: op, implementation, dtype and
shape, so a worker compiles each kernel once) and a worker function named "module:function".
Each group becomes one Ray task. On its node the task picks the runtime before any kernel
module is imported (the Triton interpreter on CPU workers, as `speedlight --device cpu`
does), points Triton's cache at the node's local disk, calls `worker(payload, device)` once
to get a per-item function (the set-up: specs, timers, target), then yields that function's
value for each item in order. The driver receives every value as it comes (a streaming
generator with a backpressure of one, so a value yielded is a value delivered) and hands it
to `on_item`, which writes the rows: what a worker finished is on disk before it starts the
next item.

Faults: a task whose worker or node dies (or whose set-up raises) is charged to the first
item it had not delivered; its undelivered items go back to the cluster as a new task. An
item charged twice is given to `on_lost` with the reason (the tool writes error rows for
it), so a case that kills its worker is tried exactly twice and the sweep still ends.
Ctrl-C (or any exception out of `on_item`) cancels every task still running and re-raises;
the items already delivered were written as they came.
"""

from __future__ import annotations

import contextlib
import getpass
import importlib
import math
import os
import socket
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

ATTEMPTS = 2  # tries per item: the first, and one retry elsewhere
CONNECT_TIMEOUT_S = 30.0  # --ray-timeout's default: how long joining a cluster may take
FAULT_ENV = "SPEEDLIGHT_CLUSTER_FAULT"  # tests only: see _maybe_fail


class ClusterError(RuntimeError):
    """Ray missing, no cluster at the address given, or no worker that can run the sweep."""


@dataclass
class Group:
    """Items that run as one task on one worker: `payload` is what the worker's set-up
    needs (shared by the items), `items` what it runs one after another (e.g. Cases).
    Both travel to the worker, so both must pickle."""
    key: str
    payload: Any
    items: list = field(default_factory=list)
    gpu_model: str | None = None  # Ray's accelerator type (H100, A100...); None: any GPU


@dataclass(frozen=True)
class RaySweep:
    """Where a --ray sweep runs, as its flags say (speedlight.arguments reads them): the
    cluster's `address` ('auto': the one on this machine, else a new local one), CPUs per
    task, the GPU models to run every item on (--ray-gpu; None: once, on any GPU), how long
    joining may take, and --device as given (the workers choose their own runtime)."""

    address: str = "auto"
    cpus: int = 1
    gpu_models: str | None = None
    timeout_s: float = CONNECT_TIMEOUT_S
    device: str = "auto"

    def join(self, say: Callable[[str], Any] = print) -> tuple[str, list[str | None]]:
        """Join the cluster, saying so: (the workers' device, 'cuda' or 'cpu'; the GPU
        models each item runs on)."""
        say(connect(self.address, self.timeout_s))
        device = worker_device(self.device)
        models = chosen_gpu_models(self.gpu_models, device)
        say(describe_cluster(device, self.cpus))
        return device, models


def _ray():
    try:
        import ray
    except ImportError:
        raise ClusterError("--ray needs Ray, which is not installed: "
                           "pip install \"speedlight[ray]\"") from None
    return ray


def connect(address: str = "auto", timeout: float = CONNECT_TIMEOUT_S) -> str:
    """Join the Ray cluster at `address` ('auto': the one started on this machine, else a
    new local one, see start_local) unless this process already has; a line saying which.
    ClusterError when nothing listens at the address, no cluster answers there within
    `timeout` seconds (Ray itself keeps retrying an unreachable address for minutes), or a
    local start fails or does not finish within `timeout` seconds."""
    ray = _ray()
    if ray.is_initialized():
        return "Ray: using the cluster this process is connected to"
    named = address if address != "auto" else os.environ.get("RAY_ADDRESS")
    if named and named not in ("auto", "local"):
        _check_listening(address, named, timeout)
    try:
        if address != "auto":
            _within(timeout, address, lambda: ray.init(address=address, **_QUIET))
            return f"Ray: joined the cluster at {address}"
        try:
            _within(timeout, address, lambda: ray.init(address="auto", **_QUIET))
            return "Ray: joined the cluster running on this machine"
        except ConnectionError:
            pass  # none here: start one
    except (ConnectionError, ValueError, RuntimeError) as e:
        if isinstance(e, ClusterError):
            raise
        raise ClusterError(f"--ray {address}: cannot join a Ray cluster there: {e}") from None
    start_local(timeout)
    return ("Ray: no cluster found (no `ray start --head` here, no RAY_ADDRESS): started a "
            f"local one on this machine, listening on {LOOPBACK} only")


_QUIET = {"log_to_driver": False, "logging_level": "ERROR", "configure_logging": True}
LOOPBACK = "127.0.0.1"
# Ray's own limits on a start, raised to the start's timeout where it is longer (each read
# from the environment when the start reads it; a value the user set is kept)
_RAY_START_WAITS_S = {"RAY_gcs_server_port_wait_time_s": 30,  # the GCS publishing its port
                      "RAY_gcs_rpc_server_reconnect_timeout_s": 60}  # a process reaching it


def start_local(timeout: float = CONNECT_TIMEOUT_S, *, cpus: int | None = None,
                resources: dict | None = None) -> None:
    """Start a Ray cluster of this machine alone for this process, every part of it (the
    node's address, the GCS, the raylet and its object manager, the workers) listening on
    the loopback address only: a cluster no other machine is to join has no reason to be
    reachable from one. ClusterError, in one line naming Ray's start-up, when the start
    fails, does not finish within `timeout` seconds, or Ray put the node elsewhere.

    Ray on Linux takes a node address on the loopback for a mistake and replaces it by the
    machine's network address, unless its single-machine mode is on (the one Ray uses on
    macOS and Windows; `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, read when ray is imported):
    that mode is switched on for the start, and the address Ray chose is checked after it.
    `cpus` and `resources` are ray.init's num_cpus and resources (the tests' fake GPU
    model)."""
    ray = _ray()
    init = dict(_QUIET, address="local", include_dashboard=False, _node_ip_address=LOOPBACK)
    if cpus is not None:
        init["num_cpus"] = cpus
    if resources:
        init["resources"] = dict(resources)

    def start() -> None:
        with _single_machine_ray(), _ray_waits(timeout):
            ray.init(**init)

    try:
        _within(timeout, "auto", start, stay=True, what=(
            f"Ray's start-up of a local cluster on this machine did not finish within "
            f"{timeout:g} s (--ray-timeout); give it longer, or start one with "
            f"`ray start --head`"))
    except ClusterError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever Ray raised, in one line
        raise ClusterError(f"--ray auto: Ray's start-up of a local cluster on this machine "
                           f"failed ({_reason(e)})") from None
    node = ray.util.get_node_ip_address()
    if not _is_loopback(node):
        ray.shutdown()
        raise ClusterError(f"--ray auto: Ray {ray.__version__} put the local cluster's node "
                           f"on {node}, not on the loopback address; start one with `ray "
                           f"start --head --node-ip-address {LOOPBACK}` and run again")


def _is_loopback(address: str) -> bool:
    import ipaddress
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


@contextlib.contextmanager
def _single_machine_ray():
    """Ray's single-machine mode while a start reads it (see start_local)."""
    from ray._private import ray_constants
    saved = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


@contextlib.contextmanager
def _ray_waits(timeout: float):
    """Ray's own start-up waits no shorter than `timeout`, so that a slow start is given the
    time --ray-timeout gives it (Ray's raylet wait, 30 s, has no setting)."""
    saved = {k: os.environ.get(k) for k in _RAY_START_WAITS_S}
    for key, default in _RAY_START_WAITS_S.items():
        if saved[key] is None and timeout > default:
            os.environ[key] = str(math.ceil(timeout))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)


def _check_listening(flag: str, address: str, timeout: float) -> None:
    """ClusterError unless something accepts a TCP connection at address (HOST:PORT, or
    ray://HOST:PORT), within timeout seconds; an address without a port is left to Ray."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        return
    host = host.strip("[]")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        label = flag if flag == address else f"{flag} (RAY_ADDRESS={address})"
        raise ClusterError(
            f"--ray {label}: nothing answers at {host}:{port} ({why}), so no Ray cluster runs "
            f"there; start one (`ray start --head --port {port}`) or give the head node's "
            f"address") from None


def _within(timeout: float, address: str, join: Callable[[], Any], what: str | None = None, *,
            stay: bool = False) -> None:
    """join() (a ray.init), ClusterError (`what`, else that no cluster answered) if it has
    not returned after timeout seconds. It runs in a daemon thread, left behind on a timeout
    (the process is about to exit). With `stay` the thread outlives join(), parked for the
    life of the process: a ray.init that starts a cluster has its processes killed when the
    thread that started them ends (Ray binds them to it with Linux's PR_SET_PDEATHSIG, which
    follows the thread, not the process)."""
    done: list = []
    returned = threading.Event()

    def attempt() -> None:
        try:
            join()
            done.append(None)
        except BaseException as e:  # handed to the caller's thread
            done.append(e)
        returned.set()
        if stay and done[0] is None:
            threading.Event().wait()

    threading.Thread(target=attempt, name="ray-connect", daemon=True).start()
    if not returned.wait(timeout):
        raise ClusterError(f"--ray {address}: " + (what or (
            f"no Ray cluster answered within {timeout:g} s (--ray-timeout); is a head node "
            f"running there?")))
    if done[0] is not None:
        raise done[0]


def gpu_models() -> list[str]:
    """The GPU models (Ray accelerator types) the cluster's live nodes have."""
    prefix = "accelerator_type:"
    return sorted(k[len(prefix):] for k in _ray().cluster_resources() if k.startswith(prefix))


def chosen_gpu_models(text: str | None, device: str) -> list[str | None]:
    """--ray-gpu as the models to run every case on ([None]: once, on any GPU)."""
    if text is None:
        return [None]
    if device != "cuda":
        raise ClusterError("--ray-gpu picks GPU models, but the tasks run on CPU workers "
                           "(a cluster without GPUs, or --device cpu)")
    have = gpu_models()
    wanted = have if text.strip() == "each" else [m.strip() for m in text.split(",") if m.strip()]
    missing = [m for m in wanted if m not in have]
    if missing or not wanted:
        raise ClusterError(f"--ray-gpu {text}: the cluster has no GPU of model "
                           f"{', '.join(missing) or '(none named)'}; it has "
                           f"{', '.join(have) or 'no GPU model Ray knows'}")
    return list(wanted)


def on_each(groups: Sequence[Group], models: Sequence[str | None]) -> list[Group]:
    """Every group once per GPU model (a group as it is for [None])."""
    if list(models) == [None]:
        return list(groups)
    return [Group(f"{g.key} on {m}", g.payload, list(g.items), m) for g in groups for m in models]


def worker_device(requested: str) -> str:
    """'cuda' or 'cpu' for the tasks, from --device as given and the cluster's resources:
    a GPU per task where the cluster has GPUs (unless --device cpu), else CPU workers."""
    gpus = int(_ray().cluster_resources().get("GPU", 0))
    if requested == "cpu":
        return "cpu"
    if requested.startswith("cuda"):
        if not gpus:
            raise ClusterError("--device cuda with --ray: the Ray cluster has no GPU")
        return "cuda"
    return "cuda" if gpus else "cpu"


def describe_cluster(device: str, cpus: int) -> str:
    res = _ray().cluster_resources()
    nodes = sum(1 for n in _ray().nodes() if n.get("Alive"))
    if device == "cuda":
        return (f"Ray: {nodes} node(s), {int(res.get('GPU', 0))} GPU(s); one whole GPU per "
                f"task, up to {int(res.get('GPU', 0))} at once")
    return (f"Ray: {nodes} node(s), {int(res.get('CPU', 0))} CPU(s), no GPU used: every task "
            f"runs the Triton interpreter on {cpus} CPU(s) (correctness only)")


# --- on the worker ---------------------------------------------------------------------------

def _local_triton_cache() -> str:
    """A folder on this node's own disk for Triton's cache (not a shared home directory)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"speedlight-triton-cache-{user}")


def _maybe_fail(item, spec: str | None) -> None:
    """Fault injection for the tests, from the driver's SPEEDLIGHT_CLUSTER_FAULT: TEXT kills
    the worker process (os._exit) as it starts an item whose id contains TEXT, on every try;
    TEXT@MARKER does so only while the file MARKER does not exist, creating it first (so
    only the first try dies)."""
    if not spec:
        return
    text, _, marker = spec.partition("@")
    if text not in str(getattr(item, "id", item)):
        return
    if marker:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    os._exit(3)


def _choose_runtime(device: str) -> None:
    """On a worker, before any kernel module is imported: the Triton interpreter for 'cpu'
    (as `speedlight --device cpu` does), compiled kernels for 'cuda'. A worker process that
    already imported triton the other way cannot switch: that is an error, not a silent
    wrong runtime."""
    import sys

    interpreting = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
    if "triton" in sys.modules and interpreting != (device == "cpu"):
        raise RuntimeError(f"this Ray worker imported triton with TRITON_INTERPRET="
                           f"{os.environ.get('TRITON_INTERPRET')!r}, which a {device} sweep "
                           f"cannot use; run the sweep from a new driver process")
    if device == "cpu":
        from speedlight.runtime import select_device
        select_device("cpu")  # the interpreter on, its numerics set, as the CLI does
    elif interpreting:
        os.environ["TRITON_INTERPRET"] = "0"  # a node whose environment asks for it


def _task(worker: str, device: str, payload, items: Sequence, fault: str | None = None):
    """Runs on a Ray worker: the runtime first, then the tool's worker, item by item."""
    os.environ.setdefault("TRITON_CACHE_DIR", _local_triton_cache())
    _choose_runtime(device)
    module, _, name = worker.partition(":")
    run_one = getattr(importlib.import_module(module), name)(payload, device)
    for item in items:
        _maybe_fail(item, fault)
        yield run_one(item)


# --- on the driver ---------------------------------------------------------------------------

def _reason(error: BaseException) -> str:
    """One line: the exception the task raised (not Ray's wrapper with its traceback), or
    why Ray lost the worker."""
    cause = getattr(error, "cause", None)  # a RayTaskError's original exception
    if isinstance(cause, BaseException):
        error = cause
    text = str(error).strip().splitlines()
    first = next((line for line in text if line.strip()), "")
    return f"{type(error).__name__}: {first}"[:500]


def _fits(resources: dict, device: str, cpus: int, gpu_model: str | None) -> str:
    """'' when the cluster's live nodes have what a task needs, else what is missing."""
    if device == "cuda" and resources.get("GPU", 0) < 1:
        return "the cluster has no GPU left"
    if gpu_model is not None and f"accelerator_type:{gpu_model}" not in resources:
        return f"the cluster has no {gpu_model} GPU left"
    if resources.get("CPU", 0) < cpus:
        return f"the cluster has fewer than {cpus} CPU(s) left"
    return ""


def run_on_ray(worker: str, groups: Sequence[Group], *, device: str, cpus: int = 1,
               on_item: Callable[[Group, Any, Any], Any],
               on_lost: Callable[[Group, Any, str], Any],
               env: dict[str, str] | None = None, check_every_s: float = 30.0) -> None:
    """Run every group as a Ray task on `device` ('cuda': one whole GPU each, of the group's
    gpu_model when it names one; 'cpu': `cpus` CPUs each, under the interpreter);
    on_item(group, item, value) for every value a worker yields, on_lost(group, item, reason)
    for every item that could not be run: its worker died twice, or no live node can run it
    (checked at each submission and every `check_every_s` without news, so a sweep whose
    last GPU node died ends instead of waiting). `env`: extra environment variables for the
    workers."""
    ray = _ray()
    # the runtime is chosen inside the task (_choose_runtime), so the workers Ray already
    # started serve the sweep; a runtime_env only for extra variables (new workers)
    options = dict(num_gpus=1 if device == "cuda" else 0, num_cpus=cpus, max_retries=0,
                   num_returns="streaming", _generator_backpressure_num_objects=1,
                   name="speedlight-sweep")
    if env:
        options["runtime_env"] = {"env_vars": dict(env)}
    remote = ray.remote(_task)
    fault = os.environ.get(FAULT_ENV) or None

    charged: dict[tuple[int, int], int] = {}  # (group, item index) -> deaths charged to it
    running: dict = {}  # generator -> (group index, item indices not yet delivered)

    def lose(g: int, todo: list[int], reason: str) -> None:
        for i in todo:
            on_lost(groups[g], groups[g].items[i], reason)

    def submit(g: int, todo: list[int], resources: dict) -> None:
        group = groups[g]
        missing = _fits(resources, device, cpus, group.gpu_model)
        if missing:
            lose(g, todo, f"not run: {missing}")
        elif todo:
            model = {"accelerator_type": group.gpu_model} if group.gpu_model else {}
            gen = remote.options(**options, **model).remote(
                worker, device, group.payload, [group.items[i] for i in todo], fault)
            running[gen] = (g, todo)

    try:
        resources = ray.cluster_resources()
        for g, group in enumerate(groups):
            submit(g, list(range(len(group.items))), resources)
        while running:
            ready, _ = ray.wait(list(running), num_returns=1, fetch_local=False,
                                timeout=check_every_s)
            if not ready:  # nothing for a while: are the tasks still runnable anywhere?
                resources = ray.cluster_resources()
                for gen, (g, todo) in list(running.items()):
                    missing = _fits(resources, device, cpus, groups[g].gpu_model)
                    if missing:
                        del running[gen]
                        ray.cancel(gen, force=True)
                        lose(g, todo, f"not run: {missing}")
                continue
            gen = ready[0]
            g, todo = running.pop(gen)
            try:
                value = ray.get(next(gen))
            except StopIteration:
                continue
            except (ray.exceptions.RayError, OSError) as e:
                first, rest = todo[0], todo[1:]
                charged[g, first] = charged.get((g, first), 0) + 1
                if charged[g, first] >= ATTEMPTS:
                    on_lost(groups[g], groups[g].items[first],
                            f"its worker failed on both tries ({_reason(e)})")
                    todo = rest
                if todo:
                    submit(g, todo, ray.cluster_resources())
                continue
            running[gen] = (g, todo[1:])
            on_item(groups[g], groups[g].items[todo[0]], value)
    except BaseException:  # Ctrl-C, or on_item could not write: stop the cluster's work too
        for gen in running:
            try:
                ray.cancel(gen, force=True)
            except Exception:  # noqa: BLE001 - a task that just ended cannot be cancelled
                pass
        raise
