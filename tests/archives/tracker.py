"""A minimal HTTP BitTorrent tracker (BEP 3 announce, BEP 23 compact peers) for tests.

aria2c ignores ``x.pe`` peer hints in magnets, so it needs a tracker to find our seeder; this
one remembers ``(127.0.0.1, port)`` per info-hash and answers with the others. Loopback only.
"""

from __future__ import annotations

import socket
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from loglake.archives.torrent import bencode


class Tracker:
    def __init__(self) -> None:
        self.peers: dict[bytes, set[tuple[str, int]]] = {}
        self.announces = 0
        tracker = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                q = parse_qs(url.query, keep_blank_values=True, encoding="latin-1")
                try:
                    ih = q["info_hash"][0].encode("latin-1")
                    port = int(q["port"][0])
                except (KeyError, ValueError):
                    body = bencode({"failure reason": "bad announce"})
                else:
                    tracker.announces += 1
                    me = ("127.0.0.1", port)
                    known = tracker.peers.setdefault(ih, set())
                    if q.get("event", [""])[0] == "stopped":
                        known.discard(me)
                    else:
                        known.add(me)
                    others = [p for p in known if p != me]
                    compact = b"".join(
                        socket.inet_aton(h) + struct.pack(">H", p) for h, p in others
                    )
                    body = bencode({"interval": 2, "min interval": 1, "peers": compact})
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # clients may hang up after a "stopped" announce

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/announce"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
