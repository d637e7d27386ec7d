"""OpenAI-style error responses: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """An error the client caused (or must wait out), sent as an OpenAI error body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body OpenAI clients parse."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> APIError:
    """400: the request is well-formed but asks for something invalid or unsupported."""
    return APIError(400, message, param=param, code=code)


def unauthorized() -> APIError:
    """401: a key is required and the request lacks it or has the wrong one."""
    return APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                    code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def not_found(message: str, *, code: str = "not_found", param: str | None = None) -> APIError:
    """404: no such route or model."""
    return APIError(404, message, code=code, param=param)


def overloaded(retry_after: int) -> APIError:
    """503 with ``Retry-After``: the request queue is full."""
    return APIError(503, "the server is busy: the request queue is full, retry later",
                    type="server_error", code="queue_full",
                    headers={"Retry-After": str(retry_after)})


def shutting_down() -> APIError:
    """503: the server is stopping and will not run this request."""
    return APIError(503, "the server is shutting down", type="server_error", code="shutting_down")


def backend_lost(reason: str) -> APIError:
    """503: the model's RPC worker is gone; this server exits next (a supervisor restarts it)."""
    return APIError(503, f"{reason}; the server is exiting (it must be restarted)",
                    type="server_error", code="backend_unavailable")


def internal() -> APIError:
    """500 without details (the traceback goes to the server's log, never to the client)."""
    return APIError(500, "internal server error (see the server log)", type="server_error",
                    code="internal_error")
