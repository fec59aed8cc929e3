"""ridgeline's side: ``PlanServer`` serving a plan, in a process of its own.

``python ridgeline_app.py PLAN.yaml --zoo DIR --port P --grpc-port G [--loop L] [--drop]
[--decoders N]``
prints READY once the plan is served and serves until SIGTERM or SIGINT. It is
``ridgeline serve`` less the CLI, with a choice of event loop (uvloop by default, as
``ridgeline serve`` runs).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from ridgeline.pipeline.plan import load_plan
from ridgeline.serve.runtime import PlanServer


async def serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    plan_path = Path(args.plan)
    server = PlanServer(
        load_plan(plan_path),
        plan_path.parent,
        http_port=args.port,
        grpc_port=args.grpc_port,
        zoo=Path(args.zoo),
        drop=args.drop,
        decoders=args.decoders,
    )
    async with server:
        print("READY", flush=True)
        await stop.wait()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("plan")
    p.add_argument("--zoo", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--grpc-port", type=int, required=True)
    p.add_argument("--loop", choices=("asyncio", "uvloop"), default="uvloop")
    p.add_argument("--drop", action="store_true", help="early dropping (off: as the peers)")
    p.add_argument("--decoders", type=int, help="decoder processes (default: ridgeline's)")
    args = p.parse_args()
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(serve(args))
    else:
        asyncio.run(serve(args))


if __name__ == "__main__":  # worker processes are spawned: they re-import this module
    main()
