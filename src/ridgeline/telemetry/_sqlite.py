"""Opening the run store's SQLite file: one way, one set of PRAGMAs, for every table in it.

The run store (``telemetry.store``) and the model registry (``sizing.registry``) keep
their tables in the same file, each through its own connection. Both open it here:
autocommit (transactions are explicit, ``transaction``), shareable across threads, the
write-ahead log (so both connections may write: a writer waits for the other up to
``busy_timeout`` instead of failing at once) and ``synchronous=NORMAL`` (safe with WAL).
Foreign keys are declared in the schema but not enforced (SQLite's default).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, Self

PRAGMAS = ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=5000")
"""Set on every connection, in this order."""


def default_store_path() -> Path:
    """``$RIDGELINE_DB``, else ``$XDG_DATA_HOME/ridgeline/runs.sqlite`` (~/.local/share).
    Here, beside the opening, so a command's help can name it without loading the store."""
    env = os.environ.get("RIDGELINE_DB")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "ridgeline" / "runs.sqlite"


def open_db(path: Path, schema: str, *, readonly: bool = False) -> sqlite3.Connection:
    """A connection to ``path`` with ``PRAGMAS`` set and ``schema`` created (if absent);
    ``readonly``: the file as it is, nothing written (a store on read-only media, or one
    whose file this user may only read).

    Raises ``sqlite3.Error`` (the caller says which store failed and how to fix it)."""
    if readonly:
        return _read_only(path)
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        for pragma in PRAGMAS:
            db.execute(f"PRAGMA {pragma}")
        db.executescript(schema)
    except sqlite3.Error:
        db.close()
        raise
    return db


def _read_only(path: Path) -> sqlite3.Connection:
    """``mode=ro``, else ``immutable=1`` where even the WAL's shared-memory index cannot
    be made (a read-only folder): then nothing can be writing it either."""
    last: sqlite3.Error | None = None
    for flags in ("mode=ro", "mode=ro&immutable=1"):
        uri = f"{path.resolve().as_uri()}?{flags}"
        db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA busy_timeout=5000")
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            db.close()
            last = exc
            continue
        return db
    assert last is not None
    raise last


@contextmanager
def transaction(
    db: sqlite3.Connection, mode: Literal["DEFERRED", "IMMEDIATE"] = "DEFERRED"
) -> Iterator[None]:
    """One transaction: committed when the block ends, rolled back when it raises. SQLite
    rolls some failures back itself ("database or disk is full"): then the error raised
    is that one, not the ROLLBACK's "no transaction is active"."""
    db.execute(f"BEGIN {mode}")
    try:
        yield
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


class Connected:
    """A holder of one connection (``_db``): ``close`` it, or use it as a context."""

    _db: sqlite3.Connection

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
