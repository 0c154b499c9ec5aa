"""Request bodies above a limit (`--max-body-mb`) get a 413 before anything reads or parses them: a
declared Content-Length is refused at once; a chunked body is counted as it arrives. The refused
body is read off the socket (up to DRAIN_LIMIT) and dropped, so the client, still sending, reads the
413 instead of a reset connection."""
from __future__ import annotations

from .errors import error_response

DRAIN_LIMIT_BYTES = 256 << 20


class BodyLimit:
    def __init__(self, app, limit_bytes: int):
        self.app = app
        self.limit_bytes = limit_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit_bytes:
            return await self._refuse(scope, receive, send, more_body=True)
        if declared is not None:
            return await self.app(scope, receive, send)
        # No length given (chunked): read it here, within the limit, then hand it on whole.
        messages, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                messages.append(message)
                break
            size += len(message.get("body", b""))
            if size > self.limit_bytes:
                return await self._refuse(scope, receive, send, more_body=message.get("more_body", False))
            messages.append(message)
            if not message.get("more_body", False):
                break

        async def replay():
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope, receive, send, more_body: bool) -> None:
        drained = 0
        while more_body and drained < DRAIN_LIMIT_BYTES:
            message = await receive()
            if message["type"] != "http.request":
                break
            drained += len(message.get("body", b""))
            more_body = message.get("more_body", False)
        megabytes = self.limit_bytes / (1 << 20)
        await error_response(413, f"the request body is larger than this server's limit of {megabytes:g} MB (--max-body-mb)",
                             code="request_too_large")(scope, receive, send)
