"""A corrupt ``.torrent`` is a typed error naming the file, never libtorrent's bare
``RuntimeError``: from ``Seeder.seed`` and as a one-line error from ``loglake archives seed``."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from loglake.archives.bt import Seeder, load_torrent
from loglake.archives.cli import command
from loglake.archives.errors import ArchiveConfigError, ArchiveError, CorruptTorrent
from loglake.archives.layout import get_layout
from loglake.archives.member_node import fetch_archives
from loglake.archives.store import MessageStore
from loglake.errors import DecodeError

CORRUPT = [b"", b"not bencode at all", b"d4:infod6:lengthi-1eee", b"d8:announce3:abce"]


@pytest.mark.parametrize("meta", CORRUPT)
def test_load_torrent_names_the_source(meta):
    with pytest.raises(CorruptTorrent) as ei:
        load_torrent(meta, "x.torrent")
    assert isinstance(ei.value, ArchiveError) and isinstance(ei.value, DecodeError)
    assert str(ei.value).startswith("x.torrent is not a valid torrent: ")


def test_seeder_seed_corrupt_torrent_is_typed(tmp_path):
    tfile = tmp_path / "c.torrent"
    tfile.write_bytes(b"d4:infoi3ee")
    seeder = Seeder()
    try:
        with pytest.raises(CorruptTorrent, match=r"c\.torrent"):
            seeder.seed(tfile.read_bytes(), tmp_path, source=str(tfile))
        assert seeder.handle is None
    finally:
        seeder.close()


def test_cli_seed_corrupt_torrent_is_a_readable_error(tmp_path):
    runner = CliRunner()
    key = tmp_path / "key"
    r = runner.invoke(command, ["keygen", "--out", str(key)])
    assert r.exit_code == 0, r.output
    cid = r.output.strip()
    root = tmp_path / "archives"
    root.mkdir()
    (root / f"{cid}.torrent").write_bytes(b"garbage, not a torrent")
    r = runner.invoke(command, ["seed", "--root", str(root), "--key-file", str(key)])
    assert r.exit_code == 1
    assert "Error: " in r.output and f"{cid}.torrent is not a valid torrent" in r.output
    assert "Traceback" not in r.output and isinstance(r.exception, SystemExit)


class _Status:
    def __init__(self, total: int) -> None:
        self.total_payload_download = total


class _LaggingHandle:
    """A torrent handle whose payload total reaches the bytes of the last blocks a few status
    reads after the pieces are had (the race ``Fetcher._settled_total`` waits out)."""

    def __init__(self, totals: list[int]) -> None:
        self.totals = totals

    def status(self) -> _Status:
        return _Status(self.totals.pop(0) if len(self.totals) > 1 else self.totals[0])


def test_the_downloaded_total_is_read_after_the_last_blocks_are_counted(tmp_path):
    from loglake.archives.bt import Fetcher

    f = Fetcher(tmp_path)
    try:
        f.handle = _LaggingHandle([610_612, 610_612, 614_400])  # type: ignore[assignment]
        assert f._settled_total(614_400) == 614_400
        f.handle = _LaggingHandle([610_612])  # type: ignore[assignment]
        assert f._settled_total(614_400, timeout=0.2) == 610_612  # never fails the fetch
    finally:
        f.handle = None
        f.close()


@pytest.mark.parametrize("info_hash", ["0" * 40, "A" * 32], ids=["hex zeros", "base32 zeros"])
def test_a_magnet_with_an_all_zero_info_hash_is_a_bad_magnet_not_a_runtime_error(
    tmp_path, info_hash
):
    # libtorrent parses it, then refuses to add it with a bare RuntimeError (a traceback from
    # `archives fetch`, and a follow loop stopped by a signed link)
    magnet = f"magnet:?xt=urn:btih:{info_hash}&dn=x"
    with pytest.raises(ArchiveConfigError, match="bad magnet link: missing info-hash"):
        fetch_archives(magnet, tmp_path, MessageStore(), get_layout("spec"), None, timeout=1)
    r = CliRunner().invoke(
        command, ["fetch", "--magnet", magnet, "--root", str(tmp_path / "m"), "--timeout", "1"]
    )
    assert isinstance(r.exception, SystemExit) and r.exit_code == 1, repr(r.exception)
    assert r.output.strip().splitlines()[-1].startswith("Error: bad magnet link"), r.output


def test_an_unparsable_magnet_is_refused_before_the_fetch_leaves_anything(tmp_path):
    """Found from outside: ``archives fetch --magnet garbage`` created its member folder and
    store and drew the metadata progress bar before its error. Now the link is read first:
    the one-line error, and nothing written."""
    root = tmp_path / "m"
    r = CliRunner().invoke(command, ["fetch", "--magnet", "garbage", "--root", str(root)])
    assert r.exit_code == 1 and r.output.startswith("Error: bad magnet link"), r.output
    assert "metadata" not in r.output and not root.exists()
