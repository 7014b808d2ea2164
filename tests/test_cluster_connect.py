"""`--ray ADDRESS` where no Ray cluster answers: verify, bench and tune exit 1 with a message
naming the address, within --ray-timeout (Ray itself retries such an address for minutes)."""

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
