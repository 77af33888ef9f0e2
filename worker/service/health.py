"""The worker's HTTP port (``--metrics-port``): ``/metrics``, ``/healthz``, ``/readyz``.

A Starlette app served by uvicorn on the worker's own event loop. The port is
bound before anything else starts, so a port in use is a clear error at start,
not a worker serving without its probes. uvicorn's signal handling is left
out: SIGTERM is the worker's, to drain.
"""

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Generator

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

# Each check answers None when all is well, else what is wrong.
Check = Callable[[], str | None]


class ListenError(RuntimeError):
    """The metrics port cannot be bound (in use, or a bad address)."""


class _EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _probe(check: Check, ok: str) -> Callable[[Request], Awaitable[Response]]:
    # Async endpoints: Starlette would run plain functions on a thread pool.
    async def answer(_: Request) -> Response:
        problem = check()
        if problem is None:
            return JSONResponse({"status": ok})
        return JSONResponse({"status": "unavailable", "reason": problem}, status_code=503)

    return answer


def health_app(registry: CollectorRegistry, healthy: Check, ready: Check) -> Starlette:
    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/metrics", metrics),
            Route("/healthz", _probe(healthy, "ok")),
            Route("/readyz", _probe(ready, "ready")),
        ]
    )


class HealthServer:
    def __init__(self, app: Starlette, host: str, port: int) -> None:
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError as error:
            self.sock.close()
            reason = f"cannot listen on {host}:{port} for metrics: {error.strerror}"
            raise ListenError(reason) from None
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        self.server = _EmbeddedServer(config)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self.server.serve(sockets=[self.sock]))

    async def stop(self) -> None:
        if self._task is None:
            return
        self.server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._task, 5.0)
        self.sock.close()
