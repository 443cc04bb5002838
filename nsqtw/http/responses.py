"""
NSQ's HTTP response shapes, shared by every daemon's klein app.

nsqd, nsqlookupd and nsqadmin answer in NSQ's "V1" envelope: a string is a
raw body, ``None`` an empty body, anything else JSON with
``Content-Type: application/json; charset=utf-8``; errors are
``{"message": "TEXT"}`` with their status; every V1 answer carries
``X-NSQ-Content-Type: nsq; version=1.0``.  Unknown paths and wrong methods
get NSQ's ``NOT_FOUND`` / ``METHOD_NOT_ALLOWED`` JSON instead of werkzeug's
HTML.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional
from urllib.parse import parse_qs, urlsplit

from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from werkzeug.exceptions import MethodNotAllowed, NotFound

from ..errors import HTTPAPIError
from ..stats.snapshot import go_json

__all__ = ["v1", "v1_error", "plain", "query", "install_error_handlers", "JSON_TYPE", "TEXT_TYPE"]

JSON_TYPE = b"application/json; charset=utf-8"
TEXT_TYPE = b"text/plain; charset=utf-8"
NSQ_TYPE = b"nsq; version=1.0"


def query(request: IRequest) -> Dict[str, List[str]]:
    """Query-string parameters only (nsqd never reads form bodies), as Go's ParseQuery."""
    raw = urlsplit(request.uri.decode("latin-1")).query
    return parse_qs(raw, keep_blank_values=True)


def first(params: Dict[str, List[str]], key: str) -> Optional[str]:
    values = params.get(key)
    return values[0] if values else None


def v1(request: IRequest, data: Any) -> bytes:
    """A 200 answer in the V1 envelope."""
    request.setHeader(b"X-NSQ-Content-Type", NSQ_TYPE)
    if data is None:
        return b""
    if isinstance(data, bytes):
        request.setHeader(b"Content-Type", TEXT_TYPE)
        return data
    if isinstance(data, str):
        request.setHeader(b"Content-Type", TEXT_TYPE)
        return data.encode()
    request.setHeader(b"Content-Type", JSON_TYPE)
    return go_json(data)


def v1_error(request: IRequest, status: int, text: str, extra: Optional[Dict[str, Any]] = None) -> bytes:
    request.setResponseCode(status)
    request.setHeader(b"Content-Type", JSON_TYPE)
    request.setHeader(b"X-NSQ-Content-Type", NSQ_TYPE)
    body: Dict[str, Any] = {"message": text}
    if extra:
        body.update(extra)
    return go_json(body)


def plain(request: IRequest, text: str, status: int = 200) -> bytes:
    """NSQ's PlainText decorator (``/ping``): no V1 header."""
    request.setResponseCode(status)
    request.setHeader(b"Content-Type", TEXT_TYPE)
    return text.encode()


def install_error_handlers(app: Any) -> None:
    """Map HTTPAPIError, unknown routes, wrong methods and crashes onto NSQ's JSON errors."""

    @app.handle_errors(HTTPAPIError)
    def _api_error(instance: Any, request: IRequest, failure: Failure) -> bytes:
        err = failure.value
        return v1_error(request, err.status, err.text, err.extra)

    @app.handle_errors(NotFound)
    def _not_found(instance: Any, request: IRequest, failure: Failure) -> bytes:
        return v1_error(request, 404, "NOT_FOUND")

    @app.handle_errors(MethodNotAllowed)
    def _bad_method(instance: Any, request: IRequest, failure: Failure) -> bytes:
        valid = set(failure.value.valid_methods or ())
        valid.discard("HEAD")
        valid.add("OPTIONS")
        request.setHeader(b"Allow", ", ".join(sorted(valid)).encode())
        return v1_error(request, 405, "METHOD_NOT_ALLOWED")

    @app.handle_errors(Exception)
    def _crash(instance: Any, request: IRequest, failure: Failure) -> bytes:
        from twisted.logger import Logger
        Logger(namespace="nsqtw.http").failure("unhandled error in HTTP handler", failure)
        return v1_error(request, 500, "INTERNAL_ERROR")
