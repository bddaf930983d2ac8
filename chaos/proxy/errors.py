"""API errors with Toxiproxy 2.x's messages and HTTP status codes (``api.go``).

The JSON body of an error is ``{"error": <message>, "status": <code>}``.
"""

from __future__ import annotations

from pydantic import ValidationError


class ApiError(Exception):
    """An error the API reports to the caller as ``{"error": message, "status": status}``."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def joined(self, detail: str) -> ApiError:
        """Return a copy whose message is ``"<message>: <detail>"`` (Toxiproxy's joinError)."""
        return ApiError(f"{self.message}: {detail}", self.status)

    def body(self) -> dict[str, object]:
        """Return the JSON body of the error response."""
        return {"error": self.message, "status": self.status}


BAD_REQUEST_BODY = ApiError("bad request body", 400)
MISSING_FIELD = ApiError("missing required field", 400)
PROXY_NOT_FOUND = ApiError("proxy not found", 404)
PROXY_ALREADY_EXISTS = ApiError("proxy already exists", 409)
INVALID_STREAM = ApiError("stream was invalid, can be either upstream or downstream", 400)
INVALID_TOXIC_TYPE = ApiError("invalid toxic type", 400)
TOXIC_ALREADY_EXISTS = ApiError("toxic already exists", 409)
TOXIC_NOT_FOUND = ApiError("toxic not found", 404)
# Toxiproxy reports a failed listen (address in use, bad address) as an error "without a
# status code", i.e. HTTP 500, with Go's net error text such as
# "listen tcp 127.0.0.1:8080: bind: address already in use".
LISTEN_FAILED_STATUS = 500
# Our addition (no Toxiproxy equivalent): a proxy listen address off loopback without
# --allow-remote.
REMOTE_LISTEN_REFUSED = ApiError(
    "listen address is not loopback; start the server with --allow-remote to allow it", 400)


def describe(exc: ValidationError) -> str:
    """Return ``"field: problem (got value); ..."`` for each error of a pydantic ``exc``."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "body"
        got = err.get("input")
        shown = err["type"] != "missing" and got is not None and not isinstance(got, dict)
        parts.append(f"{where}: {err['msg']}" + (f" (got {got!r})" if shown else ""))
    return "; ".join(parts)
