"""Every bad input the hardening review found, through the real command line: one line,
``error: …`` naming what was wrong, exit status 2, and never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ridgeline import __version__
from ridgeline.cli import app
from ridgeline.errors import PlanError
from ridgeline.pipeline.plan import load_plan
from ridgeline.serve.loading import SHARED_CORE_LIMIT, check_cores

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "specs" / "traffic-cpu.yaml"
PROFILES = ROOT / "examples" / "profiles" / "traffic-cpu.csv"
PLAN_FILE = ROOT / "examples" / "plans" / "traffic-cpu.yaml"
HEADER = PROFILES.read_text().splitlines()[0]
ROW = "yolov5n,cpu,cpu1,1,7.6,131.0,measured"
RUN = ["run", "null://", "--rate", "5", "--duration", "0.1"]
PLAN = ["plan", str(SPEC), "--profiles", str(PROFILES), "--gpus", "3cpu", "--no-check"]

# A plan the server could start if the host had the cores (a synthetic task: no zoo).
ONE_TASK = """\
name: big
slo_ms: 1000
tasks:
  a:
    variant: a
    synthetic: {{base_ms: 1, per_item_ms: 0}}
    segment: {{kind: cpu, cores: {cores}}}
    instances: {instances}
    latency_budget_ms: 500
"""

Files = Callable[[str, str | bytes], Path]

# 414 bytes standing for 9^9 strings through nested aliases (fault 6 of issue 33): the
# plan, spec and verify commands took minutes and gigabytes to validate it
BOMB = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.fixture
def files(tmp_path: Path) -> Files:
    def write(name: str, content: str | bytes) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return path

    return write


def spec_with(old: str, new: str) -> str:
    text = SPEC.read_text()
    assert old in text
    return text.replace(old, new)


# Each case: its arguments (built from the fixture's files) and what the line must say.
CASES: dict[str, tuple[Callable[[Files], list[str]], str]] = {
    "trace missing": (
        lambda f: [*RUN, "--trace", str(f("x", "").parent / "no.csv")],
        "cannot read trace",
    ),
    "trace a directory": (lambda f: [*RUN, "--trace", str(f("d/x", "").parent)], "Is a directory"),
    "trace field over 128 KiB": (
        lambda f: [*RUN, "--trace", str(f("big.csv", "timestamp,n\n0," + "1" * 140_000 + "\n"))],
        "line 2",
    ),
    "trace JSONL 100k deep": (
        lambda f: [
            *RUN,
            "--trace",
            str(f("deep.jsonl", '{"timestamp": ' + "[" * 100_000 + "]" * 100_000 + "}\n")),
        ],
        "nested too deep",
    ),
    "trace not UTF-8": (
        lambda f: [*RUN, "--trace", str(f("latin.csv", b"timestamp\n0\n1\xe9\n"))],
        "line 3, column 2: byte 0xe9 is not UTF-8",
    ),
    "--target-rate 0": (
        lambda f: [
            *RUN,
            "--trace",
            str(f("t.csv", "timestamp\n0\n0.5\n1\n")),
            "--target-rate",
            "0",
        ],
        "target rate must be finite and > 0",
    ),
    "--target-rate without a trace": (lambda f: [*RUN, "--target-rate", "5"], "give --trace"),
    "--timeout 0": (
        lambda f: [*RUN, "--timeout", "0"],
        "--timeout: Input should be greater than 0",
    ),
    "--window -1": (lambda f: [*RUN, "--window", "-1"], "--window: Input should be greater than 0"),
    "--precision 0": (
        lambda f: ["probe", "sim:vision", "--precision", "0"],
        "--precision: search strategy 'adaptive' field 'precision': Input should be greater "
        "than 0, got 0.0",
    ),
    '--slo ""': (lambda f: ["probe", "sim:vision", "--slo", ""], "SLO '': cannot read part 1"),
    "--slo error<1%": (
        lambda f: ["probe", "sim:vision", "--slo", "p99<100ms,error<1%"],
        "did you mean 'errors'? e.g. 'errors<1%'",
    ),
    "--slo p99<1e400ms": (
        lambda f: ["probe", "sim:vision", "--slo", "p99<1e400ms"],
        "must be a finite bound above 0",
    ),
    "target URL with a broken IPv6 host": (
        lambda f: ["run", "http://[::1/v2/models/fake", "--rate", "5", "--duration", "0.1"],
        "cannot be read (Invalid IPv6 URL)",
    ),
    # usage errors (issue 33, fault 16): click printed a five-line box with no `error:`
    "run without its target": (lambda f: ["run"], "Missing argument 'target'."),
    "--rate abc": (
        lambda f: ["run", "null://", "--rate", "abc"],
        "Invalid value for '--rate': Input should be a valid number",
    ),
    "an option no command has": (
        lambda f: ["run", "null://", "--nope"],
        "No such option: --nope",
    ),
    "a command that does not exist": (lambda f: ["nope"], "No such command 'nope'."),
    "a group's command that does not exist": (
        lambda f: ["runs", "nope"],
        "runs --help')",
    ),
    # values taken silently (issue 33, fault 18)
    "--metrics-url ftp://": (
        lambda f: [*RUN, "--metrics-url", "ftp://127.0.0.1/metrics"],
        "--metrics-url must be an http:// or https:// URL with a host",
    ),
    "runs list --limit -1": (
        lambda f: ["runs", "list", "--limit", "-1", "--db", str(f("r/x", "").parent / "r.sqlite")],
        "Invalid value for '--limit'",
    ),
    "analyze a run id of 2^70": (
        lambda f: ["analyze", str(2**70), "--db", str(f("r/x", "").parent / "runs.sqlite")],
        "run ids are 1 to 9223372036854775807",
    ),
    "runs show a run id of 2^70": (
        lambda f: ["runs", "show", str(2**70), "--db", str(f("r/x", "").parent / "runs.sqlite")],
        "run ids are 1 to 9223372036854775807",
    ),
    "export ray-serve --out a file": (
        lambda f: ["export", "ray-serve", str(PLAN_FILE), "--out", str(f("afile", "x"))],
        "is a file; give a directory to write into",
    ),
    "spec an alias bomb": (
        lambda f: ["plan", str(f("bomb.yaml", BOMB)), "--profiles", str(PROFILES)],
        "expands to more than 1,000,000 values through its aliases",
    ),
    "simulate a plan that is an alias bomb": (
        lambda f: ["simulate", str(f("bomb.yaml", BOMB))],
        "expands to more than 1,000,000 values through its aliases",
    ),
    "verify a plan that is an alias bomb": (
        lambda f: ["verify", str(f("bomb.yaml", BOMB)), "http://127.0.0.1:9/v2/models/x"],
        "expands to more than 1,000,000 values through its aliases",
    ),
    "spec YAML nested 5,000 deep": (
        lambda f: ["plan", str(f("deep.yaml", "a: " + "[" * 5000 + "]" * 5000)), *PLAN[2:]],
        "nested too deep",
    ),
    "spec not UTF-8": (
        lambda f: ["plan", str(f("latin.yaml", b"name: caf\xe9\n")), *PLAN[2:]],
        "pipeline spec",
    ),
    "spec slo_ms: .inf": (
        lambda f: ["plan", str(f("inf.yaml", spec_with("slo_ms: 400", "slo_ms: .inf"))), *PLAN[2:]],
        "slo_ms: Input should be a finite number",
    ),
    "plan not UTF-8": (lambda f: ["serve", str(f("p.yaml", b"name: caf\xe9\n"))], "plan"),
    "plan batch_size: true": (
        lambda f: [
            "serve",
            str(f("p.yaml", ONE_TASK.format(cores=1, instances=1) + "    batch_size: true\n")),
        ],
        "batch_size: Input should be a valid integer, got True",
    ),
    "fake-server config not UTF-8": (
        lambda f: ["fake-server", "--config", str(f("c.yaml", b"name: caf\xe9\n"))],
        "fake-model config",
    ),
    "fake-server config nested 5,000 deep": (
        lambda f: ["fake-server", "--config", str(f("c.yaml", "a: " + "[" * 5000 + "]" * 5000))],
        "nested too deep",
    ),
    "profiles not UTF-8": (
        lambda f: [
            *PLAN[:3],
            str(f("p.csv", f"{HEADER}\n{ROW}\xe9\n".encode("latin-1"))),
            *PLAN[4:],
        ],
        "profile table",
    ),
    "profiles field over 128 KiB": (
        lambda f: [
            *PLAN[:3],
            str(f("p.csv", f"{HEADER}\n{ROW}," + "1" * 140_000 + "\n")),
            *PLAN[4:],
        ],
        "line 2: not readable as CSV",
    ),
    "profiles segment share nan": (
        lambda f: [
            *PLAN[:3],
            str(
                f("p.csv", f"{HEADER}\n{ROW}\nyolov5n,A100-80GB,1g.10gb@nan,1,7.6,131.0,measured\n")
            ),
            *PLAN[4:],
        ],
        "line 3: segment '1g.10gb@nan': the MPS share after '@' must be a fraction in (0, 1]",
    ),
    "profiles segment share 1/0": (
        lambda f: [
            *PLAN[:3],
            str(
                f("p.csv", f"{HEADER}\n{ROW}\nyolov5n,A100-80GB,1g.10gb@1/0,1,7.6,131.0,measured\n")
            ),
            *PLAN[4:],
        ],
        "got '1/0'",
    ),
    "profiles throughput_rps inf": (
        lambda f: [
            *PLAN[:3],
            str(f("p.csv", f"{HEADER}\n{ROW.replace('131.0', 'inf')}\n")),
            *PLAN[4:],
        ],
        "line 2: throughput_rps must be a finite number above 0, got inf",
    ),
    "profiles latency_ms NaN": (
        lambda f: [
            *PLAN[:3],
            str(f("p.csv", f"{HEADER}\n{ROW.replace('7.6', 'nan')}\n")),
            *PLAN[4:],
        ],
        "latency_ms must be a finite number above 0, got nan",
    ),
    "artifact not ONNX": (
        lambda f: [
            "profile",
            str(
                f(
                    "s/spec.yaml",
                    spec_with(
                        "{name: yolov5n, accuracy: 28.0}",
                        "{name: yolov5n, accuracy: 28.0, artifact: m.onnx}",
                    ),
                )
            ),
            "--out",
            str(f("s/m.onnx", "not a model").parent / "out.csv"),
            "--seconds",
            "0.1",
        ],
        "is not an ONNX model",
    ),
    **{
        f"--demand {d}": (
            (lambda f, d=d: [*PLAN, "--demand", d]),
            "a demand must be a finite number above 0",
        )
        for d in ("0", "nan", "inf", "-1")
    },
    "--out a directory": (lambda f: [*PLAN, "--out", str(f("d/x", "").parent)], "is a directory"),
    "--out in a missing folder": (
        lambda f: [*PLAN, "--out", str(f("x", "").parent / "no" / "such" / "p.yaml")],
        "does not exist",
    ),
    "a plan wider than the host": (
        lambda f: [
            "serve",
            str(f("p.yaml", ONE_TASK.format(cores=1000, instances=1))),
            "--port",
            "0",
            "--grpc-port",
            "0",
        ],
        "1000 cores per instance",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_input_is_one_line_and_exit_2(case: str, files: Files, tmp_path: Path) -> None:
    make, says = CASES[case]
    args = make(files)
    if args[0] in ("run", "probe"):
        args += ["--db", str(tmp_path / "runs.sqlite")]
    result = CliRunner().invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(errors) == 1 and errors[0].startswith("error: "), result.stderr
    assert says in errors[0]
    assert "Traceback" not in result.output


def test_rich_markup_in_a_message_prints_literally(tmp_path: Path) -> None:
    """The issue's own command, as a subprocess: the message holds ``[/versions/V]``, which
    rich read as a closing tag and crashed on."""
    command = ["run", "grpc://127.0.0.1:1", "--rate", "5", "--duration", "1"]
    res = subprocess.run(
        [sys.executable, "-m", "ridgeline", *command, "--db", str(tmp_path / "runs.sqlite")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [
        "error: gRPC target URL 'grpc://127.0.0.1:1' names no model; write "
        "grpc://HOST:PORT/MODEL[/versions/V] (or grpc://HOST:PORT/v2/models/MODEL)"
    ]


def test_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"ridgeline {__version__}"


def test_a_plan_needing_more_cores_than_the_host_shares_is_refused(tmp_path: Path) -> None:
    """Instances that would start without end on a small host: refused before any worker
    starts, with the count asked and the cores there are."""
    host = [0, 1]
    many = tmp_path / "many.yaml"
    many.write_text(ONE_TASK.format(cores=1, instances=SHARED_CORE_LIMIT * len(host) + 1))
    with pytest.raises(PlanError, match=r"asks for 9 CPU cores .* may use 2 \(cores \[0, 1\]\)"):
        check_cores(load_plan(many), host)
    fits = tmp_path / "fits.yaml"  # 3 one-core tasks on 2 cores: shared, as documented
    fits.write_text(ONE_TASK.format(cores=1, instances=SHARED_CORE_LIMIT * len(host)))
    check_cores(load_plan(fits), host)


def test_error_and_warning_lines_print_markup_literally() -> None:
    from rich.console import Console

    from ridgeline.cli._common import error_line
    from ridgeline.errors import ConfigError

    console = Console(record=True, width=40)
    message = "grpc://HOST:PORT/MODEL[/versions/V] and [red]not red[/]\nsecond line"
    console.print(error_line(ConfigError(message)), soft_wrap=True)
    assert console.export_text() == (
        "error: grpc://HOST:PORT/MODEL[/versions/V] and [red]not red[/] second line\n"
    )


def test_a_grpc_port_taken_is_one_line_without_grpcs_own_log(tmp_path: Path) -> None:
    """Issue 33, fault 15: gRPC's C core wrote its own ``E1206 … add_port.cc] Failed to
    add port`` line beside the command's one ``error:`` line."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
        command = ["fake-server", "--port", "0", "--grpc-port", str(port)]
        res = subprocess.run(
            [sys.executable, "-m", "ridgeline", *command],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"error: cannot bind gRPC to 127.0.0.1:{port}; is the port taken? Pick another or 0"
    ]


def test_serve_help_names_the_ray_extra_at_80_columns() -> None:
    """Issue 33, fault 25: ``serve --help`` printed ``pip install 'ridgeline'``, the
    ``[ray]`` extra read as markup."""
    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    assert "pip install 'ridgeline[ray]'" in result.output


def test_runs_list_folds_a_long_url_at_80_columns_never_cuts_it(tmp_path: Path) -> None:
    """Issue 33, fault 25: at 80 columns ``runs list`` cut URLs with an ellipsis."""
    from ridgeline.telemetry.store import RunStore

    url = "http://127.0.0.1:18931/v2/models/a-rather-long-model-name/versions/12"
    db = tmp_path / "runs.sqlite"
    with RunStore(db) as store:
        store.finish_run(store.create_run("run", url, {}), "complete")
    result = CliRunner().invoke(app, ["runs", "list", "--db", str(db)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    rows = [line.split("│") for line in result.output.splitlines() if line.startswith("│")]
    assert max(map(len, result.output.splitlines())) <= 80
    assert "".join(cells[3].strip() for cells in rows) == url
