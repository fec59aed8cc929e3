"""What the project starts listens on loopback only (issue 33, fault 26): the check that
reads every listening socket of this process and its children from ``/proc``, and the
local Ray that ``serve --engine ray`` starts, refused where it binds beyond loopback."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from ridgeline._loopback import Listener, _address, descendants, outside_loopback
from ridgeline.errors import ConfigError

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.4.5", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.0.2.2", False),
        ("::ffff:192.0.2.2", False),
    ],
)
def test_loopback_is_127_0_0_0_8_and_its_ipv6_forms(address: str, loopback: bool) -> None:
    assert Listener(1, "x", address, 80).loopback is loopback


def test_the_kernels_hex_addresses_are_read_in_host_order() -> None:
    assert _address("0100007F", socket.AF_INET) == "127.0.0.1"
    assert _address("00000000000000000000000001000000", socket.AF_INET6) == "::1"
    assert _address("0000000000000000FFFF00000100007F", socket.AF_INET6) == "::ffff:127.0.0.1"


def test_a_socket_this_process_opens_beyond_loopback_is_found_and_one_on_it_is_not() -> None:
    with socket.socket() as inside, socket.socket() as outside:
        inside.bind(("127.0.0.1", 0))
        inside.listen()
        outside.bind(("0.0.0.0", 0))
        outside.listen()
        found = outside_loopback({os.getpid()})
        ports = {s.port for s in found}
        assert outside.getsockname()[1] in ports
        assert inside.getsockname()[1] not in ports
    assert os.getpid() in descendants()


@pytest.mark.timeout(180)
def test_a_local_ray_is_refused_where_it_listens_beyond_loopback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Ray ``serve --engine ray`` starts: kept only when all it listens on is
    loopback; else shut down and refused, naming what listened where. Either way no
    listener this test started is left outside 127.0.0.0/8 (a Ray run earlier in this
    process may leave its driver's own)."""
    ray = pytest.importorskip("ray")
    from ridgeline.export.ray_serve import EXPOSED_OK, refuse_exposed_ray

    if ray.is_initialized():
        pytest.skip("a Ray is already running in this process")
    monkeypatch.delenv(EXPOSED_OK, raising=False)
    # a Ray this process ran before (the suite's, refused) may leave its driver listening
    before = set(outside_loopback())
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    exposed = outside_loopback()
    try:
        if exposed:
            with pytest.raises(ConfigError, match="listens beyond loopback") as refused:
                refuse_exposed_ray(ray)
            assert str(exposed[0]) in str(refused.value)
            assert not ray.is_initialized()
        else:
            refuse_exposed_ray(ray)  # loopback only: kept
            assert ray.is_initialized()
    finally:
        if ray.is_initialized():
            ray.shutdown()
    assert set(outside_loopback()) <= before  # nothing this test started is left
