"""A signed Candid-over-HTTP client for the events roles (sync; for the CLI, tests, scripts).

Wire: ``POST <url>/api/<method>``, body = the Candid argument, ``content-type:
application/candid``, signature headers from :meth:`Identity.sign_call`. Replies: 200 with the
Candid result; 4xx/5xx with a text reason, raised as :class:`CallRejected`. A role that cannot
be reached (connection refused, no answer within the timeout, a name that does not resolve) is
:class:`RoleUnreachable`, naming the URL and the reason.
"""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from typing import Any

from loglake.errors import RemoteProtocolError, Unavailable
from loglake.events.codec import METHODS
from loglake.events.identity import Identity


class CallRejected(RemoteProtocolError):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"call rejected ({status}): {reason}")
        self.status, self.reason = status, reason


class RoleUnreachable(Unavailable):
    """No answer from the role at ``url``: why (refused, timed out, a name that does not
    resolve). Why typed: urllib's ``URLError`` reached the CLI user as a traceback. A call whose
    reply timed out may have been carried out (``Unavailable``)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot reach {url}: {reason}")
        self.url, self.reason = url, reason


def _reason(e: BaseException) -> str:
    """One line for why a connection failed: urllib wraps the socket's error in ``URLError``."""
    cause = e.reason if isinstance(e, urllib.error.URLError) else e
    if isinstance(cause, TimeoutError | socket.timeout):
        return "timed out (no answer)"
    if isinstance(cause, socket.gaierror):
        return f"host name not resolved ({cause.strerror or cause})"
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror.lower()
    return str(cause) or type(cause).__name__


def post_raw(url: str, method: str, body: bytes, headers: dict[str, str], timeout: float) -> bytes:
    req = urllib.request.Request(
        f"{url.rstrip('/')}/api/{method}",
        data=body,
        headers={"content-type": "application/candid", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read()
    except urllib.error.HTTPError as e:
        raise CallRejected(e.code, e.read().decode(errors="replace")) from None
    except (urllib.error.URLError, OSError) as e:  # refused, reset, timed out, not resolved
        raise RoleUnreachable(url, _reason(e)) from None


class HttpEventsClient:
    def __init__(self, url: str, identity: Identity, timeout: float = 30.0) -> None:
        self.url, self.identity, self.timeout = url, identity, timeout

    def call(self, method: str, arg: Any) -> Any:
        m = METHODS[method]
        body = m.encode_arg(arg)
        headers = self.identity.sign_call(method, body, time.time_ns())
        return m.decode_ret(post_raw(self.url, method, body, headers, self.timeout))
