"""What every POST body passes before its endpoint sees it: a JSON content type, JSON that parses,
and no string that cannot become UTF-8. A lone UTF-16 surrogate ("\ud800") is valid JSON and a valid
Python str, but no tokenizer, template or response can carry it: it gets a 400 naming where it
is, for every field (content, names, stop strings, tool arguments) at once."""
from __future__ import annotations

import json
from collections.abc import Callable

from fastapi import Request
from fastapi.routing import APIRoute

from .errors import ApiError


class JsonRoute(APIRoute):
    """An APIRoute whose POST bodies are checked first (FastAPI's custom route class)."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def checked(request: Request):
            if request.method == "POST":
                check(await request.body(), request.headers.get("content-type"))
            return await handler(request)

        return checked


def check(body: bytes, content_type: str | None) -> None:
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        got = f"'{content_type}'" if content_type else "none"
        raise ApiError(415, f"send the request body as JSON with 'Content-Type: application/json' (got {got})",
                       code="unsupported_media_type")
    try:
        value = json.loads(body)
    except ValueError as error:  # UnicodeDecodeError included
        raise ApiError(400, f"request body is not valid JSON: {error}", code="invalid_json") from None
    where = surrogate_path(value)
    if where is not None:
        raise ApiError(400, f"{where or 'the body'} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), "
                       "which is not text", param=where or None, code="invalid_unicode")


def surrogate_path(value, path: str = "") -> str | None:
    """The dotted path of the first string (or key) holding a lone surrogate, else None."""
    if isinstance(value, str):
        return path if has_surrogate(value) else None
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = surrogate_path(item, f"{path}.{index}" if path else str(index))
            if found is not None:
                return found
    elif isinstance(value, dict):
        for key, item in value.items():
            inner = f"{path}.{key}" if path else key
            if has_surrogate(key):
                return path or "(a key)"
            found = surrogate_path(item, inner)
            if found is not None:
                return found
    return None


def has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
