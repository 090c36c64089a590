"""The ``--backend`` URL (``nats://h1:4222,h2:4222,h3:4222``): split into servers and checked.

A module of its own, importing neither nats-py nor the JetStream log, so every command with a
``--backend`` option (``serve``, ``node walkthrough``, ``job seal``, ``cardinal consume``) and the
node's config check the URL the same way before anything starts, without paying for those
imports at startup."""

from __future__ import annotations

import urllib.parse
from typing import Any

import click

URL_SCHEMES = ("nats", "tls", "ws", "wss")
"""The schemes nats-py dials."""


def split_servers(url: str) -> tuple[str, ...]:
    """The servers of ``nats://h1:4222,h2:4222`` (``nats://user:pass@h…`` and ``tls://`` kept;
    a server without a scheme takes the one before it)."""
    parts = [p.strip() for p in url.split(",") if p.strip()]
    scheme = "nats://"
    servers = []
    for p in parts:
        if "://" in p:
            scheme = p.split("://", 1)[0] + "://"
        else:
            p = scheme + p
        servers.append(p)
    if not servers:
        raise ValueError(f"no NATS server in {url!r}")
    return tuple(servers)


def check_url(url: str, bare: bool = False) -> str:
    """``url`` if it names NATS servers as ``--backend`` takes them (``nats://h1:4222,h2:4222``:
    the first with its scheme, one of ``URL_SCHEMES``, each with a host and a port from 1 to
    65535 if given); else ``ValueError`` saying what is expected. Why: ``--backend notaurl``
    was dialled as ``nats://notaurl`` for 5 s before failing with ``TimeoutError()``. With
    ``bare`` (the node's ``[streams] backend``, which has always taken ``h1:4222,h2:4222``),
    servers without a scheme are ``nats://`` ones, each with its port: a bare word is refused."""
    expected = "expected nats://HOST[:PORT][,HOST[:PORT]...] (or tls://, ws://, wss://)"
    first = url.split(",", 1)[0].strip()
    scheme_less = "://" not in first
    if scheme_less and not bare:
        raise ValueError(f"{url!r}: {expected}")
    if scheme_less:
        expected += " or HOST:PORT[,HOST:PORT...]"
    for server in split_servers(url):
        try:
            parsed = urllib.parse.urlsplit(server)
            good = parsed.scheme in URL_SCHEMES and bool(parsed.hostname)
            good = good and parsed.port != 0  # ValueError outside 0-65535 or not a number
            good = good and not (scheme_less and parsed.port is None)
        except ValueError:
            good = False
        if not good:
            shown = server.removeprefix("nats://") if scheme_less else server  # as written
            where = repr(shown) if shown == url.strip() else f"{shown!r} in {url!r}"
            raise ValueError(f"{where}: {expected}")
    return url


def backend_url(ctx: Any, param: Any, value: str | None) -> str | None:
    """The click callback of every ``--backend``: ``check_url`` as a usage error naming it."""
    if value is None:
        return None
    try:
        return check_url(value)
    except ValueError as e:
        raise click.BadParameter(str(e), ctx, param) from None
