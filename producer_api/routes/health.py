"""``/healthz`` (the process answers), ``/readyz`` (the fleet serves: Kafka and Redis
answer and a worker of the default model reads its jobs; ``?fleet=false``: the
process's own dependencies only), ``/metrics``."""

from fastapi import APIRouter, Query, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from producer_api.dependencies import FleetDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(fleet: FleetDep, fleet_checked: bool = Query(True, alias="fleet")) -> JSONResponse:
    """503 with Retry-After until a request sent now would be served now; with
    ``fleet=false`` only until this process can queue jobs (a probe that must not take
    the API out of service while its workers restart: jobs queue meanwhile)."""
    checks = await fleet.ready(fleet_checked)
    ready = all(checks.values())
    headers = None if ready else {"Retry-After": str(fleet.settings.retry_after_s)}
    body = {"status": "ready" if ready else "unavailable", **checks, **fleet.backlog.detail()}
    return JSONResponse(body, status_code=200 if ready else 503, headers=headers)


@router.get("/metrics")
async def metrics(fleet: FleetDep) -> Response:
    return Response(generate_latest(fleet.metrics.registry), media_type=CONTENT_TYPE_LATEST)
