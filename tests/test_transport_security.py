"""TLS and the bearer token, end to end on loopback: both servers over https:// and
grpcs:// with a certificate made at run time, the clients trusting it (--tls-ca), the
token from a file or $RIDGELINE_TOKEN (never on the command line); and every command's
port and connection options checked where they enter."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from _serve_backends import doubler_plan_doc
from _timing import running, watch
from ridgeline.cli import app
from ridgeline.errors import ConfigError, TargetUnreachableError
from ridgeline.fakeserver import FakeServer, load_preset
from ridgeline.pipeline.plan import Plan
from ridgeline.serve.runtime import PlanServer
from ridgeline.targets import TargetOptions, make_target
from ridgeline.v2.limits import ConnectionLimits
from ridgeline.v2.security import TOKEN_ENV, resolve_token, tls_files
from ridgeline.workload.payloads import RequestShape

MODEL = load_preset("fast")
SHAPE = RequestShape(items=1)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, made now with openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not on the PATH: no certificate to test TLS with")
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def _plan() -> Plan:
    return Plan.model_validate(doubler_plan_doc())


async def _one_request(url: str, **options: Any) -> bool:
    target = make_target(url, TargetOptions(**options))
    await target.connect(4)
    try:
        return (await target.send(SHAPE)).ok
    finally:
        await target.close()


async def test_the_fake_server_serves_https_and_grpcs_to_clients_trusting_its_ca(
    certificate: tuple[Path, Path],
) -> None:
    cert, key = certificate
    async with FakeServer(MODEL, tls=tls_files(cert, key), token="s3cret") as s:
        assert s.model_url.startswith("https://") and s.grpc_url.startswith("grpcs://")
        assert await _one_request(s.model_url, ca_file=cert, token="s3cret")
        assert await _one_request(s.grpc_url, ca_file=cert, token="s3cret")
        assert await _one_request(f"openai+{s.openai_url}", ca_file=cert, token="s3cret")
        with pytest.raises(TargetUnreachableError, match="CERTIFICATE_VERIFY_FAILED"):
            await _one_request(s.model_url, token="s3cret")  # not trusting it
        with pytest.raises(TargetUnreachableError, match="HTTP 401"):
            await _one_request(s.model_url, ca_file=cert)  # no token


async def test_serve_serves_https_and_grpcs(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    tls = tls_files(cert, key)
    async with PlanServer(_plan(), Path("."), http_port=0, grpc_port=0, tls=tls) as s:
        assert s.http_url.startswith("https://")
        assert await _one_request(s.model_url("double"), ca_file=cert)
        grpcs = f"grpcs://127.0.0.1:{s.grpc_port}/double"
        assert await _one_request(grpcs, ca_file=cert)


async def test_a_tls_handshake_that_never_comes_is_closed_after_the_header_timeout(
    certificate: tuple[Path, Path],
) -> None:
    import asyncio

    limits = ConnectionLimits(header_timeout_s=1.0)
    async with FakeServer(MODEL, tls=tls_files(*certificate), limits=limits) as s:
        for port in (s.http_port, s.grpc_port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert await asyncio.wait_for(reader.read(), 5.0) == b""  # closed, no hello
            writer.close()


def test_bad_tls_files_are_named_where_they_are_given(tmp_path: Path) -> None:
    text = tmp_path / "not.pem"
    text.write_text("hello\n")
    with pytest.raises(ConfigError, match="give both"):
        tls_files(text, None)
    with pytest.raises(ConfigError, match=f"cannot load the TLS certificate {text}"):
        tls_files(text, text)
    with pytest.raises(ConfigError, match=r"cannot load the TLS certificate .*No such file"):
        tls_files(tmp_path / "missing.pem", text)
    with pytest.raises(ConfigError, match=f"cannot load the CA bundle {text}"):
        make_target("grpcs://127.0.0.1:1/m", TargetOptions(ca_file=text))


# --- the token: --token, --token-file, $RIDGELINE_TOKEN ---------------------------------


def test_the_token_comes_from_the_option_the_file_or_the_environment(tmp_path: Path) -> None:
    file = tmp_path / "token"
    file.write_text("from-file\n")
    env = {TOKEN_ENV: "from-env"}
    assert resolve_token("given", None, env) == "given"
    assert resolve_token(None, file, env) == "from-file"
    assert resolve_token(None, None, env) == "from-env"
    assert resolve_token(None, None, {TOKEN_ENV: ""}) is None
    assert resolve_token(None, None, {}) is None
    with pytest.raises(ConfigError, match="give --token or --token-file, not both"):
        resolve_token("given", file, {})
    with pytest.raises(ConfigError, match=r"cannot read --token-file .*No such file"):
        resolve_token(None, tmp_path / "missing", {})
    with pytest.raises(ConfigError, match="cannot read --token-file"):
        resolve_token(None, tmp_path, {})  # a directory
    (tmp_path / "latin1").write_bytes(b"caf\xe9")
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        resolve_token(None, tmp_path / "latin1", {})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match=r"the token in --token-file .* is empty"):
        resolve_token(None, tmp_path / "empty", {})
    with pytest.raises(ConfigError, match=r"\$RIDGELINE_TOKEN is empty or holds a space"):
        resolve_token(None, None, {TOKEN_ENV: "two words"})


@given(st.text() | st.none(), st.binary() | st.none(), st.text())
def test_resolving_a_token_raises_only_config_error(
    token: str | None, file_bytes: bytes | None, env: str
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as where:
        file = None
        if file_bytes is not None:
            file = Path(where) / "token"
            file.write_bytes(file_bytes)
        try:
            got = resolve_token(token, file, {TOKEN_ENV: env})
        except ConfigError:
            return
    assert got is None or (got and all("!" <= c <= "~" for c in got))


def test_a_token_file_and_tls_end_to_end_through_the_commands(
    tmp_path: Path, certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate
    token_file = tmp_path / "token"
    token_file.write_text("not-in-ps\n")
    server = [sys.executable, "-m", "ridgeline", "fake-server", "--preset", "fast"]
    server += ["--port", "0", "--grpc-port", "0", "--token-file", str(token_file)]
    server += ["--tls-cert", str(cert), "--tls-key", str(key)]
    with running(server) as out:
        http = out.wait_for("v2 HTTP", 60).split()[-1]
        grpc = out.wait_for("v2 gRPC", 10).split()[-1]
        assert http.startswith("https://127.0.0.1:") and grpc.startswith("grpcs://")
        for url, auth in ((http, ["--token-file", str(token_file)]), (grpc, [])):
            env = {**os.environ, TOKEN_ENV: "not-in-ps"} if not auth else None
            res = subprocess.run(
                [
                    *(sys.executable, "-m", "ridgeline", "run", url, "--rate", "20"),
                    *("--duration", "0.5", "--tls-ca", str(cert), "--json", *auth),
                    *("--db", str(tmp_path / "runs.sqlite")),
                ],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
            )
            summary = json.loads(res.stdout)
            # 3: the step was INVALID (a busy host's generator fell behind), not refused
            assert res.returncode == (0 if summary["valid"] else 3), res.stderr
            assert summary["ok"] == summary["sent"] > 0


def test_a_lowered_descriptor_limit_lowers_the_bound_and_idle_sockets_lock_out_nobody(
    tmp_path: Path,
) -> None:
    """The tester's case: descriptors limited to 200, 400 idle sockets; a new client is
    answered at once (the bound, 200 less 64, closes the longest-idle ones)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))

    cmd = [sys.executable, "-m", "ridgeline", "fake-server", "--port", "0", "--grpc-port", "0"]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        out, err = watch(proc)
        try:
            line = out.wait_for("v2 HTTP", 60)
        except AssertionError as e:  # seen once in a full suite: say why the server did not
            raise AssertionError(f"{e}\nexit {proc.poll()}; stderr:\n{''.join(err.lines)}") from e
        port = urlsplit(line.split()[-1]).port
        assert port is not None
        with (
            _idle_sockets(port, 400),
            socket.create_connection(("127.0.0.1", port), timeout=10) as client,
        ):
            client.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            assert client.recv(64).startswith(b"HTTP/1.1 200")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@contextlib.contextmanager
def _idle_sockets(port: int, n: int) -> Iterator[list[socket.socket]]:
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]
    try:
        yield socks
    finally:
        for s in socks:
            s.close()


# --- every command's port and connection options ----------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["fake-server", "--port", "70000"],
        ["fake-server", "--port", "-1"],
        ["fake-server", "--grpc-port", "70000"],
        ["serve", "plan.yaml", "--port", "65536"],
        ["serve", "plan.yaml", "--grpc-port", "-1"],
    ],
)
def test_a_port_out_of_range_is_a_one_line_error_naming_the_option(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    option = args[-2]
    assert f"Invalid value for '{option}'" in result.output
    assert "65535" in result.output or "greater than or equal to 0" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--idle-timeout", "0", "--idle-timeout 0.0: input should be greater than 0"),
        ("--header-timeout", "-1", "--header-timeout -1.0: input should be greater than 0"),
        ("--body-timeout", "inf", "--body-timeout inf: input should be a finite number"),
        ("--max-connections", "0", "--max-connections 0: input should be greater than or"),
    ],
)
def test_a_bad_connection_limit_is_a_one_line_error_naming_the_option(
    flag: str, value: str, says: str
) -> None:
    result = CliRunner().invoke(app, ["fake-server", "--port", "0", flag, value])
    assert result.exit_code == 2
    assert says in " ".join(result.output.split())
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "command",
    [["run", "grpcs://127.0.0.1:1/m", "--rate", "5", "--duration", "0.2"], ["probe", "null://"]],
)
def test_the_clients_token_file_and_ca_are_checked_before_any_traffic(
    tmp_path: Path, command: list[str]
) -> None:
    text = tmp_path / "not.pem"
    text.write_text("hello\n")
    db = ["--db", str(tmp_path / "runs.sqlite")]
    for option, says in (
        (["--token-file", str(tmp_path / "missing")], "cannot read --token-file"),
        (["--tls-ca", str(text)], f"cannot load the CA bundle {text}"),
    ):
        result = CliRunner().invoke(app, [*command, *option, *db])
        assert result.exit_code == 2, result.output
        assert says in " ".join(result.output.split())
        assert "Traceback" not in result.output
