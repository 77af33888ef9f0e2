"""A cap on request bodies: 413 before the app reads more than it allows."""

import contextlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from producer_api.errors import ApiError


class BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """413 for a body over the cap, whether it announces its length or streams in chunks;
    ``larger`` gives paths (uploads) caps of their own."""

    def __init__(self, app: ASGIApp, max_bytes: int, larger: dict[str, int] | None = None):
        self.app = app
        self.default_max_bytes = max_bytes
        self.larger = larger or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes = self.larger.get(scope["path"], self.default_max_bytes)
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > max_bytes:
            await self._refuse(send, max_bytes)
            return
        received = 0
        started = too_large = False

        async def counting_receive() -> Message:
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_bytes:
                    too_large = True
                    raise BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if too_large:
                # The app's answer to a body it could not read (FastAPI makes it a 400):
                # the 413 below goes instead.
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        with contextlib.suppress(BodyTooLarge):
            await self.app(scope, counting_receive, tracking_send)
        if too_large and not started:
            await self._refuse(send, max_bytes)

    async def _refuse(self, send: Send, max_bytes: int) -> None:
        response = ApiError(
            413, f"request body larger than {max_bytes} bytes", code="body_too_large"
        ).response()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": response.raw_headers,
            }
        )
        await send({"type": "http.response.body", "body": response.body})
