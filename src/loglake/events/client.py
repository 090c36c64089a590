"""A signed Candid-over-HTTP client for the events roles (sync; for the CLI, tests, scripts).

Wire: ``POST <url>/api/<method>``, body = the Candid argument, ``content-type:
application/candid``, signature headers from :meth:`Identity.sign_call`. Replies: 200 with the
Candid result; 4xx/5xx with a text reason, raised as :class:`CallRejected`.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Any

from loglake.errors import RemoteProtocolError
from loglake.events.codec import METHODS
from loglake.events.identity import Identity


class CallRejected(RemoteProtocolError):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"call rejected ({status}): {reason}")
        self.status, self.reason = status, reason


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


class HttpEventsClient:
    def __init__(self, url: str, identity: Identity, timeout: float = 30.0) -> None:
        self.url, self.identity, self.timeout = url, identity, timeout

    def call(self, method: str, arg: Any) -> Any:
        m = METHODS[method]
        body = m.encode_arg(arg)
        headers = self.identity.sign_call(method, body, time.time_ns())
        return m.decode_ret(post_raw(self.url, method, body, headers, self.timeout))
