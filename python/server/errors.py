"""OpenAI-shaped error bodies: {"error": {"message", "type", "param", "code"}} with the right status,
for every failure including schema validation; never a stack trace. Under /v1/messages (Anthropic's
API) the body also has Anthropic's top-level `"type": "error"`: its clients read error.type and
error.message, which both shapes share."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
         405: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error", 422: "invalid_request_error",
         503: "server_error", 500: "server_error"}


ANTHROPIC = "/v1/messages"  # the paths whose errors carry Anthropic's "type": "error"


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_body(status: int, message: str, param: str | None = None, code: str | None = None, anthropic: bool = False) -> dict:
    body = {"error": {"message": message, "type": TYPES.get(status, "invalid_request_error"), "param": param, "code": code}}
    return {"type": "error", **body} if anthropic else body


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   anthropic: bool = False) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code, anthropic), status_code=status)


def for_path(request: Request) -> bool:
    return request.url.path.startswith(ANTHROPIC)


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError):
        return error_response(error.status, error.message, error.param, error.code, for_path(request))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, error: RequestValidationError):
        problems = error.errors()
        first = problems[0] if problems else {}
        location = [str(p) for p in first.get("loc", []) if p != "body"]
        if first.get("type") == "json_invalid":
            return error_response(400, f"request body is not valid JSON: {first.get('ctx', {}).get('error', 'parse error')}", code="invalid_json",
                                  anthropic=for_path(request))
        param = ".".join(location) or None
        message = f"{param}: {first.get('msg', 'invalid value')}" if param else first.get("msg", "invalid request")
        if len(problems) > 1:
            message += f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})"
        return error_response(400, message, param=param, code="invalid_value", anthropic=for_path(request))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, error: StarletteHTTPException):
        return error_response(error.status_code, str(error.detail), anthropic=for_path(request))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception):
        return error_response(500, f"internal error ({type(error).__name__})", anthropic=for_path(request))
