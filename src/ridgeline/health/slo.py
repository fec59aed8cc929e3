"""The SLO a probe judges against, and its one-line text form.

``parse_slo("p99<100ms,errors<0.1%")`` reads the form a user types; ``format_slo`` writes
it back (``parse_slo(format_slo(p)) == p`` for every policy whose non-textual settings
are the defaults). Parts, separated by commas, in any order:

- ``p50<20ms``, ``p99.9<1s``, ``max<250us``, ``mean<=40ms`` — a percentile of the
  end-to-end latency (p50, p90, p95, p99, p99.9 = p999, max, mean) under a bound in us,
  ms or s; ``e2e_p99<1s`` is the same statistic spelt out;
- ``ttft_p99<200ms``, ``itl_p99<50ms``, ``tpot_p99<40ms`` — the same percentiles of a
  token-level latency of a streamed answer (docs/llm.md): time to first token (from the
  scheduled send), inter-token latency (every gap between content chunks, pooled over
  requests: vLLM's ITL) and time per output token (per request, (e2e − ttft) /
  (output tokens − 1));
- ``send_p99<50ms`` — the same for every other row of ``health.metrics.METRICS``, the
  row's name its prefix (``send``: latency from the actual send);
- ``errors<0.1%`` or ``errors<0.001`` — the largest tolerated error rate;
- ``attainment>95%`` or ``attainment>0.95`` — the least achieved/offered throughput.

The metrics a bound may name are the rows of ``health.metrics.METRICS``; a policy is
written back as this text wherever it is stored (``SLOText``: a config field that reads
the text, or a policy, and serialises as the text).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal, Self, get_args

import numpy as np
from numpy.typing import NDArray
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    model_validator,
)

from ridgeline._fields import Positive, Share
from ridgeline._repeats import repeated
from ridgeline.errors import ConfigError
from ridgeline.health.metrics import DEFAULT
from ridgeline.health.metrics import METRICS as _TABLE
from ridgeline.telemetry.records import Records

Percentile = Literal["p50", "p90", "p95", "p99", "p999", "max", "mean"]
PERCENTILES: tuple[Percentile, ...] = get_args(Percentile)
"""``telemetry.histogram.STATISTICS``, as a type."""
METRICS: tuple[str, ...] = tuple(_TABLE)
"""The metrics a bound may name: the rows of ``health.metrics.METRICS``."""


def _known_metric(name: str) -> str:
    if name not in _TABLE:
        raise ValueError(f"unknown metric {name!r}; valid ones are: {', '.join(_TABLE)}")
    return name


Metric = Annotated[str, AfterValidator(_known_metric)]

EXAMPLE = "p99<100ms,errors<0.1%"


class LatencyBound(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    percentile: Percentile = Field(description="which latency statistic is bounded")
    bound_ms: Positive = Field(description="its largest allowed value, ms")
    metric: Metric = Field(
        DEFAULT, description="which latency (a row of health.metrics.METRICS): e2e, ttft, ..."
    )

    @property
    def name(self) -> str:
        """How the SLO text names it: ``p99`` for end-to-end, ``ttft_p99`` for the rest."""
        return _TABLE[self.metric].bound_name(self.percentile)

    def meets(self, rec: Records) -> NDArray[np.bool_]:
        """Which requests of ``rec`` meet this bound on their own values (goodput)."""
        return _TABLE[self.metric].meets(rec, self.percentile, self.bound_ms)


class ScoreWeights(BaseModel):
    """Weights of the metrics in the combined score (the state rules ignore them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    latency: float = Field(1.0, ge=0, description="each latency bound: what the SLO is about")
    errors: float = Field(1.0, ge=0, description="the error rate: as much an SLO term as latency")
    attainment: float = Field(
        1.0, ge=0, description="achieved/offered: the direct sign that demand exceeds capacity"
    )
    trend: float = Field(
        0.5, ge=0, description="latency growth: a slope fitted to a few noisy windows, half weight"
    )
    gpu: float = Field(
        0.5, ge=0, description="GPU problems: a cause rather than an SLO term, half weight"
    )


class SLOPolicy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    latency: tuple[LatencyBound, ...] = Field((), description="latency bounds, one per statistic")
    max_error_rate: Share = Field(0.01, description="largest tolerated error rate")
    min_attainment: Share = Field(0.95, description="least achieved/offered throughput in a window")
    warn_fraction: float = Field(
        0.8, gt=0, lt=1, description="a metric above this fraction of its bound is Warn"
    )
    critical_factor: float = Field(
        3.0, gt=1, description="a latency or error metric this many times its bound is Critical"
    )
    weights: ScoreWeights = Field(default_factory=ScoreWeights)
    trend_windows: int = Field(
        5, ge=3, description="recent windows (this one included) the latency trend is fitted to"
    )
    trend_growth: float = Field(
        0.05,
        gt=0,
        description="latency growth per window, as a fraction of the latency bound, that "
        "signals Overloaded (latency growing without bound)",
    )
    trend_percentile: Literal["p50", "p99"] = Field(
        "p50", description="the statistic whose trend is fitted (p50: the least noisy)"
    )

    @model_validator(mode="after")
    def _one_bound_per_statistic(self) -> Self:
        if dup := repeated(b.name for b in self.latency):
            raise ValueError(f"{', '.join(dup)} bounded twice; keep one bound per statistic")
        return self


_PART = re.compile(
    r"^(?P<metric>[a-z][a-z0-9_.]*?)\s*(?P<op><=|>=|<|>)\s*"
    r"(?P<num>[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*(?P<unit>us|µs|ms|s|%)?$",
    re.IGNORECASE,
)
_PCT_NAMES: dict[str, Percentile] = {
    "p50": "p50",
    "p90": "p90",
    "p95": "p95",
    "p99": "p99",
    "p99.9": "p999",
    "p999": "p999",
    "max": "max",
    "mean": "mean",
}
_MS_PER = {"us": 1e-3, "µs".casefold(): 1e-3, "ms": 1.0, "s": 1e3}
"""By unit, casefolded: IGNORECASE also matches the Kelvin sign and the long s."""
_MISSPELT = {"error": "errors", "error_rate": "errors", "errors_rate": "errors"}
"""Names close to a statistic's, refused with the right one suggested: read silently,
``error<1%`` could as well have meant something else."""


def parse_slo(text: str) -> SLOPolicy:
    """Read an SLO such as ``"p99<100ms,errors<0.1%"`` (see the module docstring)."""
    latency: list[LatencyBound] = []
    spelt: dict[str, set[str]] = {}
    """Each bound's prefixes, by its name: ``p99`` and ``e2e_p99`` are one statistic."""
    fields: dict[str, float] = {}
    pos = 0
    for i, raw in enumerate(text.split(","), start=1):
        part = raw.strip()
        where = f"part {i} {part!r} (at character {pos + len(raw) - len(raw.lstrip()) + 1})"
        pos += len(raw) + 1
        m = _PART.match(part)
        if m is None:
            raise ConfigError(
                f"SLO {text!r}: cannot read {where}; write statistic, '<' or '>', value and "
                f"unit, e.g. {EXAMPLE!r} or 'attainment>95%'"
            )
        name, op, num, unit = m["metric"].casefold(), m["op"], float(m["num"]), m["unit"]
        metric, _, stat = name.rpartition("_")
        if stat in _PCT_NAMES and metric in ("", *METRICS):
            _expect(op, "<", text, where, f"{name}<100ms")
            if unit is None or unit == "%":
                raise ConfigError(
                    f"SLO {text!r}: {where} needs a time unit (us, ms or s), e.g. '{name}<100ms'"
                )
            ms = num * _MS_PER[unit.casefold()]
            latency.append(_bound(_PCT_NAMES[stat], ms, text, where, metric or DEFAULT))
            spelt.setdefault(latency[-1].name, set()).add(metric)
        elif name == "errors":
            _expect(op, "<", text, where, "errors<0.1%")
            fields["max_error_rate"] = _fraction(num, unit, text, where, "errors<0.1%")
        elif name == "attainment":
            _expect(op, ">", text, where, "attainment>95%")
            fields["min_attainment"] = _fraction(num, unit, text, where, "attainment>95%")
        elif name in _MISSPELT:
            raise ConfigError(
                f"SLO {text!r}: unknown statistic {m['metric']!r} in {where}; did you mean "
                f"{_MISSPELT[name]!r}? e.g. '{_MISSPELT[name]}{op}{m['num']}{unit or ''}'"
            )
        else:
            valid = ", ".join([*_PCT_NAMES, "errors", "attainment"])
            *most, last = (f"{m}_" for m in METRICS)
            raise ConfigError(
                f"SLO {text!r}: unknown statistic {m['metric']!r} in {where}; valid ones are: "
                f"{valid}, each percentile also as {', '.join(most)} or {last} (ttft_p99) "
                f"(e.g. {EXAMPLE!r})"
            )
    for key, prefixes in spelt.items():
        if len(prefixes) > 1:  # p99 and e2e_p99: one statistic, spelt two ways
            raise ConfigError(
                f"SLO {text!r}: {key} and {DEFAULT}_{key} both bound the end-to-end {key} "
                "latency; keep one bound of the two"
            )
    if dup := repeated(b.name for b in latency):
        raise ConfigError(f"SLO {text!r}: {', '.join(dup)} bounded twice; keep one bound each")
    try:
        return SLOPolicy(latency=tuple(latency), **fields)
    except ValidationError as e:  # every bound is checked above; this keeps the promise
        raise ConfigError(f"SLO {text!r}: {e.errors()[0]['msg']}; e.g. {EXAMPLE!r}") from None


def format_slo(policy: SLOPolicy) -> str:
    """The text form of ``policy``'s bounds, error rate and attainment."""
    parts = [f"{b.name}<{_duration(b.bound_ms)}" for b in policy.latency]
    parts.append(f"errors<{_percent(policy.max_error_rate)}")
    parts.append(f"attainment>{_percent(policy.min_attainment)}")
    return ",".join(parts)


def _policy(value: object) -> object:
    return parse_slo(value) if isinstance(value, str) else value


SLOText = Annotated[
    SLOPolicy,
    BeforeValidator(_policy),
    PlainSerializer(lambda p: format_slo(p), return_type=str),
]
"""A config field holding a parsed SLO: it reads the text a user types (or a policy)
once, and serialises as that text (``format_slo``)."""


def _expect(op: str, want: str, text: str, where: str, example: str) -> None:
    if not op.startswith(want):
        raise ConfigError(f"SLO {text!r}: {where} must use '{want}', e.g. {example!r}")


def _bound(pct: Percentile, ms: float, text: str, where: str, metric: str) -> LatencyBound:
    if not 0 < ms < math.inf:
        raise ConfigError(f"SLO {text!r}: {where} must be a finite bound above 0, e.g. 'p99<100ms'")
    return LatencyBound.model_validate({"percentile": pct, "bound_ms": ms, "metric": metric})


def _fraction(num: float, unit: str | None, text: str, where: str, example: str) -> float:
    if unit is not None and unit != "%":
        raise ConfigError(f"SLO {text!r}: {where} takes a fraction or a percent, e.g. {example!r}")
    value = num / 100 if unit == "%" else num
    if not 0 < value <= 1:
        raise ConfigError(
            f"SLO {text!r}: {where} must lie in (0, 1] (or (0%, 100%]), e.g. {example!r}"
        )
    return value


def _num(x: float) -> str:
    s = repr(x)
    return s[:-2] if s.endswith(".0") else s


def _duration(ms: float) -> str:
    """The shortest exact spelling: s or us when that unit reads back to the same float."""
    if ms >= 1000 and float(_num(ms / 1e3)) * 1e3 == ms:
        return f"{_num(ms / 1e3)}s"
    if ms < 1 and float(_num(ms * 1e3)) * 1e-3 == ms:
        return f"{_num(ms * 1e3)}us"
    return f"{_num(ms)}ms"


def _percent(x: float) -> str:
    if float(_num(x * 100)) / 100 == x:
        return f"{_num(x * 100)}%"
    return _num(x)
