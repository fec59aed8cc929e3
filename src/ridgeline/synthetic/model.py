"""The one latency model: a latency model as a typed config, and the pure functions over it.

A batch of ``n`` rows takes ``base_ms + per_item_ms·n`` milliseconds on one of
``instances`` parallel executors, multiplied by a warm-up factor and by lognormal noise of
mean 1. Everything here is a pure function of the config (and, for noise, of the random
generator passed in): the fake server's engine, the runtime's synthetic backend and the
simulator schedule with them, tests assert exact values.
"""

from __future__ import annotations

import math
import random
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ridgeline._fields import Count, NonNegative, Positive
from ridgeline._repeats import repeated
from ridgeline.policies.batching import BatchingConfig
from ridgeline.v2.spec import TensorSpec


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Warmup(_Frozen):
    """Service times start ``factor`` times slower and decay linearly to normal.

    The factor falls linearly from ``factor`` to 1 over the first ``requests`` requests
    served and over the first ``seconds`` after server start; with both set, warm-up
    ends at whichever comes first.
    """

    factor: float = Field(3.0, ge=1.0, le=1000.0, description="slowdown of the first request")
    requests: Count | None = Field(None, description="requests over which warm-up decays")
    seconds: float | None = Field(
        None, gt=0.0, allow_inf_nan=False, description="seconds over which warm-up decays"
    )

    @model_validator(mode="after")
    def _has_horizon(self) -> Warmup:
        if self.requests is None and self.seconds is None:
            raise ValueError("warmup needs `requests`, `seconds` or both to say when it ends")
        return self


class Stall(_Frozen):
    """All instances freeze: nothing completes in [at_s, at_s + duration_ms)."""

    at_s: float = Field(
        ge=0.0, allow_inf_nan=False, description="start of the stall, seconds after server start"
    )
    duration_ms: float = Field(gt=0.0, allow_inf_nan=False, description="length of the stall")


class PeriodicStall(_Frozen):
    """A stall every ``every_s`` seconds (at every_s, 2·every_s, …) after server start."""

    every_s: float = Field(gt=0.0, allow_inf_nan=False, description="period between stall starts")
    duration_ms: float = Field(gt=0.0, allow_inf_nan=False, description="length of each stall")

    @model_validator(mode="after")
    def _shorter_than_period(self) -> PeriodicStall:
        if self.duration_ms >= self.every_s * 1000.0:
            raise ValueError(
                f"periodic stall of {self.duration_ms} ms every {self.every_s} s never ends; "
                "make duration_ms shorter than the period"
            )
        return self


def _default_inputs() -> tuple[TensorSpec, ...]:
    return (TensorSpec("INPUT0"),)


def _default_outputs() -> tuple[TensorSpec, ...]:
    return (TensorSpec("OUTPUT0"),)


BaseMs = Annotated[
    float, Field(ge=0.0, allow_inf_nan=False, description="fixed cost of one batch, a in a + b·n")
]
PerItemMs = Annotated[
    float, Field(ge=0.0, allow_inf_nan=False, description="cost per row of a batch, b in a + b·n")
]
NoiseCv = Annotated[
    float, Field(ge=0.0, le=10.0, description="coefficient of variation of lognormal noise, mean 1")
]


class BatchCost(_Frozen):
    """The fields every synthetic model shares (the fake server's, the runtime's synthetic
    backend's, a plan's): a batch of n rows costs ``base_ms + per_item_ms·n`` times
    lognormal noise of mean 1, and maps ``inputs`` to ``outputs``.

    Outputs are computed from inputs by position (output j from input j, or from the
    last input): numeric outputs are 2·input when the element counts per row agree,
    BYTES outputs echo BYTES inputs, anything else is zeros.
    """

    base_ms: BaseMs = 5.0
    per_item_ms: PerItemMs = 1.0
    noise_cv: NoiseCv = 0.0
    inputs: tuple[TensorSpec, ...] = Field(
        default_factory=_default_inputs, min_length=1, description="input tensors"
    )
    outputs: tuple[TensorSpec, ...] = Field(
        default_factory=_default_outputs, min_length=1, description="output tensors"
    )

    @model_validator(mode="after")
    def _tensors_a_synthetic_model_can_answer(self) -> Self:
        for kind, specs in (("input", self.inputs), ("output", self.outputs)):
            if dupes := repeated(s.name for s in specs):
                raise ValueError(f"{kind} names {dupes} appear more than once; rename them")
            for spec in specs:
                _check_batched(spec)
        return self


def _check_batched(spec: TensorSpec) -> None:
    if not spec.shape or spec.shape[0] != -1:
        raise ValueError(
            f"tensor {spec.name!r}: shape {list(spec.shape)} must start with -1, the batch "
            "dim (the fake model always batches)"
        )
    bad = [d for d in spec.shape[1:] if d < 1 and d != -1]
    if bad:
        raise ValueError(f"tensor {spec.name!r}: dims {bad} must be ≥ 1 or -1 (any size)")
    if spec.datatype == "BF16":
        raise ValueError(
            f"tensor {spec.name!r}: a synthetic model cannot answer BF16; use FP16 or FP32"
        )


class LlmEngine(_Frozen):
    """A continuous-batching LLM engine (vLLM-like) behind the OpenAI routes.

    Each step admits waiting requests first come, first served while the KV cache has
    blocks for their prompt, ``max_num_seqs`` allows another sequence and the step's
    prefill budget (``max_num_batched_tokens``) has room; it prefills them (first token
    at the step's end) and decodes one token for every other running sequence. A step
    takes ``step_ms + prefill_ms_per_token·(tokens prefilled) + decode_ms_per_seq·
    (sequences decoded) + attention_ms_per_kv_token·(tokens resident in the cache)``.
    ``synthetic.llm`` holds the scheduler; the fake server runs it on the real clock,
    ``sim.llm`` in virtual time.
    """

    kv_cache_tokens: Count = Field(
        16384, le=100_000_000, description="tokens the KV cache holds, all sequences together"
    )
    block_tokens: Count = Field(16, le=1024, description="tokens per KV cache block")
    max_num_seqs: Count = Field(128, le=100_000, description="sequences running at most")
    max_num_batched_tokens: Count = Field(
        2048,
        le=10_000_000,
        description="prompt tokens one step may prefill (a longer prompt is prefilled alone)",
    )
    step_ms: NonNegative = Field(
        15.0, description="fixed cost of every engine step (the weights read once), ms"
    )
    prefill_ms_per_token: NonNegative = Field(
        0.1, description="cost of each prompt token prefilled in a step, ms"
    )
    decode_ms_per_seq: NonNegative = Field(
        0.15, description="cost of each sequence decoding one token in a step, ms"
    )
    attention_ms_per_kv_token: NonNegative = Field(
        0.0004, description="cost of each token resident in the KV cache during a step, ms"
    )
    eos_mean_tokens: Positive | None = Field(
        None,
        description="mean natural output length (geometric, seeded); a request without "
        "ignore_eos ends there if before max_tokens (None: every request runs to max_tokens)",
    )

    @property
    def blocks(self) -> int:
        """KV cache blocks (``kv_cache_tokens // block_tokens``)."""
        return self.kv_cache_tokens // self.block_tokens

    @model_validator(mode="after")
    def _one_block_at_least(self) -> LlmEngine:
        if self.kv_cache_tokens < self.block_tokens:
            raise ValueError(
                f"kv_cache_tokens ({self.kv_cache_tokens}) holds no block of "
                f"{self.block_tokens} tokens; raise it or lower block_tokens"
            )
        return self


class LatencyModel(BatchCost):
    """Everything the fake server needs to know about the model it pretends to serve."""

    name: str = Field("fake", min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$", description="model name")
    batching: BatchingConfig = Field(
        default_factory=BatchingConfig, description="dynamic batching policy"
    )
    instances: Count = Field(1, le=256, description="parallel batch executors")
    warmup: Warmup | None = Field(None, description="slower service right after start")
    error_rate: float = Field(
        0.0, ge=0.0, le=1.0, description="fraction of requests answered with an injected error"
    )
    stalls: tuple[Stall, ...] = Field((), description="one-off stalls of all instances")
    periodic_stall: PeriodicStall | None = Field(None, description="a stall repeating forever")
    max_queue: int | None = Field(
        None,
        ge=0,
        description="requests that may wait for a batch; more are refused at once with 503 / "
        "UNAVAILABLE 'queue full' (0: refuse unless an instance takes it now; None: unbounded)",
    )
    seed: int = Field(0, description="seed of the noise and error draws")
    ttft_ms: float = Field(
        50.0,
        ge=0.0,
        allow_inf_nan=False,
        description="OpenAI routes: first token this long after the engine answers",
    )
    per_token_ms: float = Field(
        10.0, ge=0.0, allow_inf_nan=False, description="OpenAI routes: gap between tokens"
    )
    llm: LlmEngine | None = Field(
        None,
        description="OpenAI routes served by a continuous-batching LLM engine (ttft_ms and "
        "per_token_ms then unused); None: through the batching engine, fixed token timing",
    )

    @property
    def max_batch_size(self) -> int:
        """The largest batch (``batching.max_batch_size``), as front ends read it."""
        return self.batching.max_batch_size


def warmup_factor(model: LatencyModel, since_start_s: float, served_before: int) -> float:
    """Slowdown of a batch started ``since_start_s`` after start with ``served_before``
    requests served before it: linear from ``warmup.factor`` down to 1."""
    w = model.warmup
    if w is None or w.factor == 1.0:
        return 1.0
    remaining = 1.0
    if w.requests is not None:
        remaining = min(remaining, max(0.0, 1.0 - served_before / w.requests))
    if w.seconds is not None:
        remaining = min(remaining, max(0.0, 1.0 - since_start_s / w.seconds))
    return 1.0 + (w.factor - 1.0) * remaining


def lognormal_params(cv: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with mean 1 and coefficient of variation ``cv``."""
    sigma2 = math.log1p(cv * cv)
    return -sigma2 / 2.0, math.sqrt(sigma2)


def mean_service_s(
    model: LatencyModel, rows: int, since_start_s: float, served_before: int
) -> float:
    """Seconds one instance takes for a batch of ``rows`` rows, before noise:
    (base_ms + per_item_ms·rows) / 1000, times the warm-up factor."""
    ms = model.base_ms + model.per_item_ms * rows
    if ms == 0.0:
        return 0.0
    return ms * warmup_factor(model, since_start_s, served_before) / 1000.0


def service_time_s(
    model: LatencyModel,
    rows: int,
    since_start_s: float,
    served_before: int,
    rng: random.Random,
) -> float:
    """Seconds one instance takes for a batch of ``rows`` rows: ``mean_service_s`` times
    one lognormal draw from ``rng`` when ``noise_cv`` > 0 (no draw otherwise, nor for a
    batch that takes no time)."""
    s = mean_service_s(model, rows, since_start_s, served_before)
    if s > 0.0 and model.noise_cv > 0.0:
        mu, sigma = lognormal_params(model.noise_cv)
        s *= rng.lognormvariate(mu, sigma)
    return s


def capacity_rps(model: LatencyModel) -> float:
    """Requests of one row each per second under saturation, after warm-up:
    instances·B / (a + b·B) with B = max_batch_size; infinite when service is free."""
    b = model.batching.max_batch_size
    batch_ms = model.base_ms + model.per_item_ms * b
    if batch_ms == 0.0:
        return math.inf
    return model.instances * b * 1000.0 / batch_ms


def stall_release(model: LatencyModel, t_s: float) -> float:
    """The first moment at or after ``t_s`` (seconds since start) outside every stall:
    a completion due at ``t_s`` happens then."""
    periodic = model.periodic_stall
    moved = True
    while moved:
        moved = False
        for s in model.stalls:
            end = s.at_s + s.duration_ms / 1000.0
            if s.at_s <= t_s < end:
                t_s, moved = end, True
        if periodic is not None:
            k = math.floor(t_s / periodic.every_s)
            if k >= 1:
                end = k * periodic.every_s + periodic.duration_ms / 1000.0
                if t_s < end:
                    t_s, moved = end, True
    return t_s
