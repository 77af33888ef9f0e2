"""``/healthz`` (the process answers), ``/readyz`` (Kafka and Redis answer), ``/metrics``."""

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from producer_api.dependencies import FleetDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(fleet: FleetDep) -> JSONResponse:
    checks = await fleet.ready()
    ready = all(checks.values())
    headers = None if ready else {"Retry-After": str(fleet.settings.retry_after_s)}
    body = {"status": "ready" if ready else "unavailable", **checks, **fleet.backlog.detail()}
    return JSONResponse(body, status_code=200 if ready else 503, headers=headers)


@router.get("/metrics")
async def metrics(fleet: FleetDep) -> Response:
    return Response(generate_latest(fleet.metrics.registry), media_type=CONTENT_TYPE_LATEST)
