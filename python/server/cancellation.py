"""A request ends when its client leaves, streamed or not. Starlette's `request.is_disconnected()`
misses a disconnect that arrives while the handler awaits something else, and a middleware built on
BaseHTTPMiddleware hides it entirely; so, as vLLM's `with_cancellation` does, the handler races a
task that waits for the ASGI `http.disconnect` message, and loses its task (and with it, through
its `finally`, its sequences) when the client goes first. Streamed responses are cancelled by
Starlette's StreamingResponse, which listens for the same message."""
from __future__ import annotations

import asyncio
import contextlib
import functools

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

# Not an HTTP status a client ever reads (it has gone): nginx's "client closed request", for logs.
CLIENT_CLOSED = 499


def cancel_on_disconnect(endpoint):
    """Decorates an endpoint taking `request: Request`."""

    @functools.wraps(endpoint)
    async def wrapper(*args, **kwargs):
        request: Request = kwargs["request"]
        work = asyncio.ensure_future(endpoint(*args, **kwargs))
        gone = asyncio.ensure_future(disconnected(request))
        done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if work in done:
            gone.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gone
            response = work.result()
            if gone.done() and not gone.cancelled() and isinstance(response, StreamingResponse):
                # The disconnect was consumed here: the stream would never hear of it.
                await response.body_iterator.aclose()
                return Response(status_code=CLIENT_CLOSED)
            return response
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        return Response(status_code=CLIENT_CLOSED)

    return wrapper


async def disconnected(request: Request) -> None:
    """Returns when the client has gone. The body has been read (request_body.JsonRoute), so the
    next ASGI message is the disconnect."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
