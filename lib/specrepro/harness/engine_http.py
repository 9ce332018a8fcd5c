"""How the harness reaches an engine outside the load generator: small blocking HTTP calls,
readiness and version.

Design:
- The harness reaches engines over HTTP only (stdlib `urllib`: a few small blocking calls;
  the load generator has its own async client). Engine-neutral: an engine's routes are on
  its adapter (`Routes`, harness/engines/). Readiness routes are polled in order of
  preference, a 404 meaning the running version lacks one (`poll_ready`); the version is
  the first "version" a version route's JSON gives (`read_version`).
- Every call answers (status, body), status 0 where nothing answers: a caller decides what
  a silent engine means, nothing here raises.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


def _answer(request: str | urllib.request.Request, timeout: float) -> tuple[int, bytes]:
    """(status, body) of one request; status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return 0, b""


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of a GET; status 0 when nothing answers."""
    return _answer(url, timeout)


def http_post(url: str, body: bytes = b"{}", timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of a POST of a JSON body; status 0 when nothing answers."""
    return _answer(urllib.request.Request(url, data=body, method="POST",
                                          headers={"Content-Type": "application/json"}),
                   timeout)


def http_json(url: str, timeout: float = 5.0) -> Any:
    status, body = http_get(url, timeout)
    if status != 200:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


@dataclass(frozen=True)
class Routes:
    """Where an engine answers. `ready`: readiness routes in order of preference; one that
    answers 404 does not exist in the running version, and the next is polled. `version`:
    routes whose JSON carries a "version" field, tried in order."""

    ready: tuple[str, ...]
    version: tuple[str, ...]


READY_POLL_TIMEOUT_S = 5.0  # SGLang's /health_generate sleeps 1 s before it answers 200


def read_version(url: str, routes: Routes) -> str | None:
    """The first "version" a version route of the engine gives; None where none does."""
    for route in routes.version:
        body = http_json(f"{url}{route}")
        if isinstance(body, dict) and isinstance(body.get("version"), str):
            return body["version"]
    return None


def poll_ready(url: str, routes: Routes, start: int = 0) -> tuple[int, int]:
    """One readiness poll from route `start` on: (status, index of the route that gave it);
    a 404 moves on to the next route (the running version lacks it)."""
    i = start
    while True:
        status = http_get(url + routes.ready[i], timeout=READY_POLL_TIMEOUT_S)[0]
        if status != 404 or i + 1 == len(routes.ready):
            return status, i
        i += 1
