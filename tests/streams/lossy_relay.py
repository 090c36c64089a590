"""A TCP relay on loopback between NATS clients and a real nats-server that loses chosen
requests on their way: the server never sees them, so nothing answers them. What a client meets
when nats-server stays silent (a stream just made whose group has no leader yet: no server
answers its info, server/jetstream_api.go ``jsStreamInfoRequest``), made deterministic: the
relay drops exactly the publishes it is told to, and passes every other byte unchanged."""

from __future__ import annotations

import contextlib
import socket
import threading

_PUBLISH = (b"PUB", b"HPUB")


class LossyRelay:
    """``LossyRelay("nats://127.0.0.1:4222", subject)``: connect a client to ``url``; the next
    ``drop`` publishes to ``subject`` (0 until set) are lost, the rest go through. ``seen``
    counts every publish to ``subject``, lost or not."""

    def __init__(self, upstream: str, subject: str) -> None:
        host, port = upstream.removeprefix("nats://").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.subject = subject
        self.drop = 0
        self.seen = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"nats://127.0.0.1:{self._listener.getsockname()[1]}"
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

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
            if publish and words[1].decode() == self.subject:
                self.seen += 1
                if self.drop > 0:
                    self.drop -= 1
                    continue
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
