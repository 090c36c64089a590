"""The node's access token: generated on first start, printed once, kept mode 0600.

Why a single bearer token: the node binds loopback by default and serves one operator; a token
in a file only that user can read is the least machinery that keeps other local users (and a
browser tab on another site) out of the API. The token is compared in constant time
(``hmac.compare_digest``). ``TOKEN_FILE`` lives in the data dir, beside the log it guards.
"""

from __future__ import annotations

import contextlib
import hmac
import secrets
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from loglake.errors import LoglakeError
from loglake.log import fs

TOKEN_FILE = "node.token"
"""Name of the token file in the data dir."""
TOKEN_BYTES = 32
MIN_TOKEN_CHARS = 16
"""The shortest token a token file may hold. The node's own are 43 characters (``TOKEN_BYTES``
random bytes, base64url); an operator's own must be at least 16, which ``openssl rand -hex 8``
(64 random bits) already is: guessing one over HTTP then takes far longer than the node runs.
A one-character token used to be taken, and with it the API by whoever tried ``a``-``z``."""


class TokenFileError(LoglakeError):
    """The token file exists but cannot be used (unreadable, empty, shorter than
    ``MIN_TOKEN_CHARS``, or readable by others)."""


@dataclass(frozen=True, slots=True)
class Token:
    value: str
    created: bool
    """True when this start generated it (the caller prints it, once)."""
    path: Path


def load_or_create_token(data_dir: Path) -> Token:
    """The data dir's token, created (``O_EXCL``, mode 0600, fsynced) if there is none.

    A token file others may read is refused rather than silently used: whoever could read it
    could use the API."""
    path = Path(data_dir) / TOKEN_FILE
    value = secrets.token_urlsafe(TOKEN_BYTES)
    if not fs.create_exclusive(path, (value + "\n").encode()):
        return Token(_read_token(path), False, path)
    return Token(value, True, path)


def forget_token(path: Path) -> None:
    """Remove a token that was generated but never shown (the start failed before the banner),
    so the next start generates and prints one instead of pointing at a file nobody has read."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _read_token(path: Path) -> str:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise TokenFileError(
            f"{path} is readable by others (mode {mode:o}); run `chmod 600 {path}` or delete "
            "it to have a new token generated"
        )
    try:  # a binary file here stopped the node with a UnicodeDecodeError traceback
        value = path.read_bytes().decode("ascii").strip()
    except UnicodeDecodeError:
        raise TokenFileError(
            f"{path} is not a token (expected text); delete it to have a new token generated"
        ) from None
    if not value:
        raise TokenFileError(f"{path} is empty; delete it to have a new token generated")
    if len(value) < MIN_TOKEN_CHARS:
        raise TokenFileError(
            f"{path} holds a token of {len(value)} characters, shorter than {MIN_TOKEN_CHARS} "
            "(guessable); delete it to have a new token generated, or write a longer one"
        )
    return value


_bearer = HTTPBearer(auto_error=False, description="The token in <data dir>/node.token.")
UNAUTHORIZED = "missing or wrong bearer token (see <data dir>/node.token)"


def token_matches(given: str, expected: str) -> bool:
    """Whether a bearer token is the node's (compared in constant time): the routes'
    dependency and the HTTP gate (``node/gate.py``) both ask."""
    return hmac.compare_digest(given.encode(), expected.encode())


def require_token(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """FastAPI dependency: 401 unless ``Authorization: Bearer <token>`` matches the node's
    token (``app.state.token``; None turns the check off, for embedding and benchmarks)."""
    expected: str | None = request.app.state.token
    if expected is None:
        return
    given = credentials.credentials if credentials is not None else ""
    if not token_matches(given, expected):
        raise HTTPException(
            status_code=401, detail=UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"}
        )


LOGIN_TTL_S = 24 * 3600
"""How long a console login link the node printed stays good, if nobody opens it."""
MAX_LOGIN_CODES = 64


class LoginCodes:
    """One-time codes a console link carries instead of the token (``/console/#login=<code>``):
    the console trades one for the token once (``POST /console/login``), and a code is good
    once.

    Why: a link with the token itself (``#token=…``) left the token in the browser's history
    on disk, and in a synced history, though the console cleared its address bar; whoever
    read it had the API for good. A code in the history is spent by then."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._codes: dict[str, float] = {}  # code -> expiry, oldest first
        self._lock = threading.Lock()

    def issue(self, ttl_s: float = LOGIN_TTL_S) -> str:
        code = secrets.token_urlsafe(TOKEN_BYTES)
        with self._lock:
            self._codes[code] = self._clock() + ttl_s
            while len(self._codes) > MAX_LOGIN_CODES:
                del self._codes[next(iter(self._codes))]
        return code

    def redeem(self, code: str) -> bool:
        with self._lock:
            expiry = None
            for known in list(self._codes):  # compared in constant time, each
                if hmac.compare_digest(known.encode(), code.encode()):
                    expiry = self._codes.pop(known)
            return expiry is not None and self._clock() < expiry
