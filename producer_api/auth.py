"""Bearer API keys mapped to tenants, each with its own limits.

Keys come from ``GENFLEET_API_KEYS`` ("KEY=TENANT,KEY=TENANT") and/or a JSON
file (``GENFLEET_API_KEYS_FILE``) mapping each key to a tenant name or to
``{"tenant": ..., "rate_limit_per_minute": ..., "max_outstanding_jobs": ...}``.
With no key configured every caller is the tenant ``default`` and the API
listens on loopback only.
"""

import hmac
import json

from pydantic import BaseModel, Field, TypeAdapter

from producer_api.errors import ApiError
from producer_api.settings import ApiSettings
from queue_schemas.bounds import TenantName

ANONYMOUS = "default"


class Tenant(BaseModel, frozen=True):
    tenant: TenantName
    rate_limit_per_minute: int | None = Field(None, ge=1)
    max_outstanding_jobs: int | None = Field(None, ge=1)


_KEYS_FILE = TypeAdapter(dict[str, Tenant | str])


class KeyRing:
    def __init__(self, settings: ApiSettings) -> None:
        self.defaults = settings
        self.keys: dict[str, Tenant] = {}
        for pair in filter(None, (part.strip() for part in settings.api_keys.split(","))):
            key, separator, name = pair.partition("=")
            if not separator or not key or not name:
                raise ValueError(f"GENFLEET_API_KEYS: expected KEY=TENANT, got {pair!r}")
            self.keys[key] = Tenant(tenant=name)
        if settings.api_keys_file is not None:
            entries = _KEYS_FILE.validate_python(json.loads(settings.api_keys_file.read_text()))
            for key, entry in entries.items():
                self.keys[key] = Tenant(tenant=entry) if isinstance(entry, str) else entry

    @property
    def open(self) -> bool:
        """No keys configured: anyone who can reach the (loopback) socket is ``default``."""
        return not self.keys

    def tenant(self, key: str | None) -> Tenant:
        """The tenant of a bearer key (None: no Authorization header), or 401."""
        if self.open:
            return Tenant(tenant=ANONYMOUS)
        if key:
            # Constant-time comparisons: no timing hint about how much of a key matched.
            for known, tenant in self.keys.items():
                if hmac.compare_digest(known.encode(), key.encode()):
                    return tenant
        raise ApiError(
            401,
            "missing or unknown API key: send 'Authorization: Bearer <key>'",
            kind="authentication_error",
            code="invalid_api_key",
        )

    def rate_limit(self, tenant: Tenant) -> int:
        return tenant.rate_limit_per_minute or self.defaults.rate_limit_per_minute

    def max_outstanding(self, tenant: Tenant) -> int:
        return tenant.max_outstanding_jobs or self.defaults.max_outstanding_jobs
