"""The continuous-batching LLM scheduler: pure step logic, no clock, no event loop.

One ``LlmScheduler`` holds the engine's state (waiting queue, running sequences, KV cache
blocks); ``step(start)`` decides and runs one engine step and says when it ends and which
sequences produced a token then. The fake server calls it on the real clock, the
simulator (``sim.llm``) in virtual time, so the two cannot disagree about the policy.

One step, after vLLM's scheduler:

1. Every running sequence, oldest admission first, reserves the KV slot of the token it
   is about to produce, taking a new block when its last one is full. When no block is
   free, the most recently admitted running sequence is preempted (vLLM's recompute
   policy: its blocks freed, it goes back to the front of the waiting queue, and its
   prompt plus the tokens it has produced are prefilled again when readmitted; tokens
   already produced are not produced again). A sequence may preempt itself.
2. When nobody was preempted, waiting sequences are admitted first come, first served
   while ``max_num_seqs`` allows another, the cache has the blocks for their prompt (and
   the first token) and the step's prefill budget (``max_num_batched_tokens``) has room
   (a first prompt longer than the budget is prefilled alone).
3. The step takes ``step_ms + prefill_ms_per_token·prefilled + decode_ms_per_seq·decoded
   + attention_ms_per_kv_token·resident`` (``resident``: the tokens whose KV slots the
   step's sequences hold, the reserved ones included). At its end every admitted
   sequence has its first token and every other one its next token.

A sequence of ``prompt`` tokens that has produced ``g`` holds ``ceil((prompt + g) /
block_tokens)`` blocks once the slot of token ``g`` is reserved, so a request whose
``prompt + max_tokens`` tokens need more blocks than the cache has could never finish:
``add`` refuses it (400, as vLLM refuses a request longer than its context).
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field

from ridgeline.synthetic.model import LlmEngine

NEVER_FITS = 400
QUEUE_FULL = 503


@dataclass(frozen=True, slots=True)
class Refused:
    """A request the engine will not take: ``status`` 400 (it can never fit the KV
    cache) or 503 (the waiting queue is full), with a one-line ``reason``."""

    status: int
    reason: str


@dataclass(slots=True, eq=False)
class _Seq:
    rid: int
    prompt: int
    target: int
    """Tokens it will produce: max_tokens, or its natural length when that comes first."""
    produced: int = 0
    blocks: int = 0
    cap: int = 0
    """Tokens its blocks hold: ``blocks · block_tokens``."""


@dataclass(frozen=True, slots=True)
class Step:
    """One engine step: from ``start`` to ``end``, what it ran and what it produced."""

    start: float
    end: float
    tokens: list[int]
    """Request ids that produced a token at ``end``: admitted ones first (their first
    token), then the decoded ones, each in admission order."""
    finished: list[int]
    """Request ids whose last token came at ``end`` (their KV blocks are free again)."""
    preempted: list[int]
    """Request ids preempted at ``start`` (back to the waiting queue)."""
    prefilled: int
    """Prompt tokens (re)computed in the step."""
    decoded: int
    """Sequences that decoded one token."""
    resident: int
    """Tokens resident in the KV cache during the step."""


@dataclass(slots=True)
class LlmScheduler:
    """The engine's state and its one operation, ``step``; every time is an argument.

    ``max_waiting`` bounds the waiting queue (None: unbounded); a request over it is
    refused at once (503).
    """

    engine: LlmEngine
    max_waiting: int | None = None
    preemptions: int = 0
    """Preemptions so far (vLLM's ``num_preemptions_total``)."""
    _waiting: deque[_Seq] = field(default_factory=deque)
    _running: list[_Seq] = field(default_factory=list)
    _by_id: dict[int, _Seq] = field(default_factory=dict)
    _free: int = -1
    _held: int = 0
    """Tokens of the running sequences (prompt + produced each)."""

    def __post_init__(self) -> None:
        self._free = self.engine.blocks

    # --- state, as vLLM's metrics show it ------------------------------------------------

    @property
    def running(self) -> int:
        """Sequences running (admitted, not finished, not preempted)."""
        return len(self._running)

    @property
    def waiting(self) -> int:
        """Requests waiting for admission (preempted ones included)."""
        return len(self._waiting)

    @property
    def used_blocks(self) -> int:
        """KV cache blocks held by running sequences."""
        return self.engine.blocks - self._free

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV cache's blocks in use, 0 to 1."""
        return self.used_blocks / self.engine.blocks

    @property
    def idle(self) -> bool:
        """Nothing running or waiting: no step to take until a request arrives."""
        return not self._running and not self._waiting

    # --- requests ---------------------------------------------------------------------

    def blocks_for(self, tokens: int) -> int:
        """KV cache blocks that ``tokens`` tokens occupy."""
        return -(-tokens // self.engine.block_tokens)

    def refusal(self, prompt: int, max_tokens: int, ahead: int = 0) -> Refused | None:
        """Why a request of ``prompt`` tokens asking ``max_tokens`` would be refused now,
        with ``ahead`` more requests about to join the waiting queue before it; None
        when it would be taken."""
        if prompt < 1 or max_tokens < 1:
            raise ValueError(f"prompt ({prompt}) and max_tokens ({max_tokens}) must be ≥ 1")
        if self.blocks_for(prompt + max_tokens) > self.engine.blocks:
            cap = self.engine.blocks * self.engine.block_tokens
            return Refused(
                NEVER_FITS,
                f"prompt ({prompt} tokens) + max_tokens ({max_tokens}) exceeds the KV cache "
                f"({cap} tokens); shorten the prompt or lower max_tokens",
            )
        if self.max_waiting is not None and len(self._waiting) + ahead >= self.max_waiting:
            return Refused(QUEUE_FULL, "queue full")
        return None

    def add(
        self,
        rid: int,
        prompt: int,
        max_tokens: int,
        target: int | None = None,
        *,
        checked: bool = False,
    ) -> Refused | None:
        """Queue request ``rid`` (``prompt`` ≥ 1 tokens, up to ``max_tokens`` ≥ 1 out;
        ``target`` ≤ max_tokens when it ends early at EOS); a ``Refused`` when it is not
        taken (``refusal``, unless the caller has ``checked`` it already), None when it
        waits for admission."""
        if rid in self._by_id:
            raise ValueError(f"request id {rid} is already queued or running")
        refused = None if checked else self.refusal(prompt, max_tokens)
        if refused is not None:
            return refused
        seq = _Seq(rid, prompt, max_tokens if target is None else max(1, min(target, max_tokens)))
        self._waiting.append(seq)
        self._by_id[rid] = seq
        return None

    def abort(self, rid: int) -> bool:
        """Drop request ``rid`` (its client went away), freeing its blocks; whether it
        was still queued or running."""
        seq = self._by_id.pop(rid, None)
        if seq is None:
            return False
        if seq.blocks:
            self._release(seq)
            self._running.remove(seq)
        else:
            self._waiting.remove(seq)
        return True

    # --- the step ---------------------------------------------------------------------

    def step(self, start: float, slowdown: float = 1.0) -> Step | None:
        """Run one step from ``start`` (its duration times ``slowdown``); None when idle."""
        if self.idle:
            return None
        e = self.engine
        decode, preempted = self._reserve()
        admitted, prefilled = ([], 0) if preempted else self._admit()
        ran = admitted + decode if admitted else decode
        resident = self._held + len(ran)
        ms = (
            e.step_ms
            + e.prefill_ms_per_token * prefilled
            + e.decode_ms_per_seq * len(decode)
            + e.attention_ms_per_kv_token * resident
        )
        self._held = resident
        finished = []
        for s in ran:
            s.produced += 1
            if s.produced == s.target:
                finished.append(s.rid)
                self._release(s)
                del self._by_id[s.rid]
        if finished:
            self._running = [s for s in self._running if s.blocks]
        return Step(
            start,
            start + ms * slowdown / 1000.0,
            [s.rid for s in ran],
            finished,
            preempted,
            prefilled,
            len(decode),
            resident,
        )

    def _release(self, seq: _Seq) -> None:
        """A running sequence gives back its blocks (finished, preempted or aborted)."""
        self._free += seq.blocks
        self._held -= seq.prompt + seq.produced
        seq.blocks = seq.cap = 0

    def _reserve(self) -> tuple[list[_Seq], list[int]]:
        """Each running sequence takes the block its next token needs (one more when its
        last is full), preempting the most recently admitted ones when none is free; the
        sequences that will decode, and the ids preempted."""
        run, bt = self._running, self.engine.block_tokens
        preempted: list[int] = []
        full = [seq for seq in run if seq.prompt + seq.produced >= seq.cap]
        if len(full) <= self._free:  # a block for each: nobody is preempted
            self._free -= len(full)
            for seq in full:
                seq.blocks += 1
                seq.cap += bt
            return list(run), preempted
        i = 0
        while i < len(run):
            seq = run[i]
            if seq.prompt + seq.produced < seq.cap:
                i += 1
                continue
            while self._free == 0:
                victim = run.pop()
                self._release(victim)
                self._waiting.appendleft(victim)
                preempted.append(victim.rid)
                self.preemptions += 1
                if victim is seq:
                    break
            else:
                self._free -= 1
                seq.blocks += 1
                seq.cap += bt
                i += 1
        return list(run), preempted

    def _admit(self) -> tuple[list[_Seq], int]:
        """Waiting sequences admitted first come, first served, and the prompt tokens
        their prefill computes."""
        e, budget = self.engine, self.engine.max_num_batched_tokens
        admitted: list[_Seq] = []
        prefilled = 0
        while self._waiting and len(self._running) < e.max_num_seqs:
            seq = self._waiting[0]
            compute = seq.prompt + seq.produced
            if admitted and prefilled + compute > budget:
                break
            need = self.blocks_for(compute + 1)
            if need > self._free:
                break
            self._waiting.popleft()
            self._free -= need
            seq.blocks, seq.cap = need, need * e.block_tokens
            self._held += compute
            self._running.append(seq)
            admitted.append(seq)
            prefilled += compute
        return admitted, prefilled


def output_length(
    engine: LlmEngine,
    max_tokens: int,
    *,
    ignore_eos: bool,
    min_tokens: int = 0,
    seed: int = 0,
    index: int = 0,
) -> int:
    """Tokens a request will produce: ``max_tokens``, or (with ``eos_mean_tokens`` set and
    ``ignore_eos`` false) its natural length when shorter, a geometric draw seeded by
    (``seed``, ``index``), never below ``min_tokens``."""
    mean = engine.eos_mean_tokens
    if ignore_eos or mean is None:
        return max_tokens
    u = random.Random(seed * 1_000_003 + index).random()
    natural = 1 if mean <= 1.0 else 1 + int(math.log1p(-u) / math.log1p(-1.0 / mean))
    return max(min(natural, max_tokens), min(min_tokens, max_tokens), 1)


def saturated_rps(engine: LlmEngine, prompt: int, output: int) -> float:
    """Requests per second the engine completes when every request has ``prompt`` tokens
    in and ``output`` out and as many run as the cache (full-grown) or ``max_num_seqs``
    allow, ignoring preemption: ``b / (output·T_decode + b·prefill)``, with ``T_decode``
    the step time at ``b`` sequences of mean length ``prompt + output/2``. A guide for
    presets and tests, not the simulated answer."""
    per_seq = -(-(prompt + output) // engine.block_tokens)
    b = min(engine.max_num_seqs, engine.blocks // per_seq)
    if b < 1:
        return 0.0
    resident = b * (prompt + output / 2.0)
    t_decode = (
        engine.step_ms + engine.decode_ms_per_seq * b + engine.attention_ms_per_kv_token * resident
    )
    return b * 1000.0 / (output * t_decode + b * engine.prefill_ms_per_token * prompt)
