"""The event loop loglake's servers run on: uvloop where it is installed, asyncio's own otherwise.

Why: since the server answers a lone push on the event loop, an acknowledged push is Python steps
on one thread plus the fsync, and a good part of those steps is asyncio's selector loop and its
transports (a wake-up, a ``recv_into``, a ``send`` per push). uvloop runs that part in C on
libuv, with the same API (``BufferedProtocol``, TLS, signal handlers, executors, thread-safe
callbacks), so the servers need no change. Chosen by measuring: six alternating pairs of 3,000
one-by-one 1 KB pushes to ``loglake serve`` on the project's 2-core VM.

``LOGLAKE_EVENT_LOOP=asyncio`` keeps asyncio's loop (to rule the loop out when chasing a bug);
``uvloop`` or unset uses uvloop when it imports.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from loglake.errors import LoglakeError

_T = TypeVar("_T")

ENV = "LOGLAKE_EVENT_LOOP"


class EventLoopChoiceError(LoglakeError, ValueError):
    """``LOGLAKE_EVENT_LOOP`` names no loop, or uvloop is asked for and does not import."""


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes a new loop: ``uvloop.new_event_loop`` unless the environment says asyncio,
    or says nothing and uvloop is not installed (it has no Windows build)."""
    choice = os.environ.get(ENV, "").strip().lower()
    if choice not in ("", "uvloop", "asyncio"):
        raise EventLoopChoiceError(f"{ENV} must be 'uvloop' or 'asyncio', not {choice!r}")
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:  # uvloop is a dependency where it builds
            if choice == "uvloop":
                raise EventLoopChoiceError(f"{ENV}=uvloop, but uvloop is not installed") from None
        else:
            return uvloop.new_event_loop
    return asyncio.new_event_loop


def new_event_loop() -> asyncio.AbstractEventLoop:
    return loop_factory()()


def run(main: Coroutine[Any, Any, _T]) -> _T:
    """``asyncio.run`` on :func:`new_event_loop`'s kind of loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
