"""A disk that fills during `ridgeline run` (issue 33, fault 1; `docs/reliability.md`).

In a private mount namespace (``unshare``: as root, or any user where user namespaces
are allowed), a 4 MiB tmpfs holds the run store. The fake server answers on 127.0.0.1;
`ridgeline run` sends to it with ``--db`` on the tmpfs, and once the run is in the store
the tmpfs is filled to the last byte. Then the space is given back and `ridgeline runs
list` opens the store again. Prints one JSON object: the run's exit status, whether its
table was printed, its warning, where the journal went, and what the store holds after.

    python benchmarks/full_disk.py            # exit 0 when the run was kept, 1 if not

Exit 77 (and a line) where no mount namespace can be made here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

INSIDE = "--inside"
DURATION_S = 12
"""The run's step: long enough that the disk fills before it ends on a busy host (at 4 s,
the suite's load once let the step finish and be stored before the filling began, and
the trial then tried nothing)."""
CLI = [sys.executable, "-c", "from ridgeline._entry import main; main()"]


def main() -> int:
    if INSIDE not in sys.argv:
        unshare = shutil.which("unshare")
        if unshare is None:
            print("no unshare(1) here: cannot make a private tmpfs", file=sys.stderr)
            return 77
        cmd = [unshare, "--user", "--map-root-user", "--mount", sys.executable, __file__, INSIDE]
        if os.geteuid() == 0:
            cmd = [unshare, "--mount", sys.executable, __file__, INSIDE]
        return subprocess.run(cmd, check=False).returncode
    with tempfile.TemporaryDirectory() as top:
        disk, tmp = Path(top) / "disk", Path(top) / "tmp"
        disk.mkdir()
        tmp.mkdir()
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
            capture_output=True,
            text=True,
            check=False,
        )
        if mounted.returncode != 0:
            print(f"cannot mount a tmpfs here: {mounted.stderr.strip()}", file=sys.stderr)
            return 77
        try:
            found = _trial(disk, tmp)
        finally:
            subprocess.run(["umount", "-l", str(disk)], check=False)
    print(json.dumps(found, indent=2))
    return 0 if found["kept"] else 1


def _trial(disk: Path, tmp: Path) -> dict[str, object]:
    env = {**os.environ, "TMPDIR": str(tmp)}
    db = disk / "runs.sqlite"
    server = subprocess.Popen(
        [*CLI, "fake-server", "--port", "0", "--grpc-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        url = _url(server)
        run = subprocess.Popen(
            [
                *CLI,
                "run",
                url,
                "--rate",
                "400",
                "--duration",
                str(DURATION_S),
                "--store-requests",
                "--db",
                str(db),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        _until_stored(db, run)
        before = _steps(db)
        filled = _fill(disk / "filler")
        out, err = run.communicate(timeout=120)
    finally:
        server.terminate()
        server.wait(timeout=30)
    journals = sorted(str(p.relative_to(p.parent.parent)) for p in tmp.glob("*.jsonl"))
    (disk / "filler").unlink()
    listed = subprocess.run(
        [*CLI, "runs", "show", "1", "--json", "--db", str(db)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    after = json.loads(listed.stdout) if listed.returncode == 0 else None
    steps = len(after["steps"]) if after else 0
    return {
        "filled_bytes": filled,
        "steps_before_fill": before,
        "exit": run.returncode,
        "table_printed": "achieved" in out,
        "warning": [line for line in err.splitlines() if line.startswith("warning:")],
        "journals_in_tmp": journals,
        "after": {
            "status": after["status"] if after else listed.stderr.strip(),
            "steps": steps,
        },
        "kept": bool(after) and steps == 1 and "achieved" in out,
    }


def _steps(db: Path) -> int:
    """Steps the store held when the disk was filled: 0, or the trial tried nothing."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)
    try:
        return int(con.execute("SELECT count(*) FROM steps").fetchone()[0])
    finally:
        con.close()


def _url(server: subprocess.Popen[str]) -> str:
    assert server.stdout is not None
    for line in server.stdout:
        if m := re.search(r"(http://127\.0\.0\.1:\d+/v2/models/\w+)", line):
            return m.group(1)
    raise RuntimeError("the fake server printed no v2 URL")


def _until_stored(db: Path, run: subprocess.Popen[str], timeout_s: float = 60.0) -> None:
    """Until the run has its row in the store (then the disk fills under it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and run.poll() is None:
        with contextlib.suppress(sqlite3.Error):
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.1)
            try:
                if con.execute("SELECT count(*) FROM runs").fetchone()[0]:
                    return
            finally:
                con.close()
        time.sleep(0.02)  # a poll of a condition, not a wait for time to pass
    raise RuntimeError("the run never reached the store")


def _fill(path: Path) -> int:
    written = 0
    block = b"\0" * 65536
    with path.open("wb", buffering=0) as f:
        while True:
            try:
                n = f.write(block)
            except OSError:
                break
            if not n:
                break
            written += n
        while True:  # the last bytes: a block no longer fits
            try:
                if not f.write(b"\0"):
                    break
            except OSError:
                break
            written += 1
    return written


if __name__ == "__main__":
    sys.exit(main())
