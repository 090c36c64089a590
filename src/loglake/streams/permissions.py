"""Who may do what on the stream service: a peer's names, grants of per-stream permissions.

The Ockam stream spec has no access control (its hub relies on Ockam secure channels); loglake
authenticates TCP clients with TLS client certificates (``streams/tls.py``) and authorises each
request here, in the sans-I/O core's terms: a ``Peer`` (the names its verified certificate
carries) and a stream name in, allowed or not out. No I/O except ``AccessPolicy.load``.

The access file (TOML, or JSON of the same shape) given to ``loglake serve --access FILE``:

    [[grant]]
    identities = ["cn:ingest", "dns:ingest.example.org"]
    streams = ["orders", "orders.*"]
    allow = ["write"]

    [[grant]]
    identities = ["*"]                # any client with a verified certificate
    streams = ["public.*"]
    allow = ["read"]

- ``identities``: ``cn:<subject common name>``, ``dns:``/``uri:``/``email:``/``ip:<subject
  alternative name>``; ``*`` is any client whose certificate verified; ``anonymous`` is a client
  without one (plain TCP, or TLS without ``--tls-client-ca``).
- ``streams``: shell-style patterns over the stream name (``*``, ``?``, ``[seq]``; case matters).
- ``allow``: ``read`` (pull; get consumer indexes, and save those of consumers the peer owns or
  that nobody owns yet), ``write`` (push), ``consume`` (get and save the consumer indexes of
  client ids matching ``clients``, whoever owns them), ``admin`` (create a new stream, reset or
  delete a consumer's index; implies read and write). Any of them lets a peer see the stream
  (stream info, and the CREATE that opens an existing stream to learn its worker addresses).
- ``clients`` (optional, for ``consume``): shell-style patterns over the client id; default
  ``["*"]``, every client id.

    [[grant]]
    identities = ["cn:replayer"]
    streams = ["orders"]
    clients = ["billing-*"]
    allow = ["consume"]

A consumer (client id) belongs to the identity that first saved its index under an access file
(``Peer.label``: the certificate's ``cn:…``, else its first name; anonymous clients share the
one owner ``anonymous``); the owner is kept durably with the index.

Grants add up; there is no deny. Without an access file every peer may do everything (the
loopback default). What each request needs is in ``NEEDS``.
"""

from __future__ import annotations

import enum
import fnmatch
import json
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loglake.errors import LocalProtocolError
from loglake.streams.reply_codes import PERMISSION_DENIED


class AccessConfigError(LocalProtocolError):
    """The access file is not valid (its path and what is wrong are the message)."""


class Permission(enum.Enum):
    READ = "read"
    WRITE = "write"
    ADMIN = "admin"
    CONSUME = "consume"


NEEDS = {
    "create": Permission.ADMIN,
    "push to": Permission.WRITE,
    "pull from": Permission.READ,
    "get the consumer index of": Permission.READ,
    "save the consumer index of": Permission.READ,
    "reset the consumer index of": Permission.ADMIN,
}
"""The permission each refused action names in its error reply."""

NO_OWNERS_BANNER = (
    "no --access file: consumers belong to no one — any client can save, and so move, any "
    "consumer's index (docs/security.md)"
)
"""The startup banner's line when there is no access policy: the exposure, in one line."""
ANY_VERIFIED = "*"
ANONYMOUS_NAME = "anonymous"
_PREFIXES = ("cn:", "dns:", "uri:", "email:", "ip:")
_CACHE_MAX = 65_536


@dataclass(frozen=True, slots=True)
class Peer:
    """The other end of a connection: the names it proved (``cn:…``, ``dns:…``, ``*``)."""

    names: frozenset[str]

    @property
    def label(self) -> str:
        """How error replies and logs name the peer: its common name, else any name."""
        named = sorted(n for n in self.names if n != ANY_VERIFIED)
        cns = [n for n in named if n.startswith("cn:")]
        return (cns or named or [ANONYMOUS_NAME])[0]


ANONYMOUS = Peer(frozenset({ANONYMOUS_NAME}))


def peer_from_certificate(cert: Mapping[str, Any] | None) -> Peer:
    """The ``Peer`` of a verified certificate as ``ssl.SSLSocket.getpeercert()`` gives it
    (``None`` or ``{}``: no certificate, anonymous)."""
    if not cert:
        return ANONYMOUS
    names = {ANY_VERIFIED}
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                names.add(f"cn:{value}")
    kinds = {"DNS": "dns", "URI": "uri", "email": "email", "IP Address": "ip"}
    for kind, value in cert.get("subjectAltName", ()):
        if kind in kinds:
            names.add(f"{kinds[kind]}:{value}")
    return Peer(frozenset(names))


@dataclass(frozen=True, slots=True)
class Grant:
    identities: frozenset[str]
    streams: tuple[str, ...]
    allow: frozenset[Permission]
    _patterns: tuple[re.Pattern[str], ...] = ()
    clients: tuple[str, ...] = ("*",)
    _client_patterns: tuple[re.Pattern[str], ...] = ()

    def covers(self, stream: str) -> bool:
        return any(p.fullmatch(stream) for p in self._patterns)

    def covers_client(self, client_id: str) -> bool:
        return any(p.fullmatch(client_id) for p in self._client_patterns)


def grant(
    identities: Iterable[str],
    streams: Iterable[str],
    allow: Iterable[str],
    clients: Iterable[str] = ("*",),
) -> Grant:
    """A validated ``Grant`` (``AccessConfigError`` naming what is wrong)."""
    ids = frozenset(identities)
    for i in ids:
        if not isinstance(i, str) or not (
            i in (ANY_VERIFIED, ANONYMOUS_NAME) or i.startswith(_PREFIXES)
        ):
            raise AccessConfigError(
                f"identity {i!r}: expected '*', 'anonymous' or one of "
                f"{', '.join(p + '…' for p in _PREFIXES)}"
            )
    pats = tuple(streams)
    if not pats or not all(isinstance(p, str) and p for p in pats):
        raise AccessConfigError(f"streams {list(pats)!r}: give at least one non-empty pattern")
    perms = set()
    for a in allow:
        try:
            perms.add(Permission(a))
        except ValueError:
            raise AccessConfigError(
                f"allow {a!r}: expected read, write, consume or admin"
            ) from None
    if not perms:
        raise AccessConfigError("allow: give at least one of read, write, consume, admin")
    if Permission.ADMIN in perms:
        perms |= {Permission.READ, Permission.WRITE}
    compiled = tuple(re.compile(fnmatch.translate(p)) for p in pats)
    cpats = tuple(clients)
    if not cpats or not all(isinstance(p, str) and p for p in cpats):
        raise AccessConfigError(f"clients {list(cpats)!r}: give at least one non-empty pattern")
    ccompiled = tuple(re.compile(fnmatch.translate(p)) for p in cpats)
    return Grant(ids, pats, frozenset(perms), compiled, cpats, ccompiled)


class AccessPolicy:
    """Grants, and the answer to "may this peer do this to that stream" (cached per peer and
    stream; the cache is cleared when it reaches ``_CACHE_MAX`` entries)."""

    def __init__(self, grants: Iterable[Grant]) -> None:
        self.grants = tuple(grants)
        self._cache: dict[tuple[frozenset[str], str], frozenset[Permission]] = {}

    @classmethod
    def from_dict(cls, doc: object) -> AccessPolicy:
        if not isinstance(doc, dict) or set(doc) - {"grant"}:
            raise AccessConfigError("expected a document with only [[grant]] tables")
        grants = doc.get("grant", [])
        if not isinstance(grants, list):
            raise AccessConfigError("grant: expected a list of tables ([[grant]])")
        out = []
        for n, g in enumerate(grants, 1):
            needed = {"identities", "streams", "allow"}
            if not isinstance(g, dict) or not needed <= set(g) <= needed | {"clients"}:
                raise AccessConfigError(
                    f"grant {n}: expected identities, streams, allow (and optionally clients)"
                )
            if not all(isinstance(g[k], list) for k in g):
                raise AccessConfigError(
                    f"grant {n}: identities, streams, allow and clients are lists"
                )
            try:
                out.append(
                    grant(g["identities"], g["streams"], g["allow"], g.get("clients", ["*"]))
                )
            except AccessConfigError as e:
                raise AccessConfigError(f"grant {n}: {e}") from None
        return cls(out)

    @classmethod
    def load(cls, path: str | Path) -> AccessPolicy:
        """Read an access file: ``.json`` as JSON, anything else as TOML."""
        p = Path(path)
        try:
            text = p.read_text()
            doc = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
        except (OSError, ValueError) as e:  # JSONDecodeError and TOMLDecodeError are ValueErrors
            raise AccessConfigError(f"{p}: {e}") from None
        try:
            return cls.from_dict(doc)
        except AccessConfigError as e:
            raise AccessConfigError(f"{p}: {e}") from None

    def replace(self, other: AccessPolicy) -> None:
        """Take ``other``'s grants (a reloaded access file) in place, so the service holding
        this object applies them from its next request; answers cached under the old grants
        go. Call it on the thread that serves requests (``serve`` does, from its SIGHUP
        handler on the event loop)."""
        self.grants = other.grants
        self._cache = {}

    def permissions(self, peer: Peer, stream: str) -> frozenset[Permission]:
        key = (peer.names, stream)
        got = self._cache.get(key)
        if got is None:
            perms: set[Permission] = set()
            for g in self.grants:
                if g.identities & peer.names and g.covers(stream):
                    perms |= g.allow
            got = frozenset(perms)
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[key] = got
        return got

    def refusal(self, peer: Peer, action: str, stream: str) -> str | None:
        """None if ``peer`` may do ``action`` (a key of ``NEEDS``) to ``stream``, else the
        reason for the ``error`` reply, naming the peer, the action and the permission."""
        need = NEEDS[action]
        if need in self.permissions(peer, stream):
            return None
        return denied(peer, action, stream, need.value)

    def may_see(self, peer: Peer, stream: str) -> bool:
        return bool(self.permissions(peer, stream))

    def may_consume(self, peer: Peer, stream: str, client_id: str) -> bool:
        """Whether a ``consume`` grant lets ``peer`` save ``client_id``'s index on ``stream``
        whoever owns it (not cached: client ids are many, grants few)."""
        return any(
            Permission.CONSUME in g.allow
            and g.identities & peer.names
            and g.covers(stream)
            and g.covers_client(client_id)
            for g in self.grants
        )


def denied(peer: Peer, action: str, stream: str, need: str) -> str:
    return f"{PERMISSION_DENIED}: {peer.label} may not {action} stream {stream!r} (needs {need})"
