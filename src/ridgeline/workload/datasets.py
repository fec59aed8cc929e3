"""Prompt datasets: what each request asks, read from a file (or the bundled trace).

Three formats, told apart by the content (or named with ``fmt``):

- ``jsonl``: one JSON object a line, the prompt text under ``prompt`` (or ``input``,
  ``text``) and the output length under ``output_tokens`` (or ``max_tokens``,
  ``output_len``, ``output_length``, ``completion_tokens``); without a length, an answer
  text under ``completion`` (or ``response``, ``output``, ``answer``) gives it by its
  token count. A line may instead hold a whole conversation under ``conversations``, as
  ShareGPT writes it.
- ``sharegpt``: a JSON array of ``{"conversations": [{"from": "human", "value": ...},
  {"from": "gpt", "value": ...}, ...]}``: each human turn is a prompt, the gpt turn after
  it its recorded answer (whose token count is the output length asked).
- ``trace``: a CSV or JSONL request trace (``workload.traces``), ``azure`` the bundled
  Azure trace: token counts only, the prompts made to those counts.

A dataset is a list of conversations, each a list of turns; a plain prompt is a
conversation of one turn. Blank lines are skipped; every other problem is a
``DatasetError`` naming the file and line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ridgeline._yaml_config import read_text
from ridgeline.errors import DatasetError, RidgelineError, UnknownKindError
from ridgeline.workload.traces import bundled_trace_path, read_trace

DatasetFormat = Literal["auto", "jsonl", "sharegpt", "trace"]
FORMATS = ("auto", "jsonl", "sharegpt", "trace")
BUNDLED = "azure"
"""``--dataset azure``: the bundled Azure LLM trace (code), as token counts."""

PROMPT_KEYS = ("prompt", "input", "text")
LENGTH_KEYS = ("output_tokens", "max_tokens", "output_len", "output_length", "completion_tokens")
ANSWER_KEYS = ("completion", "response", "output", "answer")
_USER = frozenset({"human", "user"})
_ASSISTANT = frozenset({"gpt", "assistant", "chatgpt", "bard", "model", "bing"})
_TRACE_SUFFIXES = (".csv", ".tsv")


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a conversation."""

    prompt: str | None
    """The prompt's text; None for a trace row, whose prompt is made to its length."""
    prompt_tokens: int | None = None
    """The prompt's length, when the dataset gives it rather than the text."""
    output_tokens: int | None = None
    """The output length asked; None: the answer's token count, else the run's default."""
    answer: str = ""
    """The recorded answer: the next turn's history."""


@dataclass(frozen=True, slots=True)
class Dataset:
    conversations: tuple[tuple[Turn, ...], ...]
    source: str

    def requests(self, multi_turn: bool) -> list[tuple[Turn, tuple[str, ...]]]:
        """Each request and its history: every conversation's first turn, or with
        ``multi_turn`` all its turns in order, turn k carrying the k earlier prompts and
        answers."""
        out: list[tuple[Turn, tuple[str, ...]]] = []
        for turns in self.conversations:
            history: tuple[str, ...] = ()
            for turn in turns if multi_turn else turns[:1]:
                out.append((turn, history))
                history = (*history, turn.prompt or "", turn.answer)
        return out


def read_dataset(path: str | Path, fmt: DatasetFormat = "auto") -> Dataset:
    """The dataset at ``path`` (or ``azure``, the bundled trace), in format ``fmt``."""
    if fmt not in FORMATS:
        raise UnknownKindError("dataset format", str(fmt), FORMATS)
    if str(path) == BUNDLED:
        if fmt not in ("auto", "trace"):
            raise DatasetError(
                f"dataset {BUNDLED!r} is the bundled Azure trace (CSV), not {fmt}; drop "
                "--dataset-format or give trace"
            )
        return _from_trace(bundled_trace_path())
    file = Path(path)
    if fmt == "trace" or (fmt == "auto" and file.suffix.lower() in _TRACE_SUFFIXES):
        return _from_trace(file)
    text = read_text(file, "dataset", DatasetError)
    if not text.strip():
        raise DatasetError(f"dataset {file} holds no prompts; give a file with at least one")
    if fmt == "auto":
        head = text.lstrip()[:1]
        if head not in ("[", "{"):
            raise DatasetError(
                f"dataset {file} is neither JSONL (an object a line) nor ShareGPT JSON (an "
                "array); give --dataset-format, or a .csv trace"
            )
        fmt = "sharegpt" if head == "[" else "jsonl"
    conversations = tuple(_sharegpt(text, file) if fmt == "sharegpt" else _jsonl(text, file))
    if not conversations:
        raise DatasetError(f"dataset {file} holds no prompts; give a file with at least one")
    return Dataset(conversations, str(file))


def _from_trace(file: Path) -> Dataset:
    try:
        trace = read_trace(file)
    except DatasetError:
        raise
    except RidgelineError as exc:
        raise DatasetError(f"dataset {file}: {exc}") from None
    prompts = trace.columns.get("prompt_tokens")
    if prompts is None:
        raise DatasetError(
            f"trace {file} has no prompt token column (ContextTokens, prompt_tokens or "
            "input_tokens); a dataset needs each request's prompt length"
        )
    outputs = trace.columns.get("output_tokens")
    if outputs is not None and len(outputs) and float(outputs.max()) > MAX_OUTPUT_TOKENS:
        row = int(outputs.argmax())
        raise DatasetError(
            f"trace {file}, request {row}: asks {float(outputs[row]):.0f} output tokens, more "
            f"than {MAX_OUTPUT_TOKENS:,}; fix the row"
        )
    rows = (
        Turn(None, int(p), None if outputs is None else int(outputs[i]) or None)
        for i, p in enumerate(prompts.tolist())
    )
    return Dataset(tuple((turn,) for turn in rows), str(file))


def _jsonl(text: str, file: Path) -> Iterator[tuple[Turn, ...]]:
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"dataset {file}, line {number}"
        try:
            doc = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise DatasetError(
                f"{where}: not JSON ({_reason(exc)}); write one object a line"
            ) from None
        if not isinstance(doc, dict):
            raise DatasetError(f"{where}: a line must be a JSON object, not {type(doc).__name__}")
        if "conversations" in doc:
            turns = _conversation(doc["conversations"], where)
            if turns:
                yield turns
            continue
        prompt = _first(doc, PROMPT_KEYS)
        if not isinstance(prompt, str) or not prompt:
            raise DatasetError(
                f"{where}: no prompt text (looked for {', '.join(PROMPT_KEYS)}, or conversations)"
            )
        answer = _first(doc, ANSWER_KEYS)
        _unicode(prompt, where)
        if isinstance(answer, str):
            _unicode(answer, where)
        yield (
            Turn(
                prompt,
                output_tokens=_length(_first(doc, LENGTH_KEYS), where),
                answer=answer if isinstance(answer, str) else "",
            ),
        )


def _sharegpt(text: str, file: Path) -> Iterator[tuple[Turn, ...]]:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise DatasetError(f"dataset {file}: not JSON ({_reason(exc)})") from None
    if not isinstance(doc, list):
        raise DatasetError(f"dataset {file}: ShareGPT JSON is an array of conversations")
    for k, entry in enumerate(doc):
        where = f"dataset {file}, conversation {k}"
        if not isinstance(entry, dict) or "conversations" not in entry:
            raise DatasetError(f'{where}: expected an object with a "conversations" list')
        turns = _conversation(entry["conversations"], where)
        if turns:
            yield turns


def _conversation(messages: Any, where: str) -> tuple[Turn, ...]:
    """A ShareGPT conversation's turns: each user message and the assistant's after it
    (system messages and an assistant's opening are left out)."""
    if not isinstance(messages, list):
        raise DatasetError(f'{where}: "conversations" must be a list of messages')
    turns: list[Turn] = []
    prompt: str | None = None
    for m, message in enumerate(messages):
        if not isinstance(message, dict):
            raise DatasetError(f"{where}, message {m}: expected an object with from and value")
        role = message.get("from", message.get("role"))
        value = message.get("value", message.get("content"))
        if not isinstance(role, str) or not isinstance(value, str):
            raise DatasetError(
                f'{where}, message {m}: needs "from" and "value" strings (or role and content)'
            )
        _unicode(value, f"{where}, message {m}")
        role = role.lower()
        if role in _USER:
            if prompt is not None:
                turns.append(Turn(prompt))
            prompt = value
        elif role in _ASSISTANT and prompt is not None:
            turns.append(Turn(prompt, answer=value))
            prompt = None
    if prompt is not None:
        turns.append(Turn(prompt))
    return tuple(t for t in turns if t.prompt)


def _unicode(text: str, where: str) -> None:
    """JSON can spell a lone surrogate (``"\\ud800"``), which no tokenizer or request
    body can carry."""
    try:
        text.encode()
    except UnicodeEncodeError:
        raise DatasetError(
            f"{where}: the text holds a lone surrogate (an unpaired \\ud800-\\udfff escape); "
            "fix the escape or drop the entry"
        ) from None


def _first(doc: dict[str, Any], keys: tuple[str, ...]) -> Any:
    return next((doc[k] for k in keys if k in doc), None)


MAX_OUTPUT_TOKENS = 1 << 20
"""The longest output a dataset row may ask for: about a million tokens, past every
served model's context (10^11 was taken, and asked of the server)."""


def _length(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or not 1 <= value <= MAX_OUTPUT_TOKENS:
        raise DatasetError(
            f"{where}: the output length must be a whole number in 1..{MAX_OUTPUT_TOKENS:,}, "
            f"got {value!r}"
        )
    return value


def _reason(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deep"
    lines = str(exc).splitlines()
    return lines[0][:120] if lines else type(exc).__name__
