"""The tiny LLM engine the scheduler and simulator tests share: every cost an exact
decimal (step 8 ms, 1 ms per prompt token, 2 ms per decoded sequence, 0.5 ms per
resident token) and 4 KV blocks of 4 tokens, so timelines come out exact."""

from __future__ import annotations

from ridgeline.synthetic.model import LlmEngine

TINY = LlmEngine(
    kv_cache_tokens=16,
    block_tokens=4,
    max_num_seqs=8,
    max_num_batched_tokens=64,
    step_ms=8.0,
    prefill_ms_per_token=1.0,
    decode_ms_per_seq=2.0,
    attention_ms_per_kv_token=0.5,
)
