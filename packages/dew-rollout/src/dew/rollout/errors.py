"""Named errors of dew-rollout's HTTP clients and weight publishers.

Every failure an engine can cause maps to one of these, with the URL it came from, so a
trainer can tell a refused push from a dead replica and none of them surfaces as a bare
httpx exception or a hang.
"""

from __future__ import annotations

from collections.abc import Mapping


class EngineError(RuntimeError):
    """An inference engine did not do what was asked. `url` names the endpoint."""

    def __init__(self, message: str, url: str = "") -> None:
        super().__init__(f"{url}: {message}" if url else message)
        self.url = url


class EngineUnreachable(EngineError):
    """The connection to the engine failed (refused, reset, DNS)."""


class EngineTimeout(EngineError):
    """The engine did not answer within the client's timeout."""


class EngineHTTPError(EngineError):
    """The engine answered with a non-success HTTP status. `status` holds it."""

    def __init__(self, message: str, url: str = "", status: int = 0) -> None:
        super().__init__(message, url)
        self.status = status


class MalformedResponse(EngineError):
    """The engine answered, but not with the JSON fields this client reads."""


class EngineRefused(EngineError):
    """The engine answered HTTP 200 but reported `success: false`."""


class SamplingRefused(ValueError):
    """A `Sampling` whose likelihoods the chosen engine route cannot report faithfully."""


class PushFailed(RuntimeError):
    """A weight push did not reach every replica; the served version did not move.

    `failures` maps each failed replica's root URL to its error.
    """

    def __init__(self, version: int, failures: Mapping[str, BaseException]) -> None:
        detail = "; ".join(f"{url}: {error}" for url, error in failures.items())
        super().__init__(
            f"push of version {version} failed on {len(failures)} replica(s): {detail}"
        )
        self.version = version
        self.failures = dict(failures)
