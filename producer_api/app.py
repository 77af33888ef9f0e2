"""The FastAPI app, and ``genfleet api`` to serve it with uvicorn."""

import contextlib
import logging
from collections.abc import AsyncIterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from producer_api.body_limit import BodyLimitMiddleware
from producer_api.errors import ApiError, install_error_handlers
from producer_api.metrics import ApiMetrics, RequestMetricsMiddleware
from producer_api.routes import batches, files, health, jobs, openai, responses
from producer_api.services.fleet import Fleet
from producer_api.settings import LOOPBACK, ApiSettings
from queue_schemas.logs import configure_logging

log = logging.getLogger("genfleet.api")
KEEP_ALIVE_S = 65
UPLOAD_FRAMING_BYTES = 64 * 1024


def create_app(settings: ApiSettings | None = None) -> FastAPI:
    settings = settings or ApiSettings()
    metrics = ApiMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        fleet = Fleet(settings, metrics)
        await fleet.start()
        app.state.fleet = fleet
        try:
            yield
        finally:
            await fleet.stop()

    app = FastAPI(
        title="genfleet",
        version="1",
        description="Asynchronous LLM generation jobs, their event streams, and "
        "OpenAI-compatible routes.",
        lifespan=lifespan,
    )
    install_error_handlers(app)

    async def redis_down(_: Request, error: Exception) -> JSONResponse:
        log.warning("redis unavailable: %r", error)
        return ApiError(
            503,
            "job state store unavailable; retry later",
            code="state_unavailable",
            retry_after_s=settings.retry_after_s,
        ).response()

    app.add_exception_handler(RedisConnectionError, redis_down)
    app.add_exception_handler(RedisTimeoutError, redis_down)
    for module in (jobs, openai, responses, files, batches, health):
        app.include_router(module.router)
    # Outermost last: metrics see every response, the 413s of the body cap included.
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.max_body_bytes,
        # An upload's multipart framing adds a few hundred bytes to the file's own cap.
        larger={"/v1/files": settings.max_file_bytes + UPLOAD_FRAMING_BYTES},
    )
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)
    return app


def listen_address(settings: ApiSettings) -> str:
    """Without API keys anyone who reaches the port is a tenant: loopback only."""
    if settings.api_keys or settings.api_keys_file:
        return settings.host
    if settings.host != LOOPBACK:
        log.warning(
            "no API keys configured (GENFLEET_API_KEYS / GENFLEET_API_KEYS_FILE): "
            "listening on %s only, not %s",
            LOOPBACK,
            settings.host,
        )
    return LOOPBACK


def run_api(settings: ApiSettings) -> int:
    configure_logging(settings.log_format)
    host = listen_address(settings)
    log.info("genfleet api on http://%s:%d (model %s)", host, settings.port, settings.model)
    # Idle keep-alive connections live longer than uvicorn's 5 s default, so that a
    # client's pooled connection is rarely closed just as it sends on it.
    uvicorn.run(
        create_app(settings),
        host=host,
        port=settings.port,
        log_level="warning",
        log_config=None,  # uvicorn's loggers go through ours: one format per process
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    return 0
