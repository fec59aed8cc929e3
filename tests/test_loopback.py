"""What the project starts listens on loopback only (issue 33, fault 26): the check that
reads every listening socket of this process and its children from ``/proc``, and the
local Ray that ``serve --engine ray`` starts, refused where it binds beyond loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ridgeline._loopback import Listener, _address, descendants, outside_loopback

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


_REFUSAL_RUN = """
import ray
from ridgeline._loopback import outside_loopback
from ridgeline.errors import ConfigError
from ridgeline.export.ray_serve import private_ray_auth, refuse_exposed_ray

with private_ray_auth():  # as serve --engine ray starts it
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1", configure_logging=False)
    exposed = outside_loopback()
    print("exposed", len(exposed), exposed[0] if exposed else "")
    try:
        refuse_exposed_ray(ray)
        print("kept", ray.is_initialized())
    except ConfigError as refused:
        print("refused", ray.is_initialized(), str(refused).replace("\\n", " "))
    finally:
        if ray.is_initialized():
            ray.shutdown()
print("left", len(outside_loopback()))
"""


_SAID = ("exposed", "kept", "refused", "left")


@pytest.mark.timeout(180)
def test_a_local_ray_is_refused_where_it_listens_beyond_loopback() -> None:
    """The Ray ``serve --engine ray`` starts: kept only when all it listens on is
    loopback; else shut down and refused, naming what listened where. Either way no
    listener it started is left outside 127.0.0.0/8 once it is shut down. Run in a child
    process: a Ray earlier in the suite's process would leave its driver's state behind."""
    pytest.importorskip("ray")
    from ridgeline.export.ray_serve import EXPOSED_OK

    env = {k: v for k, v in os.environ.items() if k != EXPOSED_OK}
    run = subprocess.run(
        [sys.executable, "-c", _REFUSAL_RUN], env=env, capture_output=True, text=True, timeout=150
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line.split(" ", 1) for line in run.stdout.splitlines()]
    said = {w[0]: w[1] for w in lines if len(w) == 2 and w[0] in _SAID}
    count, first = [*said["exposed"].split(" ", 1), ""][:2]
    if int(count):
        assert said["refused"].startswith("False ")  # shut down, and said so
        assert "listens beyond loopback" in said["refused"]
        assert first.strip() in said["refused"]  # naming what listened where
    else:
        assert said["kept"] == "True"
    assert said["left"] == "0"


_TOKEN_RUN = """
import ray
from ridgeline.export.ray_serve import private_ray_auth

with private_ray_auth():
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1", configure_logging=False)
    try:
        print("answered", ray.get(ray.remote(lambda: 41 + 1).remote()))
    finally:
        ray.shutdown()
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("left", [None, "0123456789abcdef0123456789abcdef"])
def test_a_local_ray_keeps_to_a_token_of_its_own_and_leaves_the_home_folder_alone(
    tmp_path: Path, left: str | None
) -> None:
    """Fault 26's token file: a local Ray started the way ``serve --engine ray`` starts
    one neither takes a token another Ray left in ``~/.ray/auth_token`` nor writes one
    there (Ray 2.60 did both), and still answers its own driver. Run in a child process
    with its own home folder (and no Ray authentication settings of the user's)."""
    pytest.importorskip("ray")
    token = tmp_path / ".ray" / "auth_token"
    if left is not None:
        token.parent.mkdir()
        token.write_text(left)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    run = subprocess.run(
        [sys.executable, "-c", _TOKEN_RUN],
        env={**env, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "answered 42" in run.stdout
    if left is None:
        assert not token.exists()
    else:
        assert token.read_text() == left
