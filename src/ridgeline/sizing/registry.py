"""The model registry: which model, on which hardware, serves how much within which SLO.

An entry pins a model version by the digest of its artifact, names the hardware and
serving configuration it was measured on, and carries the capacity a probe found (with
its confidence interval, SLO, strategy and run). Entries live in the run store's SQLite
file, in their own table, through their own connection (WAL lets both write).

Registering the same (model, version, hardware) again adds a revision; nothing is ever
overwritten, so a capacity that moved stays visible in the history.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from ridgeline.errors import ConfigError, StoreError
from ridgeline.telemetry._sqlite import Connected, open_db, transaction

if TYPE_CHECKING:
    from ridgeline.telemetry.store import RunStore

SCHEMA = """
CREATE TABLE IF NOT EXISTS registry (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    model TEXT NOT NULL,
    version TEXT NOT NULL,
    hardware TEXT NOT NULL,
    revision INTEGER NOT NULL,
    digest TEXT NOT NULL,
    serving_config TEXT NOT NULL,
    capacity TEXT NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (model, version, hardware, revision)
);
"""


class CapacityResult(BaseModel):
    """What a probe found for one model on one hardware, as the registry keeps it."""

    capacity_rps: float = Field(ge=0, description="highest rate served within the SLO, req/s")
    ci_low: float | None = Field(None, ge=0, description="low end of its confidence interval")
    ci_high: float | None = Field(None, ge=0, description="high end of its confidence interval")
    slo: str = Field(description="the SLO it was measured against, e.g. 'p99<100ms,errors<1%'")
    strategy: str = Field(description="the search strategy that found it")
    run_id: int | None = Field(None, description="the probe run in the run store")

    @classmethod
    def from_probe(cls, summary: dict[str, Any]) -> CapacityResult:
        """From a probe run's stored summary (``RunStore.get_run(id)["summary"]``)."""
        if summary.get("capacity_rps") is None:
            raise ConfigError(
                f"probe run {summary.get('run_id')} found no rate within its SLO, so there is "
                "no capacity to register; probe again from a lower rate or with a looser SLO"
            )
        return cls.model_validate(
            {k: summary.get(k) for k in ("capacity_rps", "ci_low", "ci_high", "slo", "strategy")}
            | {"run_id": summary.get("run_id")}
        )


class RegistryEntry(BaseModel):
    id: int
    model: str
    version: str
    hardware: str = Field(description="free text, e.g. 'A100-80GB MIG 3g.40gb'")
    revision: int = Field(ge=1, description="1 for the first (model, version, hardware), then +1")
    digest: str = Field(description="'sha256:…' of the artifact file, or the digest text given")
    serving_config: dict[str, Any]
    capacity: CapacityResult
    created_at: datetime


def artifact_digest(artifact: Path | str) -> str:
    """``sha256:HEX`` of a file's bytes for a Path; a str is taken as the digest itself."""
    if isinstance(artifact, str):
        if not artifact.strip():
            raise ConfigError(
                "the artifact digest is empty; give a file path to hash, or a digest such as "
                "'sha256:9f86d08…' or a registry image digest"
            )
        return artifact.strip()
    h = hashlib.sha256()
    try:
        with artifact.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError as exc:
        raise ConfigError(
            f"cannot read the artifact {artifact}: {exc.strerror or exc}; give an existing "
            "file to hash, or its digest as text"
        ) from exc
    return f"sha256:{h.hexdigest()}"


_COLUMNS = ", ".join(RegistryEntry.model_fields)
"""An entry's columns, as its fields are named and ordered: what ``_entry`` reads."""


def _entry(row: tuple[Any, ...]) -> RegistryEntry:
    stored: dict[str, Any] = dict(zip(RegistryEntry.model_fields, row, strict=True))
    stored["serving_config"] = json.loads(stored["serving_config"])
    stored["capacity"] = CapacityResult.model_validate_json(stored["capacity"])
    stored["created_at"] = datetime.fromtimestamp(stored["created_at"], UTC)
    return RegistryEntry.model_validate(stored)


def _required(**names: str) -> None:
    for name, value in names.items():
        if not value.strip():
            raise ConfigError(f"{name} is empty; give it as text, e.g. {name}='llama-3-8b'")


class Registry(Connected):
    """Versioned model entries in the run store's SQLite file."""

    def __init__(self, store: RunStore, clock: Callable[[], float] = time.time) -> None:
        self.path = store.path
        self._clock = clock
        try:
            self._db = open_db(self.path, SCHEMA)
        except sqlite3.Error as exc:
            raise StoreError(
                f"cannot open the registry in {self.path}: {exc}; pass --db with a writable path"
            ) from exc

    def register(
        self,
        model: str,
        version: str,
        *,
        artifact: Path | str,
        hardware: str,
        capacity: CapacityResult,
        serving_config: dict[str, Any] | None = None,
    ) -> RegistryEntry:
        """Add an entry; the same (model, version, hardware) again is its next revision."""
        _required(model=model, version=version, hardware=hardware)
        digest = artifact_digest(artifact)
        config = json.dumps(serving_config or {}, sort_keys=True, default=str)
        with transaction(self._db, "IMMEDIATE"):
            (last,) = self._db.execute(
                "SELECT COALESCE(MAX(revision), 0) FROM registry"
                " WHERE model=? AND version=? AND hardware=?",
                (model, version, hardware),
            ).fetchone()
            cur = self._db.execute(
                "INSERT INTO registry (model, version, hardware, revision, digest,"
                " serving_config, capacity, created_at) VALUES (?,?,?,?,?,?,?,?)",
                (
                    model,
                    version,
                    hardware,
                    int(last) + 1,
                    digest,
                    config,
                    capacity.model_dump_json(),
                    self._clock(),
                ),
            )
        return self._by_id(int(cur.lastrowid or 0))

    def _by_id(self, entry_id: int) -> RegistryEntry:
        row = self._db.execute(
            f"SELECT {_COLUMNS} FROM registry WHERE id=?", (entry_id,)
        ).fetchone()
        return _entry(row)

    def models(self) -> list[str]:
        return [m for (m,) in self._db.execute("SELECT DISTINCT model FROM registry ORDER BY 1")]

    def _known(self, model: str) -> None:
        models = self.models()
        if model in models:
            return
        known = (
            f"registered models are: {', '.join(models)}"
            if models
            else "the registry is empty; register a probe's result first"
        )
        raise StoreError(f"no model {model!r} in the registry at {self.path}; {known}")

    def list_entries(self, model: str | None = None) -> list[RegistryEntry]:
        """Every entry (or every entry of ``model``), oldest first."""
        if model is None:
            rows = self._db.execute(f"SELECT {_COLUMNS} FROM registry ORDER BY id").fetchall()
        else:
            self._known(model)
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM registry WHERE model=? ORDER BY id", (model,)
            ).fetchall()
        return [_entry(r) for r in rows]

    def get(
        self, model: str, version: str | None = None, *, hardware: str | None = None
    ) -> RegistryEntry:
        """The latest revision of ``model`` (of ``version``, on ``hardware``, when given)."""
        self._known(model)
        entries = [
            e
            for e in self.list_entries(model)
            if (version is None or e.version == version)
            and (hardware is None or e.hardware == hardware)
        ]
        if not entries:
            have = sorted({(e.version, e.hardware) for e in self.list_entries(model)})
            listed = "; ".join(f"version {v!r} on {h!r}" for v, h in have)
            wanted = " ".join(
                part
                for part in (
                    f"version {version!r}" if version is not None else "",
                    f"on {hardware!r}" if hardware is not None else "",
                )
                if part
            )
            raise StoreError(f"model {model!r} has no entry for {wanted}; it has: {listed}")
        return entries[-1]
