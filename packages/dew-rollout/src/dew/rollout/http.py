"""JSON over httpx with every failure turned into a named `EngineError`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx

from dew.rollout.errors import (
    EngineHTTPError,
    EngineRefused,
    EngineTimeout,
    EngineUnreachable,
    MalformedResponse,
)


def post_json(
    client: httpx.Client,
    url: str,
    body: Mapping[str, Any] | None = None,
    *,
    params: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    ok: tuple[int, ...] = (200,),
) -> Any:
    """POST `body` as JSON to `url` and return the decoded answer.

    Raises `EngineTimeout`, `EngineUnreachable`, `EngineHTTPError` (any status outside
    `ok`, with the start of the body) or `MalformedResponse` (a body that is not JSON).
    An empty body decodes to None. `timeout` overrides the client's for this call.
    """
    json_body = dict(body) if body is not None else None
    return request_json(client, "POST", url, json_body, params=params, timeout=timeout, ok=ok)


def get_json(
    client: httpx.Client,
    url: str,
    *,
    params: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    ok: tuple[int, ...] = (200,),
) -> Any:
    """GET `url` and return the decoded answer, with `post_json`'s named errors."""
    return request_json(client, "GET", url, None, params=params, timeout=timeout, ok=ok)


def request_json(
    client: httpx.Client,
    method: str,
    url: str,
    body: Any = None,
    *,
    params: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    ok: tuple[int, ...] = (200,),
) -> Any:
    """One request with a JSON body (None: no body); the answer decoded as JSON.

    Every failure is a named `EngineError` (see `post_json`)."""
    response, full = send(client, method, url, body, params=params, timeout=timeout, ok=ok)
    if not response.content.strip():
        return None
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise MalformedResponse(
            f"expected a JSON body, got {response.text[:200]!r}", full
        ) from error


def send(
    client: httpx.Client,
    method: str,
    url: str,
    body: Any = None,
    *,
    params: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    ok: tuple[int, ...] = (200,),
) -> tuple[httpx.Response, str]:
    """One request with a JSON body (None: no body): `(response, full URL)`, the
    response's status one of `ok`. Raises `EngineTimeout`, `EngineUnreachable` or
    `EngineHTTPError` (naming the status and the start of the body) otherwise."""
    extra: dict[str, Any] = {}
    if timeout is not None:
        extra["timeout"] = timeout
    full = str(client.base_url.join(url)) if client.base_url else url
    try:
        response = client.request(method, url, json=body, params=params, **extra)
    except httpx.TimeoutException as error:
        raise EngineTimeout(f"no answer in time ({type(error).__name__})", full) from error
    except httpx.TransportError as error:
        raise EngineUnreachable(f"connection failed ({error!r})", full) from error
    if response.status_code not in ok:
        raise EngineHTTPError(
            f"HTTP {response.status_code}: {response.text[:300]!r}", full, response.status_code
        )
    return response, full


def require_success(payload: Any, url: str) -> None:
    """Refuse an answer that says `success: false` (or lacks a true `success`)."""
    if not isinstance(payload, Mapping) or "success" not in payload:
        raise MalformedResponse(f"expected a JSON object with 'success', got {payload!r}", url)
    if payload["success"] is not True:
        message = payload.get("message", "")
        raise EngineRefused(f"answered success={payload['success']!r} {message}".rstrip(), url)


def field(payload: Any, name: str, url: str, kind: type | tuple[type, ...] = object) -> Any:
    """`payload[name]`, refused by name when absent or of the wrong type."""
    if not isinstance(payload, Mapping) or name not in payload:
        raise MalformedResponse(f"expected a JSON object with {name!r}, got {payload!r:.200}", url)
    value = payload[name]
    if not isinstance(value, kind):
        raise MalformedResponse(f"field {name!r}: expected {kind}, got {type(value).__name__}", url)
    return value
