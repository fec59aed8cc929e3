"""The ``ridgeline`` console command's first lines: a signal while the CLI is still being
loaded (its imports take a few hundred milliseconds, more on a busy host) ends it with
one ``error:`` line and exit 130, not a ``KeyboardInterrupt`` traceback or a silent
exit 143. Kept apart from ``ridgeline.cli`` so that importing the CLI (a test, a
library user) installs no handler; ``cli.main`` takes over once it runs."""

from __future__ import annotations

import os
import signal
from types import FrameType


def _starting(signum: int, frame: FrameType | None) -> None:
    name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    os.write(2, f"error: interrupted by {name} while starting; nothing was run\n".encode())
    os._exit(130)


def install() -> None:
    """Until ``cli.main`` takes over, a signal is one line and exit 130."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _starting)


QUIET_GRPC = {"GRPC_VERBOSITY": "NONE"}
"""gRPC's C core writes its own log lines to stderr (a port it cannot bind, a failed TLS
handshake) around the command's one ``error:`` line: silenced for the command, unless
the user set them (``GRPC_VERBOSITY=ERROR`` to see them again)."""


def main() -> None:
    install()
    for name, value in QUIET_GRPC.items():
        os.environ.setdefault(name, value)  # before gRPC is imported: read once, then
    from ridgeline.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
