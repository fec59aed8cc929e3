"""``ridgeline run`` and ``ridgeline probe``: one open-loop step, and the capacity search."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast, get_type_hints

import typer

from ridgeline._kind_names import strategy_help
from ridgeline.cli._common import (
    ArrivalOption,
    ClientTokenOption,
    DbOption,
    JsonOption,
    ProcessesOption,
    RateOption,
    TargetRateOption,
    TlsCaOption,
    TokenFileOption,
    TraceOption,
    TraceScaleOption,
    emit,
    err,
    expanded,
    failing,
    from_option,
    opened_store,
    out,
    parse_duration,
)
from ridgeline.cli._exit import probe_code, step_code
from ridgeline.errors import ConfigError

if TYPE_CHECKING:
    from ridgeline.loadgen.schedule import Schedule
    from ridgeline.loadgen.step import StepConfig
    from ridgeline.targets.options import OpenAIApi, TargetOptions
    from ridgeline.workload.llm import LlmWorkload


# --- what run and probe send an endpoint, and how: one declaration for both -----------

_SIZE = "N, uniform:LOW-HIGH or lognormal:mean=M,cv=C[,min=LOW][,max=HIGH]"
PromptTokensOption = Annotated[
    str | None,
    typer.Option(
        help=f"prompt tokens per request: {_SIZE}; each prompt is made to exactly that "
        "many tokens under --tokenizer, unique per request (default: the trace's, else "
        "one word)"
    ),
]
OutputTokensOption = Annotated[
    str | None,
    typer.Option(
        help=f"output tokens per request (max_tokens): {_SIZE}; default: the dataset's "
        "or trace's, else 16"
    ),
]
DatasetOption = Annotated[
    str | None,
    typer.Option(
        help="prompts from a file: JSONL (prompt, output_tokens), ShareGPT JSON, a trace "
        "CSV (its token counts), or 'azure' for the bundled Azure LLM trace's"
    ),
]
DatasetFormatOption = Annotated[
    str, typer.Option(help="the dataset's format: auto | jsonl | sharegpt | trace")
]
MultiTurnOption = Annotated[
    bool,
    typer.Option(
        help="send every turn of each dataset conversation, turn k carrying the earlier "
        "turns as history (default: first turns only)",
        show_default=False,
    ),
]
SharedPrefixOption = Annotated[
    int,
    typer.Option(min=0, help="tokens every made prompt opens with (0: prompts share nothing)"),
]
TokenizerOption = Annotated[
    str | None,
    typer.Option(
        help="a tokenizer.json, a Hugging Face tokenizer directory holding one, gpt2 or "
        "bytes; default: GPT-2, shipped offline (bytes when not installed)"
    ),
]
IgnoreEosOption = Annotated[
    bool,
    typer.Option(
        help="ask the server to generate every output token asked (ignore_eos: true); "
        "--no-ignore-eos lets it stop at its end-of-sequence token"
    ),
]
OpenAIApiOption = Annotated[
    str, typer.Option(help="OpenAI targets: completions | chat (chat/completions)")
]


ModelOption = Annotated[str | None, typer.Option(help="model name (OpenAI targets)")]
HeaderOption = Annotated[list[str], typer.Option(help="extra header 'Name: value'")]


_STEP_FLAGS = {
    "window_s": "--window",
    "processes": "--processes",
    "workers": "--workers",
    "metrics_url": "--metrics-url",
    "timeout_s": "--timeout",
    "max_outstanding": "--max-outstanding",
}
"""The options of ``run`` and ``probe`` by the setting each sets, for their errors."""
_PROBE_FLAGS = {
    **_STEP_FLAGS,
    "slo": "--slo",
    "min_rate": "--min-rate",
    "max_rate": "--max-rate",
    "start_rate": "--start-rate",
    "rate": "--rate",
    "step_duration_s": "--step-duration",
    "precision": "--precision",
    "warmup_config.rate": "--warmup-rate",
    "warmup_config.requests": "--warmup-requests",
    "confirm_margin": "--confirm-margin",
    "confirm_requests": "--confirm-requests",
    "confidence": "--confidence",
    "max_step_s": "--max-step-s",
    "seed": "--seed",
}


@dataclasses.dataclass(frozen=True)
class ClientOptions:
    """What ``run`` and ``probe`` send an endpoint and how they reach it: each field is
    one option of both commands (``--header`` is ``run``'s alone), declared here once."""

    model: ModelOption = None
    prompt_tokens: PromptTokensOption = None
    output_tokens: OutputTokensOption = None
    dataset: DatasetOption = None
    dataset_format: DatasetFormatOption = "auto"
    multi_turn: MultiTurnOption = False
    shared_prefix: SharedPrefixOption = 0
    tokenizer: TokenizerOption = None
    ignore_eos: IgnoreEosOption = True
    openai_api: OpenAIApiOption = "completions"
    header: HeaderOption = dataclasses.field(default_factory=list)
    token: ClientTokenOption = None
    token_file: TokenFileOption = None
    tls_ca: TlsCaOption = None

    def workload(self) -> LlmWorkload:
        """The prompts and output lengths the options ask for, checked now, so that a bad
        file, spec or API is named before any request is sent."""
        from ridgeline.errors import UnknownKindError
        from ridgeline.workload.datasets import FORMATS
        from ridgeline.workload.llm import LlmWorkload
        from ridgeline.workload.payloads import parse_size

        if self.openai_api not in ("completions", "chat"):
            raise UnknownKindError("OpenAI API", self.openai_api, ("completions", "chat"))
        if self.dataset_format not in FORMATS:
            raise UnknownKindError("dataset format", self.dataset_format, FORMATS)
        prompt, output = self.prompt_tokens, self.output_tokens
        workload = LlmWorkload(
            prompt_tokens=None if prompt is None else parse_size(prompt, "prompt_tokens"),
            output_tokens=None if output is None else parse_size(output, "output_tokens"),
            dataset=self.dataset,
            dataset_format=self.dataset_format,
            multi_turn=self.multi_turn,
            shared_prefix=self.shared_prefix,
            tokenizer=self.tokenizer,
        )
        workload.check()  # the tokenizer counts output tokens even when it makes no prompt
        return workload  # inactive, it still makes a trace's prompts: unique, exact in tokens

    def target_options(self) -> TargetOptions:
        """What ``make_target`` is given; a bad header, token file or CA bundle is named
        now, not in a step."""
        from ridgeline.targets.options import TargetOptions
        from ridgeline.v2.security import client_context, resolve_token

        headers: dict[str, str] = {}
        for h in self.header:
            if ":" not in h:
                raise typer.BadParameter(f"--header {h!r} must look like 'Name: value'")
            k, v = h.split(":", 1)
            headers[k.strip()] = v.strip()
        token = resolve_token(self.token, self.token_file) or None
        if self.tls_ca is not None:
            client_context(self.tls_ca)
        return TargetOptions(
            model=self.model or None,
            headers=headers,
            token=token,
            ca_file=self.tls_ca,
            tokenizer=self.tokenizer,
            ignore_eos=self.ignore_eos,
            openai_api=cast("OpenAIApi", self.openai_api),  # checked by workload()
        )


def _client_options(*, header: bool) -> dict[str, tuple[Any, Any]]:
    """``ClientOptions``' fields as options (``--header`` only when ``header``)."""
    hints = get_type_hints(ClientOptions, include_extras=True)
    fields = [f for f in dataclasses.fields(ClientOptions) if header or f.name != "header"]
    return {f.name: (hints[f.name], _default(f)) for f in fields}


def _default(f: dataclasses.Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


WorkersOption = Annotated[
    str | None,
    typer.Option(
        help="send from generator actors on a Ray cluster, spread over its nodes: "
        "ray://HOST:PORT (a Ray client address) or ray:auto (the cluster this machine "
        "joined); --processes N actors (default: one per alive node); needs "
        "`pip install 'ridgeline[ray]'` on every node"
    ),
]
LatenessOption = Annotated[
    float | None,
    typer.Option(
        help="a fixed bound on the p99 send lateness, ms; default: a step is invalid when "
        "its lateness moved its p99 latency by more than 5% of the SLO's bound (of its own "
        "p99 for `run`), and at least 1 ms"
    ),
]
WindowOption = Annotated[float, typer.Option(help="telemetry window width, s")]
MetricsUrlOption = Annotated[
    str | None,
    typer.Option(
        help="Prometheus endpoint of the server (batch sizes, queue, GPU), scraped beside the load"
    ),
]


@expanded("client", _client_options(header=True), ClientOptions)
def run(
    target: Annotated[
        str,
        typer.Argument(
            help="endpoint URL, e.g. http://127.0.0.1:8000/v2/"
            "models/NAME, grpc://127.0.0.1:8001/NAME, "
            "openai+http://127.0.0.1:8000/v1, null://"
        ),
    ],
    rate: RateOption = None,
    duration: Annotated[float, typer.Option(help="step length, seconds")] = 10.0,
    arrival: ArrivalOption = "poisson",
    trace: TraceOption = None,
    target_rate: TargetRateOption = None,
    trace_start: Annotated[float, typer.Option(help="start of the trace window, s")] = 0.0,
    seed: Annotated[int, typer.Option(min=0, help="seed of the arrival schedule")] = 0,
    processes: ProcessesOption = 1,
    workers: WorkersOption = None,
    timeout: Annotated[float, typer.Option(help="per-request timeout, s")] = 30.0,
    max_outstanding: Annotated[int, typer.Option(help="requests in flight at most")] = 10_000,
    lateness_bound_ms: LatenessOption = None,
    window: WindowOption = 1.0,
    metrics_url: MetricsUrlOption = None,
    *,
    client: ClientOptions,
    store_requests: Annotated[
        bool, typer.Option(help="store one row per request (off by default)", show_default=False)
    ] = False,
    slo: Annotated[
        str | None,
        typer.Option(
            help="count goodput under this SLO: the successful requests meeting every "
            "per-request bound, e.g. 'ttft_p99<200ms,itl_p99<50ms' (terms as for probe); "
            "the step is not judged by it"
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run one open-loop step against TARGET and print its result (a --trace time-scaled
    to its --target-rate, keeping its relative gaps). Exit status 0 for a valid step, 3
    for one marked INVALID (the generator fell behind), 2 for bad input or an endpoint
    failing its connect check, 130 when interrupted."""
    from ridgeline.health.slo import parse_slo
    from ridgeline.loadgen.replayer import Progress, ReplayConfig
    from ridgeline.loadgen.schedule import shaped
    from ridgeline.loadgen.step import run_step
    from ridgeline.report.terminal import live_progress, step_table
    from ridgeline.telemetry.summary import with_goodput

    with failing(values=True, flags={**_STEP_FLAGS, "duration_s": "--duration"}):
        with from_option("--slo"):
            policy = parse_slo(slo) if slo is not None else None
        workload = client.workload()
        schedule = _schedule(rate, duration, arrival, trace, target_rate, trace_start, seed)
        schedule = shaped(schedule, workload, seed)
        cfg = _step(
            processes,
            workers,
            window,
            metrics_url,
            lateness_bound_ms,
            store_requests=store_requests,
            replay=ReplayConfig(timeout_s=timeout, max_outstanding=max_outstanding),
        )
        progress = Progress()
        started = (
            f"run: sending {len(schedule.times):,} requests over {schedule.duration_s:g} s "
            f"to {target}; the table follows"
        )
        live = live_progress(progress, err, err.is_terminal, started)
        with opened_store(db) as store, live:
            result = run_step(
                target,
                schedule,
                cfg,
                store=store,
                target_options=client.target_options(),
                progress=progress,
            )
    if policy is not None:
        result.summary = with_goodput(result.summary, result.records, policy.latency)
    if as_json:
        emit(result.summary.model_dump_json(indent=2))
    else:
        out.print(step_table(result.summary, f"{target} — {schedule.description}"))
    raise typer.Exit(step_code(result.summary))


def _step(
    processes: int,
    workers: str | None,
    window: float,
    metrics_url: str | None,
    lateness_bound_ms: float | None,
    **more: Any,
) -> StepConfig:
    """How each step of ``run`` and ``probe`` is sent and judged, from their options."""
    from ridgeline.loadgen.step import StepConfig
    from ridgeline.loadgen.validity import ValidityConfig

    bound = {} if lateness_bound_ms is None else {"lateness_p99_bound_s": lateness_bound_ms / 1e3}
    return StepConfig(
        processes=processes,
        workers=workers,
        window_s=window,
        metrics_url=metrics_url,
        validity=ValidityConfig(**bound),
        **more,
    )


def _schedule(
    rate: float | None,
    duration: float,
    arrival: str,
    trace: Path | None,
    target_rate: float | None,
    trace_start: float,
    seed: int,
) -> Schedule:
    from ridgeline.loadgen.schedule import build_schedule

    if trace is None and target_rate is not None:
        raise ConfigError("--target-rate time-scales a trace: give --trace too, or use --rate")
    return build_schedule(
        arrival,
        rate=rate,
        duration_s=duration,
        seed=seed,
        trace=trace,
        target_rate=target_rate,
        trace_scale="window",
        trace_start_s=trace_start,
    )


@expanded("client", _client_options(header=False), ClientOptions)
def probe(
    target: Annotated[
        str,
        typer.Argument(
            help="endpoint URL (as for `run`), or sim:PRESET / sim:FILE.yaml for a simulated "
            "server in virtual time (presets: recommendation, ranking, vision, nlp, "
            "vision-warmup, llm)"
        ),
    ],
    slo: Annotated[
        str | None,
        typer.Option(
            help="e.g. 'p99<100ms,errors<0.1%', or for a streaming LLM endpoint "
            "'ttft_p99<200ms,itl_p99<50ms,errors<1%' (ttft_, itl_, tpot_, e2e_ before any "
            "of p50 p90 p95 p99 p99.9 max mean; docs/llm.md); default: the sim preset's, "
            "else 'p99<100ms,errors<1%'"
        ),
    ] = None,
    strategy: Annotated[str, typer.Option(help=strategy_help())] = "adaptive",
    min_rate: Annotated[float, typer.Option(help="lowest rate to try, req/s")] = 1.0,
    max_rate: Annotated[float | None, typer.Option(help="highest rate to try")] = None,
    start_rate: Annotated[float | None, typer.Option(help="first rate (default min-rate)")] = None,
    rate: Annotated[float | None, typer.Option(help="the rate, for --strategy stability")] = None,
    step_duration: Annotated[float, typer.Option(help="seconds per step")] = 10.0,
    precision: Annotated[float, typer.Option(help="relative width of the answer")] = 0.02,
    warmup: Annotated[bool, typer.Option(help="warmup phase and steady-state exclusion")] = True,
    warmup_rate: Annotated[
        float | None, typer.Option(help="warmup rate, req/s (default: the first step's)")
    ] = None,
    warmup_requests: Annotated[
        int | None,
        typer.Option(help="warm until this many requests were sent, and steady (warmup by work)"),
    ] = None,
    confirm: Annotated[bool, typer.Option(help="a stability run at the estimate")] = True,
    confirm_margin: Annotated[
        float,
        typer.Option(
            help="re-run a confirmation failing within this of the SLO (besides the band "
            "its own noise sets); the majority of 3 decides"
        ),
    ] = 0.0,
    confirm_requests: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="a confirmation lasts for this many requests (default: 100 beyond the "
            "SLO's percentile, 10,000 for a p99): fewer finish sooner, less surely",
        ),
    ] = None,
    confidence: Annotated[
        float,
        typer.Option(
            help="how sure a verdict must be: sets the requests a step needs to decide "
            "(299 for a p99 at 0.95) and each step's percentile interval"
        ),
    ] = 0.95,
    max_step_s: Annotated[
        float,
        typer.Option(help="no step lasts longer, s (unless its percentile needs more)"),
    ] = 600.0,
    budget: Annotated[
        str | None,
        typer.Option(
            help="the load the whole probe may spend, e.g. 10m, 90s, 1h (warm-up, search "
            "and confirmation; each step's drain counted): the best confirmed answer "
            "reachable in it, and what bound it; default: none"
        ),
    ] = None,
    sequential: Annotated[
        bool | None,
        typer.Option(
            "--sequential/--no-sequential",
            help="end a confirmation as soon as its outcome is decided (looks of a minute "
            "and more; default: on with --budget)",
        ),
    ] = None,
    arrival: ArrivalOption = "poisson",
    trace: Annotated[
        Path | None,
        typer.Option(help="replay this trace in every step, brought to the step's rate"),
    ] = None,
    trace_scale: TraceScaleOption = "overlay",
    processes: ProcessesOption = 1,
    workers: WorkersOption = None,
    window: WindowOption = 1.0,
    metrics_url: MetricsUrlOption = None,
    gpu_metrics_url: Annotated[
        str | None,
        typer.Option(
            help="a DCGM exporter or Triton metrics endpoint, when NVML cannot see the GPU "
            "(a remote server)"
        ),
    ] = None,
    lateness_bound_ms: LatenessOption = None,
    *,
    client: ClientOptions,
    seed: Annotated[int, typer.Option(min=0, help="seed of the schedules")] = 0,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Find the maximum sustainable throughput of TARGET under an SLO. Exit status 0 for
    a valid estimate, 1 when no rate held the SLO, 2 for bad input or a failed probe, 3
    when the estimate is not valid (the steps measured the host), 130 when interrupted."""
    from ridgeline.loadgen.replayer import Progress
    from ridgeline.probe.api import default_slo, make_driver, run_probe
    from ridgeline.probe.drivers import NetworkDriver
    from ridgeline.probe.orchestrator import ProbeConfig
    from ridgeline.report.terminal import live_progress, probe_line, probe_start, probe_table
    from ridgeline.telemetry.gpu import detect_gpu_monitor

    options: dict[str, Any] = {
        "min_rate": min_rate,
        "step_duration_s": step_duration,
        "precision": precision,
    }
    if max_rate is not None:
        options["max_rate"] = max_rate
    if start_rate is not None:
        options["start_rate"] = start_rate
    if rate is not None:
        options["rate"] = rate
    with failing(values=True, flags=_PROBE_FLAGS):
        cfg = ProbeConfig.model_validate(
            {
                "slo": slo if slo is not None else default_slo(target) or "p99<100ms,errors<1%",
                "strategy": strategy,
                "strategy_options": options,
                "warmup": warmup,
                "warmup_config": {"rate": warmup_rate, "requests": warmup_requests},
                "confirm": confirm,
                "confirm_margin": confirm_margin,
                "confirm_requests": confirm_requests,
                "confidence": confidence,
                "max_step_s": max_step_s,
                "budget_s": None if budget is None else parse_duration(budget, "--budget"),
                "sequential": sequential,
                "seed": seed,
            }
        )
        step = _step(processes, workers, window, metrics_url, lateness_bound_ms)
        workload = client.workload()
        driver = make_driver(
            target,
            step=step,
            arrival=arrival,
            trace=trace,
            trace_scale=trace_scale,
            target_options=client.target_options(),
            workload=workload,
        )
        progress = Progress()
        live = err.is_terminal and not as_json
        if live and isinstance(driver, NetworkDriver):
            driver.progress = progress  # a status line counts the step in flight
        else:
            live = False  # a simulated step ends in milliseconds
        with opened_store(db) as store, live_progress(progress, err, live):
            gpu = None if target.startswith("sim:") else detect_gpu_monitor(gpu_metrics_url)
            if gpu is not None and not as_json:
                err.print(f"GPU: {gpu.describe()}", markup=False, highlight=False)
            result = run_probe(
                driver,
                cfg,
                store=store,
                gpu=gpu,
                on_step=None if as_json else probe_line(err),
                on_start=None if as_json else probe_start(err),
            )
    if as_json:
        emit(result.model_dump_json(indent=2))
    else:
        out.print(probe_table(result))
        if metrics_url is not None and result.run_id is not None:
            out.print(
                f"the server's metrics, step by step: ridgeline runs show {result.run_id}",
                markup=False,
                highlight=False,
            )
    raise typer.Exit(probe_code(result))
