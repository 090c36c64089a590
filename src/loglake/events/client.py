"""A signed Candid-over-HTTP client for the events roles (sync; for the CLI, tests, scripts).

Wire: ``POST <url>/api/<method>``, body = the Candid argument, ``content-type:
application/candid``, signature headers from :meth:`Identity.sign_call`. Replies: 200 with the
Candid result; 4xx/5xx with a text reason, raised as :class:`CallRejected`. A role that cannot
be reached (connection refused, no answer within the timeout, a name that does not resolve, a
URL that is not ``http(s)://host:port``), or that drops the connection before its reply ends,
is :class:`RoleUnreachable`, naming the URL and the reason. Something that answers but not
with a reply (not HTTP, a 200 whose body is not the method's Candid result, a body over
:data:`MAX_REPLY_BYTES`) is :class:`BadReply`.
:class:`InboxReader` reads a subscriber's inbox at least once (``loglake_inbox``'s cursor).
"""

from __future__ import annotations

import http.client
import logging
import socket
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from loglake.errors import DecodeError, RemoteProtocolError, Unavailable
from loglake.events.codec import METHODS
from loglake.events.identity import Identity
from loglake.events.messages import EventNotification, InboxPage

log = logging.getLogger("loglake.events")


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


class BadReply(RemoteProtocolError):
    """Something answered at ``url`` but not with a reply to the call: bytes that are not HTTP
    (another service on the port), a body that is not the method's Candid result, or one over
    the size limit. Why typed: ``http.client``'s ``BadStatusLine`` reached the CLI user as a
    traceback. The call may have been carried out."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"bad reply from {url}: {reason}")
        self.url, self.reason = url, reason


MAX_REPLY_BYTES = 256 * 1024 * 1024
"""The longest reply body a call reads; a longer one is refused (from its ``Content-Length``
before a byte of it is read, else once the limit is passed) so a wrong or hostile server cannot
make a client hold gigabytes. The longest legitimate replies are the inbox's and the event
reads': an event carries at most ``publisher.MAX_MESSAGE_BYTES`` (1 MB) of data, so the CLI's
default ``--take 100`` stays under 100 MB."""
MAX_REASON_BYTES = 64 * 1024
"""The most of a 4xx/5xx body read as the rejection's reason (a role writes one short line)."""


def _read_reply(resp: http.client.HTTPResponse, url: str, limit: int) -> bytes:
    """The reply's body, at most ``limit`` bytes, else :class:`BadReply`. With a
    ``Content-Length`` the whole body is read (a short one raises ``IncompleteRead``); without
    one (chunked, or up to the close) ``limit + 1`` bytes at most."""
    length = resp.getheader("content-length")
    if length is not None and length.strip().isdigit() and int(length) > limit:
        raise BadReply(url, f"a reply of {int(length)} bytes, over the limit of {limit}")
    data = resp.read() if resp.length is not None else resp.read(limit + 1)
    if len(data) > limit:
        raise BadReply(url, f"a reply of more than {limit} bytes, over the limit")
    return data


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


URL_FORM = "http(s)://host:port"
"""What a role's URL looks like (a path after it is kept: calls go to ``<url>/api/<method>``)."""


def url_problem(url: str) -> str | None:
    """Why ``url`` is not a role's URL (``URL_FORM``), or None: no http or https scheme, no
    host, a port that is not 1-65535, a bracketed IPv6 host left open. The one check of
    ``post_raw`` and of the CLI's ``--url``."""
    try:
        u = urlsplit(url)
        port = u.port  # a ValueError for a port that is not a number from 0 to 65535
    except ValueError as e:  # "Invalid IPv6 URL", "Port out of range 0-65535", ...
        return str(e)
    if u.scheme not in ("http", "https"):
        return f"the scheme is {u.scheme!r}, not http or https" if u.scheme else "no scheme"
    if not u.hostname:
        return "no host"
    if port == 0:
        return "port 0"
    return None


def post_raw(
    url: str,
    method: str,
    body: bytes,
    headers: dict[str, str],
    timeout: float,
    max_reply_bytes: int = MAX_REPLY_BYTES,
) -> bytes:
    """``body`` posted to ``<url>/api/<method>``: the reply's body, else one of this module's
    typed errors. A ``url`` that is not ``URL_FORM`` is :class:`RoleUnreachable` (urllib's
    ``ValueError`` reached the CLI user as a traceback)."""
    why = url_problem(url)
    if why is not None:
        raise RoleUnreachable(url, f"not an {URL_FORM} URL ({why})")
    try:
        req = urllib.request.Request(
            f"{url.rstrip('/')}/api/{method}",
            data=body,
            headers={"content-type": "application/candid", **headers},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return _read_reply(resp, url, max_reply_bytes)
    except urllib.error.HTTPError as e:
        raise CallRejected(e.code, e.read(MAX_REASON_BYTES).decode(errors="replace")) from None
    except http.client.RemoteDisconnected:  # accepted, then closed without a byte
        raise RoleUnreachable(url, "closed the connection without a reply") from None
    except http.client.IncompleteRead as e:
        got, short = len(e.partial), e.expected or 0
        why = f"the connection closed mid-reply ({got} of {got + short} bytes)"
        raise RoleUnreachable(url, why) from None
    except (urllib.error.URLError, OSError) as e:  # refused, reset, timed out, not resolved
        raise RoleUnreachable(url, _reason(e)) from None
    except (http.client.InvalidURL, ValueError) as e:  # a host with a space, a control byte
        raise RoleUnreachable(url, f"not an {URL_FORM} URL ({e})") from None
    except http.client.HTTPException as e:  # BadStatusLine, LineTooLong, ...: not HTTP
        raise BadReply(url, f"not an HTTP reply ({type(e).__name__}: {str(e)[:80]!r})") from None


class HttpEventsClient:
    def __init__(self, url: str, identity: Identity, timeout: float = 30.0) -> None:
        self.url, self.identity, self.timeout = url, identity, timeout

    def call(self, method: str, arg: Any) -> Any:
        m = METHODS[method]
        body = m.encode_arg(arg)
        headers = self.identity.sign_call(method, body, time.time_ns())
        reply = post_raw(self.url, method, body, headers, self.timeout)
        try:
            return m.decode_ret(reply)
        except DecodeError as e:
            raise BadReply(self.url, f"{method}: not its Candid result ({e})") from e


class InboxReader:
    """Reads a subscriber's inbox (``loglake_inbox``) at least once: each read acknowledges the
    page the previous read returned, and the subscriber removes a notification only once it is
    acknowledged — a reply that never arrived (too long, cut off, timed out) comes again with
    the next read. Keep one reader for as long as you read: a new one starts by acknowledging
    nothing, so it gets again what the last one read but did not acknowledge."""

    def __init__(self, client: HttpEventsClient) -> None:
        self.client = client
        self.cursor = 0
        """What to acknowledge: the cursor of the last page read (0: nothing)."""

    def read(self, n: int) -> list[EventNotification]:
        """The oldest ``n`` notifications not read yet (fewer when the subscriber's reply
        budget is reached first; at least one if any are held and ``n`` >= 1)."""
        try:
            page: InboxPage = self.client.call("loglake_inbox", (self.cursor, n))
        except CallRejected as e:
            # a cursor past the inbox's numbers (the subscriber restarted with its clock set
            # back, or it is another subscriber's): every read would be refused; start over
            # from acknowledging nothing, so what is held is read again (at least once)
            if not (self.cursor and e.status == 400 and "InboxCursorError" in e.reason):
                raise
            log.warning("inbox cursor %d refused (%s): reading from the start", self.cursor, e)
            self.cursor = 0
            page = self.client.call("loglake_inbox", (0, n))
        self.cursor = page.cursor
        return page.notes

    def acknowledge(self) -> None:
        """Have the subscriber remove what the last read returned (a reader about to stop)."""
        self.read(0)
