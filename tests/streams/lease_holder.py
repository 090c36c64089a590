"""A lease contender as its own process, for the lease tests: it contends for one lease on a
NATS cluster and reports on stdout; commands come on stdin, one a line.

    python -m tests.streams.lease_holder URLS BUCKET NAME HOLDER TTL

stdout: ``ready``, ``acquired <token>``, ``lost <token> <reason>``, and one answer per command.
stdin: ``fence`` (→ ``fence <token>`` or ``error <Type>``), ``put KEY VALUE``,
``putfenced TOKEN KEY VALUE`` (→ ``ok <revision>`` or ``error <Type>``), ``get KEY``
(→ ``value <v>``, ``-`` if none), ``release``."""

from __future__ import annotations

import asyncio
import sys

import nats

from loglake.streams.lease import Acquired, JetStreamLease, lease_bucket


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(urls: str, bucket: str, name: str, holder: str, ttl: int) -> None:
    nc = await nats.connect(urls.split(","), connect_timeout=2, max_reconnect_attempts=-1)
    js = nc.jetstream()
    replicas = min(3, len(urls.split(",")))
    await lease_bucket(js, bucket, replicas=replicas)

    def on_change(event) -> None:
        if isinstance(event, Acquired):
            say(f"acquired {event.token}")
        else:
            say(f"lost {event.token} {event.reason}")

    lease = await JetStreamLease(
        js, bucket, name, holder, ttl=ttl, replicas=replicas, on_change=on_change
    ).start()
    say("ready")
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        cmd, *args = line.split()
        try:
            if cmd == "fence":
                say(f"fence {lease.fence()}")
            elif cmd == "put":
                say(f"ok {await lease.put(args[0], args[1].encode())}")
            elif cmd == "putfenced":
                say(f"ok {await lease.put_fenced(args[1], args[2].encode(), int(args[0]))}")
            elif cmd == "get":
                value = await lease.get(args[0])
                say(f"value {value.decode() if value is not None else '-'}")
            elif cmd == "release":
                await lease.release()
                say("released")
        except Exception as e:  # the test reads the type
            say(f"error {type(e).__name__} {e}")
    await lease.close()
    await nc.close()


if __name__ == "__main__":
    urls, bucket, name, holder, ttl = sys.argv[1:6]
    asyncio.run(main(urls, bucket, name, holder, int(ttl)))
