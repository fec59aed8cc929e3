"""What runs inside a worker process: place it, load its backend, serve batches.

The parent (``workers._Process``) spawns ``child_main``; see ``workers`` for the
messages on the pipe. A load failure is sent back as the error itself when it is
ridgeline's and survives pickling (a ConfigError stays a ConfigError), else as text.
"""

from __future__ import annotations

import pickle
import signal
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler

from ridgeline.errors import BackendConfigError, RidgelineError
from ridgeline.serve._futures import error_text
from ridgeline.serve.affinity import Placement, apply_placement
from ridgeline.serve.arena import ArenaView
from ridgeline.serve.backend import Backend, Signature
from ridgeline.serve.backends import BackendConfig


def child_main(conn: Connection, backend: BackendConfig, placement: Placement) -> None:
    """The worker process: place it, load the backend, say so, then serve until told to
    stop (None) or the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops workers
    try:
        apply_placement(placement)
        instance = backend.build(placement.threads)
        instance.load()
        signature = instance.describe()
        if not isinstance(signature, Signature):
            raise BackendConfigError(
                f"{type(instance).__name__}.describe() returned a {type(signature).__name__}; "
                "return a ridgeline.serve.backend.Signature"
            )
        conn.send(("ready", signature))
    except Exception as e:
        conn.send(("failed", _portable(e)))
        return
    _serve(conn, instance)


def _serve(conn: Connection, backend: Backend) -> None:
    arena = ArenaView()
    while (message := arena.receive(conn)) is not None:
        batch_id, layout = message
        try:
            reply = ForkingPickler.dumps((batch_id, True, backend.run(arena.unpack(layout))))
        except Exception as e:  # the backend's error, or outputs that cannot be pickled
            reply = ForkingPickler.dumps((batch_id, False, error_text(e)))
        try:
            conn.send_bytes(reply)
        except OSError:  # the parent is gone
            return


def _portable(error: Exception) -> Exception | str:
    """The error itself if it is ridgeline's and survives the pipe, else its text."""
    if isinstance(error, RidgelineError):
        try:
            pickle.loads(pickle.dumps(error))
        except Exception:
            return error_text(error)
        return error
    return error_text(error)
