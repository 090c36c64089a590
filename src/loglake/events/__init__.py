"""ICRC-72 pub/sub with ICRC-77 event replay (issue 6).

Four sans-I/O roles (``orchestrator``, ``broadcaster``, ``publisher``, ``subscriber``), their
messages and Candid codecs, and an aiohttp adapter that serves each role in its own process.
See docs/events.md.
"""
