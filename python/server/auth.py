"""The API key on /v1/* (and /tokenize, /detokenize), as a plain ASGI middleware: Starlette's BaseHTTPMiddleware (what
`@app.middleware("http")` builds) hides a client's disconnect from the endpoint below it."""
from __future__ import annotations

import secrets

from .errors import ANTHROPIC, error_response

KEYED = ("/tokenize", "/detokenize")  # beside /v1/*: they run the tokenizer and the chat template


class ApiKey:
    def __init__(self, app, key: str | None):
        self.app = app
        self.key = key.encode() if key else None

    async def __call__(self, scope, receive, send):
        if self.key is None or scope["type"] != "http" or not (scope["path"].startswith("/v1/") or scope["path"] in KEYED):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        header = headers.get(b"authorization", b"")
        # Anthropic's clients send the key as x-api-key (Claude Code: Authorization with an auth token).
        token = header[7:] if header[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
        if secrets.compare_digest(token, self.key):
            return await self.app(scope, receive, send)
        message = "missing API key" if not header and b"x-api-key" not in headers else "invalid API key"
        await error_response(401, message, code="invalid_api_key", anthropic=scope["path"].startswith(ANTHROPIC))(scope, receive, send)
