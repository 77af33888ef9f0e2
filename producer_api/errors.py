"""Every error in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

One shape for every route, so an OpenAI client and a plain HTTP client read
failures the same way; the HTTP status carries the class of failure.
"""

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

_KIND_BY_STATUS = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str | None = None,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind or _KIND_BY_STATUS.get(status, "invalid_request_error")
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        if retry_after_s:
            self.headers["Retry-After"] = str(retry_after_s)

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers or None)


def _field(location: tuple) -> str:
    """``("body", "messages", 0, "role")`` -> ``messages.0.role``; union branch labels
    that pydantic puts in locations (``list[constrained-str]``) are left out."""
    parts = [
        str(part)
        for part in location
        if isinstance(part, int) or str(part).replace("-", "_").isidentifier()
    ]
    return ".".join(
        parts[1:] if parts and parts[0] in ("body", "query", "path", "header") else parts
    )


def validation_error(problems: Sequence[Any]) -> ApiError:
    """422 naming every field at fault; ``param`` is the first of them."""
    fields = [_field(tuple(problem["loc"])) for problem in problems]
    message = "; ".join(
        f"{name or 'body'}: {problem['msg']}"
        for name, problem in zip(fields, problems, strict=True)
    )
    return ApiError(422, message, param=fields[0] if fields else None, code="invalid_value")


def install_error_handlers(app: FastAPI) -> None:
    async def api_error(_: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, ApiError)
        return error.response()

    async def invalid(_: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError | ValidationError)
        return validation_error(error.errors()).response()

    async def http_error(_: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, HTTPException)
        return ApiError(error.status_code, str(error.detail)).response()

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, invalid)
    # A body valid for the route but not as a job (checked when the job is built).
    app.add_exception_handler(ValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
