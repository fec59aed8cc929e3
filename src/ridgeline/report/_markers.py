"""Generated blocks in a hand-written Markdown document: each between its own marker
comments (``<!-- PREFIX:NAME:start -->`` … ``<!-- PREFIX:NAME:end -->``), replaced in
place on every run, the prose around them left as it is; the tables they hold (``table``)."""

from __future__ import annotations

from pathlib import Path


def table(head: list[str], rows: list[list[str]]) -> str:
    """A Markdown table: its header, then one line a row."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def markers(prefix: str, name: str) -> tuple[str, str]:
    return f"<!-- {prefix}:{name}:start -->", f"<!-- {prefix}:{name}:end -->"


def update_document(path: str | Path, blocks: dict[str, str], *, prefix: str, title: str) -> Path:
    """Write each block between its markers in ``path``, leaving the rest of the document
    as it is; a block without markers there yet is appended, and a missing file is created
    with ``title`` as its heading."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)  # ridgeline-runs/, the default, on first use
    text = p.read_text(encoding="utf-8") if p.exists() else f"# {title}\n"
    for name, block in blocks.items():
        start, end = markers(prefix, name)
        body = f"{start}\n{block.strip()}\n{end}"
        if start in text and end in text.split(start, 1)[1]:
            before, rest = text.split(start, 1)
            text = before + body + rest.split(end, 1)[1]
        else:
            text = text.rstrip("\n") + "\n\n" + body + "\n"
    p.write_text(text, encoding="utf-8")
    return p
