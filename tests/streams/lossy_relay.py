"""A TCP relay on loopback between NATS clients and a real nats-server that loses chosen
requests on their way (the server never sees them, so nothing answers them), or sends them to
another subject (the server answers that one). What a client meets when nats-server stays
silent (a stream just made whose group has no leader yet: no server answers its info,
server/jetstream_api.go ``jsStreamInfoRequest``), or when a server that has not yet taken up a
stream just made answers "stream not found" for it, made deterministic: the relay meddles with
exactly the publishes it is told to, and passes every other byte unchanged."""

from __future__ import annotations

import collections
import contextlib
import socket
import threading

_PUBLISH = (b"PUB", b"HPUB")


class LossyRelay:
    """``LossyRelay("nats://127.0.0.1:4222")``: connect a client to ``url``. ``lose(subject,
    n)`` loses the next ``n`` publishes to ``subject``; ``redirect(subject, to, n)`` sends them
    to ``to`` instead (same reply subject and payload); every other publish goes through.
    ``seen[subject]`` counts the publishes to ``subject``, meddled with or not."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("nats://").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.seen: collections.Counter[str] = collections.Counter()
        self._rules: dict[str, tuple[int, str | None]] = {}
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"nats://127.0.0.1:{self._listener.getsockname()[1]}"
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def lose(self, subject: str, times: int = 1) -> None:
        with self._lock:
            self._rules[subject] = (times, None)

    def redirect(self, subject: str, to: str, times: int = 1) -> None:
        with self._lock:
            self._rules[subject] = (times, to)

    def pending(self, subject: str) -> int:
        """How many publishes to ``subject`` are still to be meddled with."""
        with self._lock:
            return self._rules.get(subject, (0, None))[0]

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self.upstream)
            self._socks += [client, server]
            threading.Thread(target=self._relay, args=(server, client, False), daemon=True).start()
            threading.Thread(target=self._relay, args=(client, server, True), daemon=True).start()

    def _relay(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        rest = b""
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if from_client:
                    data, rest = self._kept(rest + data)
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def _kept(self, buf: bytes) -> tuple[bytes, bytes]:
        """The whole client operations of ``buf`` that go on, and the incomplete rest. A publish
        is its line (``PUB <subject> [reply] <size>``, ``HPUB … <header size> <size>``) and
        ``size`` bytes of payload after it, each ended by CRLF."""
        out = []
        while (end := buf.find(b"\r\n")) >= 0:
            words = buf[:end].split()
            publish = bool(words) and words[0].upper() in _PUBLISH
            whole = end + 2 + (int(words[-1]) + 2 if publish else 0)
            if len(buf) < whole:
                break
            op, buf = buf[:whole], buf[whole:]
            if publish:
                subject = words[1].decode()
                with self._lock:
                    self.seen[subject] += 1
                    times, to = self._rules.get(subject, (0, None))
                    if times > 0:
                        self._rules[subject] = (times - 1, to)
                if times > 0:
                    if to is None:
                        continue
                    op = b" ".join([words[0], to.encode(), *words[2:]]) + op[end:]
            out.append(op)
        return b"".join(out), buf

    def close(self) -> None:
        self._listener.close()
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.close()

    def __enter__(self) -> LossyRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
