"""`--ray ADDRESS` where no Ray cluster answers: verify, bench and tune exit 1 with a message
naming the address, within --ray-timeout (Ray itself retries such an address for minutes);
`--ray auto` where none runs starts a local one on the loopback, waits for it up to
--ray-timeout, and otherwise says in one line that Ray's start-up failed or took too long."""

import os
import socket
import threading
import time

import pytest

from speedlight import cli, cluster

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")


@pytest.fixture
def not_joined(monkeypatch):
    """This process joined no cluster (another test module's may be up in this worker)."""
    monkeypatch.setattr(ray, "is_initialized", lambda: False)


def _closed_port() -> int:
    with socket.socket() as s:  # bound, never listening: a connection is refused
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("argv", [
    pytest.param(["verify", "--ops", "softmax"], id="verify"),
    pytest.param(["bench", "--ops", "softmax"], id="bench"),
    pytest.param(["tune", "softmax"], id="tune"),
])
def test_nothing_listening_at_the_ray_address_exits_1_naming_it(argv, not_joined, tmp_path,
                                                               monkeypatch):
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("ray.init was reached"))
    address = f"127.0.0.1:{_closed_port()}"
    start = time.monotonic()
    with pytest.raises(SystemExit) as exit_:
        cli.main([*argv, "--device", "cpu", "--out", str(tmp_path), "--ray", address])
    assert time.monotonic() - start < 30
    assert f"--ray {address}: nothing answers" in str(exit_.value.code)


def test_an_address_that_never_answers_as_ray_gives_up_after_the_timeout(not_joined,
                                                                         monkeypatch):
    released = threading.Event()
    monkeypatch.setattr(ray, "init", lambda *a, **k: released.wait(60))  # Ray's endless retry
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        start = time.monotonic()
        try:
            with pytest.raises(cluster.ClusterError, match=r"no Ray cluster answered within "
                                                           r"0.5 s \(--ray-timeout\)"):
                cluster.connect(address, timeout=0.5)
        finally:
            released.set()
    assert time.monotonic() - start < 10


def test_ray_address_from_the_environment_is_checked_too(not_joined, monkeypatch):
    address = f"127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("RAY_ADDRESS", address)
    with pytest.raises(cluster.ClusterError, match=rf"--ray auto \(RAY_ADDRESS={address}\)"):
        cluster.connect("auto", timeout=5)


class _SlowStart:
    """ray.init where no cluster runs: joining ("auto") finds none; a start takes `seconds`
    (or raises `error`), recording what it was asked for and what Ray would read then."""

    def __init__(self, seconds=0.0, error=None):
        self.seconds, self.error, self.started = seconds, error, []
        self.released = threading.Event()

    def __call__(self, address=None, **kw):
        if address == "auto":
            raise ConnectionError("Could not find any running Ray instance.")
        from ray._private import ray_constants
        self.started.append(dict(kw, address=address,
                                 single_machine=not ray_constants.ENABLE_RAY_CLUSTER,
                                 gcs_wait=os.environ.get("RAY_gcs_server_port_wait_time_s")))
        if self.error is not None:
            raise self.error
        self.released.wait(self.seconds)


@pytest.fixture
def no_cluster_here(not_joined, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_gcs_server_port_wait_time_s", raising=False)
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "127.0.0.1")

    def use(fake):
        monkeypatch.setattr(ray, "init", fake)
        return fake
    return use


def test_ray_auto_waits_for_a_slow_local_start_on_the_loopback(no_cluster_here):
    fake = no_cluster_here(_SlowStart(seconds=1.0))
    said = cluster.connect("auto", timeout=45)
    assert "started a local one on this machine, listening on 127.0.0.1 only" in said
    (start,) = fake.started
    assert start["address"] == "local" and start["_node_ip_address"] == "127.0.0.1"
    assert start["single_machine"], "Ray's single-machine mode was off during the start"
    assert start["gcs_wait"] == "45", "Ray's own wait for the GCS was shorter than the timeout"
    from ray._private import ray_constants
    assert ray_constants.ENABLE_RAY_CLUSTER and "RAY_gcs_server_port_wait_time_s" not in os.environ


def test_ray_auto_gives_up_on_a_local_start_after_the_timeout_in_one_line(no_cluster_here,
                                                                           tmp_path):
    fake = no_cluster_here(_SlowStart(seconds=60))
    start = time.monotonic()
    try:
        with pytest.raises(SystemExit) as exit_:
            cli.main(["verify", "--ops", "softmax", "--device", "cpu", "--out", str(tmp_path),
                      "--ray", "--ray-timeout", "0.5"])
    finally:
        fake.released.set()
    assert time.monotonic() - start < 10
    message = str(exit_.value.code)
    assert "\n" not in message.strip(), message
    assert ("--ray auto: Ray's start-up of a local cluster on this machine did not finish "
            "within 0.5 s (--ray-timeout)") in message


def test_ray_auto_says_why_ray_s_start_up_failed_in_one_line(no_cluster_here):
    no_cluster_here(_SlowStart(error=Exception("The current node timed out during startup.\n"
                                               "More lines of Ray's")))
    with pytest.raises(cluster.ClusterError) as error:
        cluster.connect("auto", timeout=5)
    assert str(error.value) == ("--ray auto: Ray's start-up of a local cluster on this machine "
                                "failed (Exception: The current node timed out during startup.)")


def test_a_local_cluster_ray_put_elsewhere_is_refused(no_cluster_here, monkeypatch):
    no_cluster_here(_SlowStart())
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "192.0.2.7")
    stopped = []
    monkeypatch.setattr(ray, "shutdown", lambda: stopped.append(True))
    with pytest.raises(cluster.ClusterError, match="on 192.0.2.7, not on the loopback"):
        cluster.connect("auto", timeout=5)
    assert stopped
