"""What runs inside a decoder process: turn infer bodies into arrays, one at a time.

The parent (``decoders._Decoder``) spawns ``decoder_main``; the messages::

    parent → child   Grown(size, k), then a memory file's descriptor  |  None: stop
                     (seq, v2.spec.ModelShape, header_length, max_bytes, Layout of {"body": uint8})
    child → parent   "ready"  (once)
                     Grown(size, k), then a memory file's descriptor (answer buffer k)
                     (seq, "ok", Decoded with no arrays, Layout of the arrays by position)
                     (seq, "invalid", message)  |  (seq, "failed", "Type: message")

The body arrives in the parent's buffer k, the arrays go back in the child's buffer k
(k < depth: the bodies in flight): each side copies once, only layouts cross the pipe.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler

from ridgeline.errors import InvalidRequest
from ridgeline.serve._futures import error_text
from ridgeline.serve.arena import Arena, ArenaView
from ridgeline.v2.http_codec import decode_body


def decoder_main(conn: Connection, depth: int) -> None:
    """The decoder process: say it is ready, then decode until told to stop (None) or
    the parent is gone. Up to ``depth`` bodies are in flight, each in its own pair of
    buffers (the body's ``Layout.buffer`` names the pair), so the next body is here
    while the parent is still taking the last one's arrays."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops us
    bodies, answers = ArenaView(), [Arena(conn, os.getppid(), i) for i in range(depth)]
    conn.send("ready")
    while (message := bodies.receive(conn)) is not None:
        seq, model, header_length, max_bytes, layout = message
        reply: tuple[object, ...]
        try:
            body = bodies.unpack(layout)["body"]
            decoded = decode_body(model, body.data, header_length, max_bytes)
            arrays = answers[layout.buffer].pack({str(i): a for i, a in enumerate(decoded.arrays)})
            reply = (seq, "ok", replace(decoded, arrays=[]), arrays)
        except InvalidRequest as e:
            reply = (seq, "invalid", str(e))
        except Exception as e:  # a fault of ours: the request is answered 500 with it
            reply = (seq, "failed", error_text(e))
        try:
            conn.send_bytes(ForkingPickler.dumps(reply))
        except OSError:  # the parent is gone
            return
