"""libtorrent adapters: seed the newest archive torrent, fetch index and chosen pieces.

Loopback-only settings, from FIELD-NOTES "BitTorrent" / "More on archives and BitTorrent": DHT,
LSD, UPnP and NAT-PMP off; uTP off (slow on loopback); several connections per IP allowed (every
peer is 127.0.0.1); ``min_reconnect_time`` low, because libtorrent drops the seed once the wanted
pieces are done and would wait 60 s to dial it again when more pieces are wanted. The fetcher
also keeps "redundant" connections (``close_redundant_connections`` off): a member hydrates an
archive before it wants the next one's pieces, and libtorrent 2.1 then closed the connection to
the seed and did not dial it again.

Selective fetch uses piece priorities only, never file priorities (file priorities are applied
asynchronously, override piece priorities, and park pieces of priority-0 files in a ``.parts``
file). The magnet is first resolved to metadata in ``upload_mode`` (no piece is requested), then
the torrent is re-added from that metadata with every piece at priority 0 except the ones asked
for — so no byte outside the plan is downloaded (the tests assert it).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import libtorrent as lt

from loglake.archives.errors import (
    ArchiveConfigError,
    BadMagnetLink,
    CorruptIndex,
    CorruptTorrent,
    TorrentTimeout,
)

METADATA_TIMEOUT_S = 20.0
"""status-go manager_archive.go ``DownloadHistoryArchivesByMagnetlink``: ``time.After(20 *
time.Second)`` for the torrent's info, then ``ErrTorrentTimedout``."""


def session(port: int = 0, interface: str = "127.0.0.1") -> lt.session:
    s = lt.session(
        {
            "listen_interfaces": f"{interface}:{port}",
            "enable_dht": False,
            "enable_lsd": False,
            "enable_upnp": False,
            "enable_natpmp": False,
            "enable_outgoing_utp": False,
            "enable_incoming_utp": False,
            "allow_multiple_connections_per_ip": True,
            "min_reconnect_time": 1,
            "alert_mask": lt.alert.category_t.error_notification
            | lt.alert.category_t.status_notification
            | lt.alert.category_t.storage_notification,
            "user_agent": "loglake-archives",
        }
    )
    return s


def listen_port(s: lt.session, timeout: float = 5.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = s.listen_port()
        if p:
            return p
        time.sleep(0.05)
    raise ArchiveConfigError("libtorrent did not start listening")


def load_torrent(metainfo: bytes, source: str = "metainfo") -> lt.torrent_info:
    """Parse torrent metainfo read from ``source`` (a file loglake may not have written).

    libtorrent reports bad bencoding or a bad info dict as a bare ``RuntimeError``; turning it
    into ``CorruptTorrent`` lets the CLI print one readable line instead of a traceback.
    """
    try:
        return lt.torrent_info(metainfo)
    except RuntimeError as e:
        raise CorruptTorrent(f"{source} is not a valid torrent: {e}") from e


def parse_magnet(magnet: str) -> lt.add_torrent_params:
    """libtorrent's reading of ``magnet``, or ``BadMagnetLink``: checked before a fetch creates
    its folder and store or draws its progress (a typo left both, and a bar, behind its
    error)."""
    try:
        return lt.parse_magnet_uri(magnet)
    except RuntimeError as e:
        raise BadMagnetLink(f"bad magnet link: {e}") from e


class Seeder:
    """Seeds one community torrent at a time (spec "Seeding message history archives": only the
    newest torrent is seeded; status-go ``SeedHistoryArchiveTorrent`` unseeds the previous)."""

    def __init__(self, port: int = 0) -> None:
        self.session = session(port)
        self.port = listen_port(self.session)
        self.handle: lt.torrent_handle | None = None

    @property
    def peer(self) -> str:
        return f"127.0.0.1:{self.port}"

    def seed(
        self,
        metainfo: bytes,
        save_path: str | Path,
        timeout: float = 60.0,
        source: str = "metainfo",
    ) -> None:
        """Seed ``metainfo`` (read from ``source``, named in a ``CorruptTorrent``) from
        ``save_path``."""
        ti = load_torrent(metainfo, source)
        self.unseed()
        atp = lt.add_torrent_params()
        atp.ti = ti
        atp.save_path = str(save_path)
        self.handle = self.session.add_torrent(atp)
        deadline = time.monotonic() + timeout
        while True:
            st = self.handle.status()
            if st.is_seeding:
                return
            if st.errc.value():
                raise ArchiveConfigError(f"cannot seed: {st.errc.message()}")
            checking = st.state in (st.checking_files, st.checking_resume_data)
            if (
                not checking
                and st.progress < 1
                and (st.state == st.downloading or time.monotonic() > deadline)
            ):
                raise ArchiveConfigError(
                    f"seed files under {save_path} do not match the torrent "
                    f"({st.progress:.0%} verified)"
                )
            time.sleep(0.05)

    def connect(self, host: str, port: int) -> None:
        """Dial a downloader (transmission-cli ignores 127.x peers from trackers)."""
        if self.handle is not None:
            self.handle.connect_peer((host, port))

    def unseed(self) -> None:
        if self.handle is not None:
            self.session.remove_torrent(self.handle)
            self.handle = None

    def close(self) -> None:
        self.unseed()
        del self.session


@dataclass
class Progress:
    pieces_done: int
    pieces_wanted: int
    bytes_downloaded: int
    peers: int


ProgressFn = Callable[[Progress], None]


class Fetcher:
    """Downloads chosen pieces of a magnet's torrent into ``save_path/<name>/{data,index}``."""

    def __init__(self, save_path: str | Path, port: int = 0, deadline: float | None = None) -> None:
        """``deadline``: seconds, from now, that this fetcher's waits on peers together may
        take (metadata, pieces), each wait's own timeout still applying; None: no overall
        bound."""
        self.save_path = Path(save_path)
        self.deadline = deadline
        self._end = None if deadline is None else time.monotonic() + deadline
        self.session = session(port)
        # keep the seeder's connection while every piece asked for so far is had: a fetch
        # hydrates an archive before it asks for the next one's pieces, and libtorrent (2.1)
        # closed the "redundant" connection to the seed once the torrent was finished, then
        # never dialed it again when pieces were wanted anew (0 peers until the stall timeout;
        # ``connect_peer``, a pause and resume did not bring it back)
        self.session.apply_settings({"close_redundant_connections": False})
        self.handle: lt.torrent_handle | None = None
        self.info: lt.torrent_info | None = None
        self.downloaded = 0
        self.magnet_peers: list[tuple[str, int]] = []
        self.trackers: list[str] = []
        self._peers: list[tuple[str, int]] = []

    def _until(self, timeout: float) -> float:
        """When a wait of ``timeout`` seconds starting now ends: at the deadline if sooner."""
        end = time.monotonic() + timeout
        return end if self._end is None else min(end, self._end)

    def extend_deadline(self, seconds: float) -> None:
        """Move the deadline ``seconds`` later: time spent on local work between two waits
        (hydrating an archive before the next is downloaded) is not waiting on peers."""
        if self._end is not None:
            self._end += seconds

    def _overdue(self) -> bool:
        return self._end is not None and time.monotonic() >= self._end

    def _info(self) -> lt.torrent_info:
        if self.info is None:
            raise ArchiveConfigError("call metadata() first")
        return self.info

    def _handle(self) -> lt.torrent_handle:
        if self.handle is None:
            raise ArchiveConfigError("call start() first")
        return self.handle

    def metadata(
        self, magnet: str, timeout: float = METADATA_TIMEOUT_S, retries: int = 1
    ) -> lt.torrent_info:
        """Resolve the magnet to its info dict without downloading any piece."""
        atp = parse_magnet(magnet)
        self.magnet_peers = [(str(host), int(port)) for host, port in atp.peers]
        self.trackers = list(atp.trackers)
        tmp = tempfile.mkdtemp(prefix="loglake-meta-")
        try:
            for _attempt in range(retries + 1):
                atp.save_path = tmp
                atp.flags |= lt.torrent_flags.upload_mode
                try:
                    h = self.session.add_torrent(atp)
                except RuntimeError as e:
                    # a magnet libtorrent parses but will not add: an all-zero info-hash
                    # (``btih:0000…``, or 32 ``A``s in base32) was a bare RuntimeError
                    raise BadMagnetLink(f"bad magnet link: {e}") from e
                deadline = self._until(timeout)
                while time.monotonic() < deadline:
                    if h.status().has_metadata:
                        ti = h.torrent_file()
                        assert ti is not None  # has_metadata
                        self.session.remove_torrent(h)
                        self.info = lt.torrent_info(ti)
                        return self.info
                    time.sleep(0.05)
                self.session.remove_torrent(h)
                if self._overdue():
                    raise TorrentTimeout(
                        f"the fetch's deadline of {self.deadline:g} s passed before a peer gave "
                        f"the torrent's metadata; is the control node seeding {magnet[:60]}…?"
                    )
            raise TorrentTimeout(
                f"no peer gave the torrent's metadata within {timeout:g} s "
                f"({retries + 1} attempt(s)); is the control node seeding {magnet[:60]}…?"
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def start(self, peers: Iterable[tuple[str, int]] = ()) -> None:
        """Add the resolved torrent with every piece at priority 0."""
        info = self._info()
        atp = lt.add_torrent_params()
        atp.ti = info
        atp.save_path = str(self.save_path)
        atp.piece_priorities = [0] * info.num_pieces()
        atp.trackers = self.trackers
        handle = self.handle = self.session.add_torrent(atp)
        self._peers = list(peers) or self.magnet_peers
        for p in self._peers:
            handle.connect_peer(p)

    def files(self) -> list[tuple[tuple[str, ...], int]]:
        """Every file of the torrent: its path, split (the torrent's name first for a multi-file
        torrent), and libtorrent's flags for it (``file_storage.flag_symlink``, ``flag_pad_file``
        ...)."""
        with warnings.catch_warnings():  # files() is marked deprecated in the 2.x binding
            warnings.simplefilter("ignore", DeprecationWarning)
            fs = self._info().files()
        return [(Path(fs.file_path(i)).parts, int(fs.file_flags(i))) for i in range(fs.num_files())]

    def file_range(self, name: str) -> tuple[int, int]:
        """(offset, size) of a file inside the torrent's byte stream."""
        with warnings.catch_warnings():  # files() is marked deprecated in the 2.x binding
            warnings.simplefilter("ignore", DeprecationWarning)
            fs = self._info().files()
        for i in range(fs.num_files()):
            if Path(fs.file_path(i)).name == name:
                return fs.file_offset(i), fs.file_size(i)
        # the torrent is the seeder's: its fault, not the caller's configuration
        raise CorruptIndex(f"torrent has no {name!r} file (malformed archive torrent)")

    def piece_length(self) -> int:
        """The torrent's own piece length (the seeder's choice, not necessarily the layout's)."""
        return int(self._info().piece_length())

    def pieces_of(self, offset: int, size: int) -> range:
        p = self._info().piece_length()
        return range(offset // p, (offset + size + p - 1) // p)

    def download(
        self,
        pieces: Iterable[int],
        timeout: float = 120.0,
        stall_timeout: float = 30.0,
        progress: ProgressFn | None = None,
    ) -> int:
        """Fetch ``pieces`` (adding to what was asked before); return payload bytes so far."""
        h = self._handle()
        want = sorted(set(pieces))
        info = self._info()
        if want and (want[0] < 0 or want[-1] >= info.num_pieces()):
            # libtorrent raises a bare IndexError for a piece past the end; the pieces asked
            # for come from the seeder's index, so it is the seeder's fault
            raise CorruptIndex(
                f"piece {want[-1] if want[-1] >= 0 else want[0]} asked for, the torrent has "
                f"{info.num_pieces()}"
            )
        fetch = sum(info.piece_size(i) for i in want if not h.have_piece(i))
        expected = h.status().total_payload_download + fetch
        for i in want:
            h.piece_priority(i, 7 if i == want[-1] else 4)
        deadline = self._until(timeout)
        last_change, last_done = time.monotonic(), -1
        while True:
            st = h.status()
            done = sum(h.have_piece(i) for i in want)
            if progress:
                progress(Progress(done, len(want), st.total_payload_download, st.num_peers))
            if done == len(want):
                self.flush()
                self.downloaded = self._settled_total(expected)
                return self.downloaded
            now = time.monotonic()
            if done != last_done:
                last_change, last_done = now, done
            if st.num_peers == 0 and self._peers:
                for p in self._peers:
                    h.connect_peer(p)
            if now > deadline and self._overdue():
                raise TorrentTimeout(
                    f"the fetch's deadline of {self.deadline:g} s passed: fetched {done}/"
                    f"{len(want)} pieces of this request ({st.num_peers} peers)"
                )
            if now > deadline or now - last_change > stall_timeout:
                raise TorrentTimeout(
                    f"fetched {done}/{len(want)} pieces, then no progress for "
                    f"{now - last_change:.0f} s ({st.num_peers} peers)"
                )
            time.sleep(0.05)

    def _settled_total(self, expected: int, timeout: float = 3.0) -> int:
        """The payload bytes downloaded, once libtorrent counts at least ``expected``.

        Why read it again, and wait: the download loop's status is read before it checks the
        pieces, so the last blocks can arrive in between, and the total it read lacks them (a
        fetch of one week reported 610,612 bytes for a 614,400-byte archive, once in CI). A
        status read now counts them; the wait covers a libtorrent that is slower to add them
        up. The pieces are had, so waiting cannot fail the fetch: after ``timeout`` the total
        is returned as it stands."""
        h = self._handle()
        deadline = time.monotonic() + timeout
        total = h.status().total_payload_download
        while total < expected and time.monotonic() < deadline:
            time.sleep(0.05)
            total = h.status().total_payload_download
        return total

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every downloaded block is in the files: a piece counts as had once its
        hash checks, which can be before the disk thread wrote it (libtorrent 2.x)."""
        h = self._handle()
        self.session.pop_alerts()  # drain, so a full alert queue cannot drop the one we want
        h.flush_cache()
        deadline = time.monotonic() + timeout  # local work: not cut by the fetch's deadline
        while time.monotonic() < deadline:
            self.session.wait_for_alert(100)
            for a in self.session.pop_alerts():
                if isinstance(a, lt.cache_flushed_alert) and a.handle == h:
                    return
        raise TorrentTimeout(f"libtorrent did not flush the downloaded pieces in {timeout:g} s")

    def verify(self, offset: int, region: bytes) -> bool:
        """Whether ``region`` read at ``offset`` (piece-aligned) matches the torrent's SHA-1s."""
        info = self._info()
        p = info.piece_length()
        mv = memoryview(region)
        for k in range(0, len(region), p):
            want = info.hash_for_piece((offset + k) // p)
            if hashlib.sha1(mv[k : k + p]).digest() != want:
                return False
        return True

    def close(self) -> None:
        if self.handle is not None:
            self.session.remove_torrent(self.handle)
            self.handle = None
        del self.session
