"""A real HTTP endpoint on 127.0.0.1 for tests: one GET route, answered by a handler."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web


@asynccontextmanager
async def serving(
    path: str, handler: Callable[[web.Request], Awaitable[web.Response]]
) -> AsyncIterator[str]:
    """Serve ``handler`` at ``path`` on a free loopback port; yields the URL."""
    app = web.Application()
    app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        yield f"http://127.0.0.1:{port}{path}"
    finally:
        await runner.cleanup()
