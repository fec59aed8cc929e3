"""Every ``ridgeline`` command the README shows (issue 33, fault 24): it parses with the
command line's own parser (its types, ranges and choices), every file it names ships
with the project or is written by a README line before it, and it runs as written.

Each line runs from a folder of its own holding links to ``examples`` and ``src`` (so
what it writes lands there), with a run store there. A line that needs a server runs
against the README's own server line for it (``ridgeline fake-server ...``, ``ridgeline
serve ...``), started as a subprocess on 127.0.0.1, waited on until it prints where it
listens, sent one request, and stopped with SIGTERM (status 0, no traceback). Tests bind
port 0, so exactly two changes are made to a README line, and no other: a server line
gets ``--port 0 --grpc-port 0`` (in place of the ports it names, or added where it leaves
them at their defaults 8000 and 8001), and a client line's ``127.0.0.1:PORT`` in a URL is
moved to the port its server got for that README PORT. A measurement passes when it exits
0, or 3 (INCONCLUSIVE: this busy host, not the server, was measured; README, "Exit
status"), prints no traceback, and prints what the README promises of it. Lines that
take seconds run in the default suite (the 10 s steps side by side, each against a
server of its own); lines that take minutes are marked ``slow``. What is not run, a
placeholder on purpose (``...``, ``RUN``, another machine's address) or a line that
needs Ray, GPUs or an hour, is in ``EXCLUDED`` with the reason, and a test holds every
README line either run or excluded. The ones that failed as written (a
``--shared-prefix`` longer than the shortest prompt, files nobody provided, a JSON step at
eight times the fake model's capacity) now name what ships."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import typer.main

from ridgeline.cli import app
from ridgeline.cli._exit import ExitCode

ROOT = Path(__file__).resolve().parent.parent
PLACEHOLDERS = ("...", "RUN", "SERVER", "10.0.0.5")
"""Words that mark a README line as a pattern to fill in, not a command to copy."""
WRITTEN = {"profiles.csv", "plan.yaml", "mig.yaml", "token", "cert.pem", "key.pem"}
"""Files README lines write (``--out``, ``echo … > token``, ``openssl … -out``)."""
FILE = re.compile(r"^[\w./-]+\.(csv|json|jsonl|yaml|yml|pem)$|^token$")


def readme_commands(starts: tuple[str, ...] = ("ridgeline ",)) -> list[str]:
    """The README's shell lines that start with ``starts`` (continuations joined,
    comments and a trailing ``&`` cut)."""
    text = (ROOT / "README.md").read_text()
    commands: list[str] = []
    for block in re.findall(r"```(?:sh|bash|console)?\n(.*?)```", text, re.S):
        current = ""
        for raw in block.splitlines():
            line = raw.strip()
            if not current and not line.startswith(starts):
                continue
            current = f"{current} {line}".strip()
            if current.endswith("\\"):
                current = current[:-1].rstrip()
                continue
            commands.append(re.sub(r"\s+#.*$", "", current).rstrip(" &"))
            current = ""
    return commands


def _command(argv: list[str]) -> tuple[Any, str, list[str]]:
    command: Any = typer.main.get_command(app)
    path: list[str] = []
    while hasattr(command, "commands") and argv and argv[0] in command.commands:
        path.append(argv[0])
        command = command.commands[argv.pop(0)]
    return command, " ".join(path), argv


def test_the_readme_shows_the_commands_it_should() -> None:
    commands = readme_commands()
    assert len(commands) >= 30
    assert any(c.startswith("ridgeline probe") for c in commands)


def test_every_readme_command_parses_and_names_only_files_that_exist() -> None:
    problems = []
    for line in readme_commands():
        argv = shlex.split(line)[1:]
        if any(word in PLACEHOLDERS for word in argv) or any(p in line for p in PLACEHOLDERS[2:]):
            continue
        command, name, args = _command(argv)
        try:
            command.make_context(name, list(args))
        except Exception as exc:  # a usage error: the line fails as written
            problems.append(f"{line}: {exc}")
            continue
        for word in args:
            if FILE.match(word) and word not in WRITTEN and not (ROOT / word).exists():
                problems.append(f"{line}: names {word}, which does not ship")
    assert not problems, "\n".join(problems)


OFFLINE = (
    "ridgeline allocate ",
    "ridgeline simulate examples/",
    "ridgeline export ",
    "ridgeline probe sim:vision --strategy",
)
"""README lines that need no server and end in seconds: run as written."""
SLOW_OFFLINE = ("ridgeline probe sim:vision --trace", "ridgeline probe sim:llm")
"""README lines that need no server but take minutes: probes in virtual time."""


@pytest.fixture
def here(tmp_path: Path) -> Path:
    """A folder holding the repository's ``examples`` and ``src`` (links): README lines
    run from it, so what they write lands there."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "src").symlink_to(ROOT / "src")
    return tmp_path


@pytest.fixture
def env(here: Path) -> dict[str, str]:
    """The environment README lines run in: their run store in ``here``, and no model zoo
    (``$RIDGELINE_ZOO``) but the one a test asks for."""
    return {
        **os.environ,
        "RIDGELINE_DB": str(here / "runs.sqlite"),
        "RIDGELINE_ZOO": str(here / "zoo"),
    }


ZOO_LINE = "ridgeline models build"


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model zoo the README's ``ridgeline models build`` line builds (into
    ``$RIDGELINE_ZOO``): the exports and ``serve`` read it."""
    out = tmp_path_factory.mktemp("zoo")
    done = subprocess.run(
        [sys.executable, "-m", "ridgeline", *shlex.split(readme_line(ZOO_LINE))[1:]],
        env={**os.environ, "RIDGELINE_ZOO": str(out)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.mark.timeout(300)
def test_the_readmes_offline_commands_run_as_written(
    here: Path, env: dict[str, str], zoo: Path
) -> None:
    """Each exits 0 and prints no ``error:``; the exports read the zoo the README's
    ``ridgeline models build`` line built."""
    env["RIDGELINE_ZOO"] = str(zoo)
    lines = [
        c
        for c in readme_commands()
        if c.startswith(OFFLINE) and not any(p in shlex.split(c) for p in PLACEHOLDERS)
    ]
    assert len(lines) >= 6, lines
    for line in lines:
        argv = shlex.split(line)[1:]
        done = subprocess.run(
            [sys.executable, "-m", "ridgeline", *argv],
            cwd=here,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{line}\n{done.stderr[-2000:]}"
        assert "error:" not in done.stderr, line
        assert "Traceback" not in done.stderr + done.stdout, line


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("prefix", SLOW_OFFLINE)
def test_the_readmes_probes_in_virtual_time_run_as_written(prefix: str, runner: Runner) -> None:
    """Minutes each (the trace's confirmation runs to its 600 s cap of virtual time)."""
    line = readme_line(prefix)
    run = runner.launch(line, shlex.split(line)[1:])
    finished(run, timeout_s=1100)
    assert run.proc.returncode in MEASURED, f"{line}: exit {run.proc.returncode}"


DEFAULT = "ridgeline fake-server --preset default"
LLM = "ridgeline fake-server --preset llm"
TLS = "ridgeline fake-server --token-file "
FAKE_SERVERS_ALONE = (DEFAULT, LLM, "ridgeline fake-server --config examples/models/my_model.yaml")
PIPELINE = "ridgeline serve examples/plans/traffic-cpu.yaml"
SERVER_PORTS = {"--port": 8000, "--grpc-port": 8001}
"""A server's port options and their defaults."""
MEASURED = (ExitCode.OK, ExitCode.INCONCLUSIVE)
"""What a measurement may end in (README, "Exit status"): valid, or INCONCLUSIVE where
this busy host, not the server, was measured; anything else fails the line."""
STREAMED = (r"TTFT from schedule", r"ITL \(every gap\)")
"""What a streaming LLM step prints: TTFT and inter-token latency."""
ANSWERED = (r"│ capacity ", r"│ reason ")
"""What a probe with a budget prints: its answer, and what bound it."""


@dataclass(frozen=True)
class Case:
    """A README line (the one line starting with ``prefix``), the README server line it
    runs against, and what its output must match."""

    prefix: str
    server: str
    promises: tuple[str, ...] = ()


EXCLUDED = {
    "ridgeline run http://10.0.0.5": "a Ray cluster of other machines (its address a placeholder)",
    "ridgeline probe http://SERVER": "a Ray cluster and another machine's server (placeholders)",
    "ridgeline serve --engine ray": "Ray",
    "ridgeline plan ...": "a placeholder for the plan line's arguments",
    "ridgeline simulate examples/plans/traffic-cpu.yaml --rate 20 --calibrate-from RUN": (
        "a placeholder for the run `calibrate` stored"
    ),
    "ridgeline report 7": "a run id of the reader's store",
    "ridgeline analyze 7 8 9": "run ids of the reader's repeated probes",
    'ridgeline probe http://127.0.0.1:8000/v2/models/fake --slo "p99<100ms,errors<0.1%" '
    "--strategy": (
        "no bound on its time: past 30 minutes on this 2-core host (its confirmations near the "
        "fake model's 615 req/s run 600 s each, again while undecided); the --budget 10m line "
        "runs"
    ),
    "ridgeline probe openai+http://127.0.0.1:9000/v1": (
        "an hour or more of load on the example engine (docs/llm.md, 'What a probe costs')"
    ),
    "ridgeline serve plan.yaml": "the 8 A100-80GB GPUs, MIG slices laid out, the plan is for",
    "ridgeline verify plan.yaml": "`ridgeline serve plan.yaml` (8 A100-80GB GPUs)",
}
"""README lines not run, each with why."""


def readme_line(prefix: str) -> str:
    """The one README line that starts with ``prefix``."""
    found = [c for c in readme_commands() if c.startswith(prefix)]
    assert len(found) == 1, f"README lines starting {prefix!r}: {found}"
    return found[0]


def with_free_ports(line: str) -> tuple[list[str], tuple[int, int]]:
    """A server line's words with ``--port 0 --grpc-port 0``, and the HTTP and gRPC ports
    the README gave it."""
    words = shlex.split(line)[1:]
    readme = []
    for option, default in SERVER_PORTS.items():
        if option in words:
            at = words.index(option) + 1
            readme.append(int(words[at]))
            words[at] = "0"
        else:
            readme.append(default)
            words += [option, "0"]
    return words, (readme[0], readme[1])


def moved(line: str, ports: Mapping[int, int]) -> list[str]:
    """A client line's words, each URL's ``127.0.0.1:PORT`` moved to ``ports[PORT]``."""
    return [
        re.sub(r"(?<=//127\.0\.0\.1:)\d+", lambda m: str(ports[int(m.group())]), word)
        for word in shlex.split(line)[1:]
    ]


@dataclass
class Launched:
    """A ``ridgeline`` command under way, its output going to files."""

    line: str
    proc: subprocess.Popen[str]
    out: Path
    err: Path

    def said(self) -> tuple[str, str]:
        """What it has printed so far: stdout, stderr."""
        return self.out.read_text(), self.err.read_text()


@dataclass
class Runner:
    """Runs README lines from ``where`` in ``env``; the ``runner`` fixture kills what is
    still running when its test ends (one a timeout cut short)."""

    where: Path
    env: dict[str, str]
    started: list[subprocess.Popen[str]] = field(default_factory=list)

    def launch(self, line: str, words: list[str]) -> Launched:
        """``ridgeline WORDS``: README ``line``, its ports moved."""
        fd, name = tempfile.mkstemp(dir=self.where, prefix="said-", suffix=".out")
        os.close(fd)
        out, err = Path(name), Path(name).with_suffix(".err")
        with out.open("w") as stdout, err.open("w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ridgeline", *words],
                cwd=self.where,
                env={**self.env, "PYTHONUNBUFFERED": "1"},
                stdout=stdout,
                stderr=stderr,
                text=True,
            )
        self.started.append(proc)
        return Launched(line, proc, out, err)


@pytest.fixture
def runner(here: Path, env: dict[str, str]) -> Iterator[Runner]:
    runs = Runner(here, env)
    yield runs
    for proc in runs.started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def finished(run: Launched, timeout_s: float) -> str:
    """Wait for ``run`` to end; fail unless it ended as its line may, without a
    traceback. Returns its stdout."""
    try:
        run.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        run.proc.kill()
        run.proc.wait()
        pytest.fail(f"{run.line}: still running after {timeout_s:g} s\n{run.said()[1][-2000:]}")
    out, err = run.said()
    assert "Traceback" not in out + err, f"{run.line}\n{err[-3000:]}"
    return out


def judged(case: Case, run: Launched, timeout_s: float) -> list[str]:
    """What is wrong with how ``run`` (of ``case``) ended: its status, its promises."""
    out = finished(run, timeout_s)
    problems = []
    if run.proc.returncode not in MEASURED:
        err = run.said()[1]
        problems.append(f"{run.line}: exit {run.proc.returncode}\n{err[-2000:]}")
    problems += [
        f"{run.line}: prints no {p!r}\n{out[-2000:]}"
        for p in case.promises
        if not re.search(p, out)
    ]
    return problems


@dataclass(frozen=True)
class Served:
    """A README server line, listening: the port each of its README ports got, and its
    pipeline's or model's v2 URL."""

    ports: dict[int, int]
    model_url: str


HTTP_LINE = re.compile(r"v2 HTTP\s+(https?://127\.0\.0\.1:(\d+)/v2/models/(\S+))")
GRPC_LINE = re.compile(r"v2 gRPC\s+(?:grpcs?://)?127\.0\.0\.1:(\d+)")


def listening(server: Launched, where: Path, ready_s: float) -> Served:
    """Wait for the lines saying where ``server`` listens, and send it one request: its
    model's v2 metadata, with the token and CA its line names."""
    deadline = time.monotonic() + ready_s
    while not (HTTP_LINE.search(out := server.said()[0]) and GRPC_LINE.search(out)):
        assert server.proc.poll() is None, f"{server.line}: ended\n{server.said()[1][-2000:]}"
        assert time.monotonic() < deadline, f"{server.line}: not listening after {ready_s:g} s"
        time.sleep(0.05)
    http_line, grpc_line = HTTP_LINE.search(out), GRPC_LINE.search(out)
    assert http_line is not None and grpc_line is not None
    model_url, name = http_line.group(1), http_line.group(3)
    words = shlex.split(server.line)
    headers, context = {}, None
    if "--token-file" in words:
        token = (where / words[words.index("--token-file") + 1]).read_text().strip()
        headers["Authorization"] = f"Bearer {token}"
    if "--tls-cert" in words:
        context = ssl.create_default_context(cafile=where / words[words.index("--tls-cert") + 1])
    request = urllib.request.Request(model_url, headers=headers)
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        assert json.load(response)["name"] == name, server.line
    http, grpc = with_free_ports(server.line)[1]
    return Served({http: int(http_line.group(2)), grpc: int(grpc_line.group(1))}, model_url)


@contextmanager
def serving(
    runner: Runner, prefixes: tuple[str, ...], *, ready_s: float = 120.0
) -> Iterator[list[Served]]:
    """Start the README server lines (all at once), each ``listening``; on exit stop them
    with SIGTERM, as ``timeout`` and systemd do: each must end with status 0 and no
    traceback."""
    servers = []
    try:
        for prefix in prefixes:
            line = readme_line(prefix)
            servers.append(runner.launch(line, with_free_ports(line)[0]))
        yield [listening(server, runner.where, ready_s) for server in servers]
    finally:
        for server in servers:
            if server.proc.poll() is None:
                server.proc.send_signal(signal.SIGTERM)
        stopped = [server.proc.wait(timeout=60) for server in servers]
    for server, status in zip(servers, stopped, strict=True):
        assert status == 0, f"{server.line}: exit {status} on SIGTERM\n{server.said()[1][-2000:]}"
        assert "Traceback" not in "".join(server.said()), server.line


def run_beside(runner: Runner, cases: tuple[Case, ...], timeout_s: float) -> list[str]:
    """Run each case's line at once, each against a server of its own (its README
    server line), and say what went wrong."""
    with serving(runner, tuple(c.server for c in cases)) as servers:
        runs = [
            runner.launch(line, moved(line, s.ports))
            for c, s in zip(cases, servers, strict=True)
            for line in [readme_line(c.prefix)]
        ]
        return [p for c, r in zip(cases, runs, strict=True) for p in judged(c, r, timeout_s)]


def readme_shell(prefixes: tuple[str, ...], where: Path) -> None:
    """Run the README's shell lines that start with ``prefixes`` (not ``ridgeline``)."""
    for line in readme_commands(prefixes):
        subprocess.run(["bash", "-c", line], cwd=where, check=True, capture_output=True, timeout=60)


@pytest.mark.parametrize("prefix", FAKE_SERVERS_ALONE)
def test_the_readmes_fake_servers_start_answer_and_stop(prefix: str, runner: Runner) -> None:
    with serving(runner, (prefix,)) as (served,):
        assert served.model_url.startswith("http://127.0.0.1:")


QUICK = (
    Case(
        "ridgeline run grpc://127.0.0.1:8001/fake",
        DEFAULT,
        promises=(r"server metrics from", r"nv_inference_request_success"),
    ),
    Case(
        "ridgeline run openai+http://127.0.0.1:9000/v1 --prompt-tokens 128", LLM, promises=STREAMED
    ),
    Case(
        "ridgeline run openai+http://127.0.0.1:9000/v1 --prompt-tokens lognormal",
        LLM,
        promises=STREAMED,
    ),
    Case("ridgeline run openai+http://127.0.0.1:9000/v1 --dataset", LLM, promises=STREAMED),
    Case("ridgeline run https://127.0.0.1:8000/v2/models/fake", TLS, promises=(r"\berrors 0\b",)),
)
"""README lines of a 10 s step each, light enough to run side by side on two cores."""


def test_the_readmes_ten_second_steps_run_as_written(runner: Runner) -> None:
    """Side by side, each against its own server; the token and certificate the TLS line
    names are written by the README's own ``echo`` and ``openssl`` lines."""
    readme_shell(("echo s3cret", "openssl req"), runner.where)
    problems = run_beside(runner, QUICK, timeout_s=60)
    assert not problems, "\n".join(problems)


JSON_STEP = "ridgeline run http://127.0.0.1:8000/v2/models/fake --rate 500 "


def test_the_readmes_json_step_with_two_generators_runs_as_written(
    runner: Runner,
) -> None:
    """Alone: its rate is the fake model's most demanding. ``--json`` prints one object
    with the fields the README lists."""
    line = readme_line(JSON_STEP)
    with serving(runner, (DEFAULT,)) as (served,):
        run = runner.launch(line, moved(line, served.ports))
        out = finished(run, timeout_s=60)
    assert run.proc.returncode in MEASURED, f"{line}: exit {run.proc.returncode}"
    step = json.loads(out)
    assert set(step["latency_ms"]) == {"p50", "p90", "p95", "p99", "p999", "max", "mean"}
    for name in (
        "offered_rps",
        "achieved_rps",
        "latency_from_send_ms",
        "lateness_ms",
        "error_rate",
        "drop_rate",
        "valid",
        "invalid_reason",
        "warning",
        "run_id",
    ):
        assert name in step, name
    assert step["processes"] == 2


SLOW_STEPS = (
    Case("ridgeline run http://127.0.0.1:8000/v2/models/fake --rate 200 --duration 30", DEFAULT),
    Case("ridgeline run openai+http://127.0.0.1:9000/v1 --model fake-llm", LLM, promises=STREAMED),
    Case(
        "ridgeline run openai+http://127.0.0.1:9000/v1 --trace",
        LLM,
        promises=(r"scaled\s+to\s+50/s", *STREAMED),
    ),
)
"""README lines of 30 s, 60 s and a trace's replay (some 40 s on this host)."""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_readmes_longer_steps_run_as_written(runner: Runner) -> None:
    """Side by side, each against its own server."""
    problems = run_beside(runner, SLOW_STEPS, timeout_s=240)
    assert not problems, "\n".join(problems)


BUDGET_PROBE = Case(
    'ridgeline probe http://127.0.0.1:8000/v2/models/fake --slo "p99<100ms,errors<0.1%" --budget',
    DEFAULT,
    promises=ANSWERED,
)
"""The fake model's capacity in a 10-minute budget (its unbounded twin is ``EXCLUDED``)."""


LONG = pytest.mark.skipif(
    os.environ.get("RIDGELINE_README_LONG") != "1",
    reason="the README's two long flows (about 30 min of load) run in `make test-readme`",
)
"""The budgeted probe (10 minutes) and the pipeline (profile, plan, serve, an 8-minute
probe, calibrate: about 20): run by ``make test-readme``, not by every ``make test``,
whose slow tests together took 27–32 minutes in CI; both would add as much again."""


@pytest.mark.slow
@LONG
@pytest.mark.timeout(1200)
def test_the_readmes_budgeted_probe_of_the_fake_model_runs_as_written(runner: Runner) -> None:
    """Warm-up, search and confirmations within its 10 minutes, drains past them."""
    problems = run_beside(runner, (BUDGET_PROBE,), timeout_s=1100)
    assert not problems, "\n".join(problems)


BUILT = ("ridgeline profile ", "ridgeline plan examples/")
"""README lines that measure the spec's variants in the zoo and plan from them: no
server, but minutes."""
ON_THE_PIPELINE = (
    Case("ridgeline probe http://127.0.0.1:8000/v2/models/traffic", PIPELINE, promises=ANSWERED),
    Case("ridgeline calibrate ", PIPELINE),
)
"""README lines against the served example plan: an 8-minute budget, and 3.5 minutes."""


@pytest.mark.slow
@LONG
@pytest.mark.timeout(1800)
def test_the_readmes_pipeline_lines_run_as_written(runner: Runner, zoo: Path) -> None:
    """The spec profiled and planned (``profiles.csv``, ``plan.yaml`` and ``mig.yaml``
    written here); then the example plan served, probed and calibrated."""
    runner.env["RIDGELINE_ZOO"] = str(zoo)
    for prefix in BUILT:
        line = readme_line(prefix)
        run = runner.launch(line, shlex.split(line)[1:])
        finished(run, timeout_s=600)
        assert run.proc.returncode == 0, f"{line}: exit {run.proc.returncode}"
    assert all(
        (runner.where / name).is_file() for name in ("profiles.csv", "plan.yaml", "mig.yaml")
    )
    problems = []
    for case in ON_THE_PIPELINE:
        problems += run_beside(runner, (case,), timeout_s=600)
    assert not problems, "\n".join(problems)


def test_every_readme_command_is_run_or_excluded_with_a_reason() -> None:
    """A README line added later is run here, or said why not."""
    cases = (*QUICK, *SLOW_STEPS, BUDGET_PROBE, *ON_THE_PIPELINE)
    run = (
        *OFFLINE,
        *FAKE_SERVERS_ALONE,
        TLS,
        PIPELINE,
        JSON_STEP,
        ZOO_LINE,
        *SLOW_OFFLINE,
        *BUILT,
        *(c.prefix for c in cases),
    )
    for line in readme_commands():
        excluded = [p for p in EXCLUDED if line.startswith(p)]
        if any(w in PLACEHOLDERS for w in shlex.split(line)):  # the OFFLINE test skips it
            assert excluded, f"{line}: a placeholder not in EXCLUDED"
            continue
        held = excluded + [p for p in run if line.startswith(p)]
        assert len(held) == 1, f"{line}: run or excluded by {held}"
