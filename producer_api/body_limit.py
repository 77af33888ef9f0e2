"""A cap on request bodies: 413 before the app reads more than it allows."""

import contextlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from producer_api.errors import ApiError


class BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """413 for a body over the cap, whether it announces its length or streams in chunks."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        received = 0
        started = too_large = False

        async def counting_receive() -> Message:
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
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
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        response = ApiError(
            413, f"request body larger than {self.max_bytes} bytes", code="body_too_large"
        ).response()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": response.raw_headers,
            }
        )
        await send({"type": "http.response.body", "body": response.body})
