"""The node's archives part: ``[archives] trackers`` reaches the torrent the control loop seeds
and the magnet the API shows."""

from __future__ import annotations

import libtorrent as lt
import pytest

from loglake.archives.layout import STATUS_GO_TRACKERS, get_layout
from loglake.log.api import Entry
from loglake.node.api.archives import ArchivesHandle
from loglake.node.config import load_config
from tests.archives.helpers import SPEC_TOPIC, START, WEEK, fill_weeks, record
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("trackers", "want"),
    [
        (None, list(STATUS_GO_TRACKERS)),  # unset: the layout's (status-go's own defaults)
        (["http://127.0.0.1:9/announce"], ["http://127.0.0.1:9/announce"]),
        ([], []),
    ],
)
def test_configured_trackers_are_in_the_seeded_torrent_and_magnet(api_node, trackers, want):
    section = {"enabled": True, "member": False, "layout": "status-go", "check_every": 3600.0}
    if trackers is not None:
        section["trackers"] = trackers
    cfg = load_config(data={"archives": section}, env={})
    fill_weeks(api_node.log, "community", get_layout("status-go"), range(1), 10)
    handle = ArchivesHandle.start(api_node.node, cfg.archives)
    api_node.node.archives = handle
    try:
        handle.build_now(None, partial=False)  # a round done (the loop's first may have built)
        got = api_node.client.get("/api/archives").json()
        assert [a["from_ns"] for a in got["archives"]] == [START]
        torrent = got["torrent"]
        assert list(lt.parse_magnet_uri(torrent["magnet"]).trackers) == want
        meta = (handle.folder / "control" / f"{handle.community}.torrent").read_bytes()
        tiers = lt.bdecode(meta).get(b"announce-list", [])
        assert [u.decode() for tier in tiers for u in tier] == want
    finally:
        handle.close()


def test_the_control_node_shows_the_records_it_will_never_archive(api_node):
    # a record dated in the year 2200 (refused at ingest) and one that arrived after its
    # week was archived were only a log line: the node's API and console now count them
    layout = get_layout("spec")
    section = {"enabled": True, "member": False, "wait": 0.0, "check_every": 3600.0}
    cfg = load_config(data={"archives": section}, env={})
    fill_weeks(api_node.log, "community", layout, range(2), 10)
    api_node.log.append("community", record(layout, START + 200 * 52 * WEEK, b"future"))
    handle = ArchivesHandle.start(api_node.node, cfg.archives)
    api_node.node.archives = handle
    try:
        assert api_node.client.post("/api/archives/build", json={}).status_code == 200
        got = api_node.client.get("/api/archives").json()
        assert (got["future_records"], got["late_records"]) == (1, 0), got
        api_node.log.append("community", record(layout, START + 3, b"late"))  # week 0
        assert api_node.client.post("/api/archives/build", json={}).status_code == 200
        got = api_node.client.get("/api/archives").json()
        assert (got["future_records"], got["late_records"]) == (1, 1), got
    finally:
        handle.close()


def test_the_member_refuses_an_archive_past_the_configured_max_archive_bytes(api_node):
    # [archives] max_archive_bytes reaches the member loop's fetch: its error names the type
    # (the seeder's fault) and the archive, and nothing is hydrated
    section = {"enabled": True, "wait": 0.0, "check_every": 3600.0, "max_archive_bytes": 1000}
    cfg = load_config(data={"archives": section}, env={})
    fill_weeks(api_node.log, "community", get_layout("spec"), range(1), 10)
    handle = ArchivesHandle.start(api_node.node, cfg.archives)
    api_node.node.archives = handle
    try:
        got = wait_until(
            lambda: api_node.client.get("/api/archives").json()["errors"]["member"],
            what="the member's failed fetch",
        )
        assert got.startswith("ArchiveTooLarge: archive 0x")
        assert "is 102400 bytes (padding 0): more than the 1000 bytes" in got
        member = api_node.client.get("/api/archives").json()["member"]
        assert member is None or member["messages"] == 0  # None: no round has ended well yet
    finally:
        handle.close()


def test_the_member_fetches_the_newest_archives_within_the_configured_max_fetch_bytes(api_node):
    # [archives] max_fetch_bytes reaches the member loop's fetch: of two weeks of one 100 KiB
    # piece each, a bound of one piece takes the newest week, and the fetch shows the older;
    # the member fetches the same link again for it (it waited for the next week's link), and
    # the fetch list shows the progress
    section = {"enabled": True, "wait": 0.0, "check_every": 3600.0, "max_fetch_bytes": 102400}
    cfg = load_config(data={"archives": section}, env={})
    fill_weeks(api_node.log, "community", get_layout("spec"), range(2), 10)
    handle = ArchivesHandle.start(api_node.node, cfg.archives)
    api_node.node.archives = handle
    try:

        def fetched() -> dict | None:
            member = api_node.client.get("/api/archives").json()["member"]
            return member if member and len(member["fetches"]) >= 2 else None

        member = wait_until(fetched, what="the member's two fetches")
        archives = api_node.client.get("/api/archives").json()["archives"]
        old, new = (a["archive_id"] for a in archives)
        first, second = member["fetches"]
        assert (first["missing"], first["left"]) == ([new], [old])
        assert (second["missing"], second["left"]) == ([old], [])
        assert [a["archive_id"] for a in member["archives"]] == [old, new]
        assert member["messages"] == 20
    finally:
        handle.close()


def test_the_member_fetch_is_bounded_by_the_configured_fetch_deadline(api_node):
    # [archives] fetch_deadline reaches the member loop: a signed link nobody seeds failed
    # after 2 x 20 s of waiting for its metadata, the member loop stuck in it
    got = _member_error_for_a_signed_link(
        api_node, {"fetch_deadline": 0.5}, f"magnet:?xt=urn:btih:{'ee' * 20}&x.pe=127.0.0.1:9"
    )
    assert got.startswith("TorrentTimeout: the fetch's deadline of 0.5 s passed before"), got


def test_a_signed_link_libtorrent_refuses_is_the_control_nodes_fault(api_node):
    # the member loop showed "ArchiveConfigError: bad magnet link: …", a configuration error of
    # this node, for a link the control node signed and published
    got = _member_error_for_a_signed_link(
        api_node,
        {},
        f"magnet:?xt=urn:btih:{'0' * 40}",  # all-zero info-hash
    )
    assert got.startswith(
        "BadMagnetMessage: the control node's signed magnet link is not one libtorrent "
        "takes: bad magnet link: missing info-hash"
    ), got


def _member_error_for_a_signed_link(api_node, options: dict, magnet: str) -> str:
    """The member loop's error (``GET /api/archives``) once the control node's key has signed
    ``magnet`` (``&dn=`` the community added) into the node's magnet channel."""
    from loglake.archives.signing import encode_magnet_message

    section = {"enabled": True, "control": False, "wait": 0.0, **options}
    cfg = load_config(data={"archives": section}, env={})
    handle = ArchivesHandle.start(api_node.node, cfg.archives)
    api_node.node.archives = handle
    try:
        link = f"{magnet}&dn={handle.community}"
        api_node.log.create_stream(handle.channel)
        api_node.log.append(handle.channel, encode_magnet_message(1, link, handle.key))
        return wait_until(
            lambda: api_node.client.get("/api/archives").json()["errors"]["member"],
            timeout=10,
            what="the member's failed fetch",
        )
    finally:
        handle.close()


@pytest.mark.parametrize("configured", [True, False])
def test_the_control_loop_archives_the_configured_channel_topics_only(api_node, configured):
    # the node's control loop always built with no topics: every topic a poster used was in
    # every archive's metadata (60 KB topics: an index no member decodes). Now
    # ``[archives] topics`` are the only ones exported and listed; unset, each archive's own
    # topics are bounded and what was left out is counted
    layout = get_layout("spec")
    quiet = "/status/1/quiet/proto"
    section = {"enabled": True, "member": False, "wait": 0.0, "check_every": 3600.0}
    if configured:
        section["topics"] = [SPEC_TOPIC, quiet]
    cfg = load_config(data={"archives": section}, env={})
    fill_weeks(api_node.log, "community", layout, range(2), 10)
    api_node.log.append_many(
        "community",
        [
            Entry(
                layout.make_record(
                    payload=b"", topic=f"{i:03d}" + "x" * 5000, timestamp_ns=START + i
                )
            )
            for i in range(5)
        ],
    )
    handle = ArchivesHandle.start(api_node.node, cfg.archives)
    api_node.node.archives = handle
    try:
        assert api_node.client.post("/api/archives/build", json={}).status_code == 200
        got = api_node.client.get("/api/archives").json()
        assert got["topics"] == ([SPEC_TOPIC, quiet] if configured else None)
        assert got["topic_skipped_records"] == (0 if configured else 5)
        index = (handle.folder / "control" / handle.community / "index").read_bytes()
        entries = layout.decode_index(index)
        want = (SPEC_TOPIC, quiet) if configured else (SPEC_TOPIC,)
        assert [e.metadata.content_topics for e in entries] == [want] * len(entries) != []
    finally:
        handle.close()
