"""What routes receive: the process's fleet connections and the caller's tenant."""

from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from producer_api.auth import Tenant
from producer_api.services.deadlines import DeadlineHeaders, deadline_headers
from producer_api.services.fleet import Fleet

_bearer = HTTPBearer(auto_error=False, description="API key: 'Authorization: Bearer <key>'")


def get_fleet(request: Request) -> Fleet:
    return request.app.state.fleet


def get_tenant(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
) -> Tenant:
    return get_fleet(request).keys.tenant(credentials.credentials if credentials else None)


FleetDep = Annotated[Fleet, Depends(get_fleet)]
TenantDep = Annotated[Tenant, Depends(get_tenant)]
DeadlineDep = Annotated[DeadlineHeaders, Depends(deadline_headers)]
