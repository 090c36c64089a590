"""Differential fuzzing of the archives' protobuf bytes against the reference shape: message
classes built from loglake's ``.proto`` files by protoc (the shape status-go generates its Go
code from), in a descriptor pool of their own — not loglake's checked-in ``*_pb2`` modules.

What loglake writes by hand is what is compared: the archive framing (``frame_parts``: one
``0x1a varint(len) record`` per message), the spec layout's ``padding`` field sized so the archive
fills whole pieces, status-go's trailing zero padding and its size rule, the index metadata and
the index, the signed magnet-link message, and the checks each decoder adds on top of the
protobuf runtime. Per batch drawn by hypothesis:

- archives, both layouts, over a small piece length chosen so the padding gap lands on the
  varint boundaries (gap 1, 2, 129, 130, 131, ...): the reference parses loglake's bytes to the
  same metadata and messages, re-serializes them to the same bytes, and the size is the one the
  rule gives (spec: the smallest multiple of the piece length a ``padding`` field can reach,
  found by trying the reference's ``ByteSize``; status-go: manager_archive_file.go's); loglake
  decodes the reference's archive to the same records;
- mutants of each archive (random, and every octet of one per batch swept): loglake's
  ``decode_archive`` accepts exactly when the reference parses it, the length is whole pieces
  and the padding is zeros, with the same records;
- the index: loglake's bytes parse to the same keys (keccak-256 of each metadata) and values;
  ``decode_index`` of the reference's index gives the same entries; mutants are refused exactly
  when the reference refuses them or a rule of the spec fails (key not keccak-256 of its
  metadata, misaligned or overlapping archives, bytes but no archives, past the data);
- magnet-link messages: the reference reads loglake's type, clock, URI and a signature that
  recovers the signer; loglake reads the reference's message; mutants are refused exactly when
  the reference or a signature/URI rule refuses them;
- records (``WakuMessage`` of each layout) and their mutants through ``decode_record`` (its
  rules on top: a spec timestamp present; a status-go one non-zero, its nanoseconds an int64).

One runtime (upb) parses for both sides: this compares loglake's hand-framed bytes and rules
with the schema, not two protobuf parsers.
"""

from __future__ import annotations

import functools
import random
import tempfile
from pathlib import Path
from typing import Any

import grpc_tools
from coincurve import PrivateKey, PublicKey
from Crypto.Hash import keccak
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError as PbDecodeError
from grpc_tools import protoc
from hypothesis import strategies as st

from loglake.archives import signing
from loglake.archives.errors import ArchiveError
from loglake.archives.layout import SpecLayout, StatusGoLayout
from loglake.archives.messages import NS, ArchiveMetadata, IndexEntry
from tests.differential.mutate import RNGS, mutations, sweep

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "src" / "loglake" / "wire" / "proto"
PROTOS = {"spec": "archives_spec.proto", "status-go": "archives_statusgo.proto"}
PACKAGES = {"spec": "loglake.archives.spec", "status-go": "loglake.archives.statusgo"}
MUTANTS = 12
SWEEP_MAX = 600
"""Archives up to this many bytes get every octet swept (one per batch)."""
U64 = 2**64 - 1


@functools.cache
def reference() -> dict[str, dict[str, type]]:
    """{layout: {message name: class}} from protoc's descriptors of the ``.proto`` files."""
    include = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "set.pb"
        rc = protoc.main(
            [
                "protoc",
                f"-I{PROTO_DIR}",
                f"-I{include}",
                f"--descriptor_set_out={out}",
                *PROTOS.values(),
            ]
        )
        if rc != 0:
            raise RuntimeError(f"protoc failed ({rc}) on {PROTO_DIR}")
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)
    classes: dict[str, dict[str, type]] = {}
    for layout, package in PACKAGES.items():
        fd = pool.FindFileByName(PROTOS[layout])
        classes[layout] = {
            name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
            for name in fd.message_types_by_name
        }
    return classes


def _keccak_id(encoded: bytes) -> str:
    return "0x" + keccak.new(data=encoded, digest_bits=256).hexdigest()


def _parse(cls: type, data: bytes) -> Any | None:
    m = cls()
    try:
        m.ParseFromString(data)
    except (PbDecodeError, RuntimeError, ValueError):
        return None
    return m


def _ser(m: Any) -> bytes:
    return m.SerializeToString(deterministic=True)


@functools.lru_cache(maxsize=512)
def layout_for(name: str, piece: int):
    """The layout with a small piece length, so archive sizes cross many piece boundaries."""
    base = SpecLayout if name == "spec" else StatusGoLayout
    return type(f"{base.__name__}{piece}", (base,), {"piece_length": piece})()


# -- strategies ------------------------------------------------------------------------------

spec_records = st.fixed_dictionaries(
    {"payload": st.binary(max_size=60), "content_topic": st.text(max_size=12)},
    optional={
        "version": st.integers(0, 2**32 - 1),
        "timestamp": st.integers(-(2**63), 2**63 - 1),
        "meta": st.binary(max_size=8),
        "ephemeral": st.booleans(),
    },
)
sg_records = st.fixed_dictionaries(
    {},
    optional={
        "sig": st.binary(max_size=65),
        "timestamp": st.integers(0, U64),
        "topic": st.binary(min_size=4, max_size=4),
        "payload": st.binary(max_size=60),
        "padding": st.binary(max_size=8),
        "hash": st.binary(max_size=32),
        "thirdPartyId": st.text(max_size=8),
    },
)
GAPS = (0, 1, 2, 3, 4, 127, 128, 129, 130, 131, 132, 16385, 16386, 16387, 16388)
"""Padding gaps at the varint boundaries of the ``padding`` field's length."""
archives = st.fixed_dictionaries(
    {
        "layout": st.sampled_from(["spec", "status-go"]),
        "from": st.integers(0, 2**40),
        "span": st.integers(0, 2**20),
        "topics": st.lists(st.binary(min_size=4, max_size=4), max_size=3),
        "version": st.integers(0, 3),
        "gap": st.sampled_from(GAPS) | st.integers(1, 400),
        "piece_div": st.sampled_from([1, 1, 2, 3]),
        "spec_records": st.lists(spec_records, max_size=6),
        "sg_records": st.lists(sg_records, max_size=6),
    }
)
magnets = st.tuples(
    st.integers(0, U64),
    st.text("0123456789abcdef", max_size=40).map("magnet:?xt=urn:btih:".__add__)
    | st.text(max_size=40),
    st.integers(1, 2**64),
)
batches = st.tuples(st.lists(archives, min_size=1, max_size=6), st.lists(magnets, max_size=4), RNGS)


# -- archives --------------------------------------------------------------------------------


def _meta(d: dict) -> ArchiveMetadata:
    if d["layout"] == "spec":
        topics = tuple(t.hex() for t in d["topics"])
        return ArchiveMetadata(d["from"], d["from"] + d["span"], topics, d["version"])
    fr = d["from"] // NS * NS
    return ArchiveMetadata(fr, fr + d["span"] * NS, tuple(d["topics"]), d["version"])


def _ref_meta(ref: dict[str, type], layout: str, meta: ArchiveMetadata) -> Any:
    m = ref["WakuMessageArchiveMetadata"]()
    div = 1 if layout == "spec" else NS
    setattr(m, "from", meta.from_ns // div)
    m.to = meta.to_ns // div
    m.version = meta.version
    m.contentTopic.extend(meta.content_topics)
    return m


def _records(ref: dict[str, type], d: dict) -> list[bytes]:
    cls = ref["WakuMessage"]
    fields = d["spec_records"] if d["layout"] == "spec" else d["sg_records"]
    return [_ser(cls(**f)) for f in fields]


def _ref_archive(ref, layout: str, meta: ArchiveMetadata, records: list[bytes]) -> Any:
    a = ref["WakuMessageArchive"]()
    if layout == "spec":
        a.version = 1  # the spec layout's archive version
    a.metadata.CopyFrom(_ref_meta(ref, layout, meta))
    for r in records:
        a.messages.add().ParseFromString(r)
    return a


def spec_padded_size(archive: Any, piece: int) -> tuple[int, int]:
    """(size, zero count) of the spec's rule, by trying the reference: the smallest multiple
    of ``piece`` that ``archive`` plus a ``padding`` field of n zeros reaches exactly (no field
    when already aligned)."""
    body = archive.ByteSize()
    size = -(-body // piece) * piece
    while True:
        gap = size - body
        if gap == 0:
            return size, 0
        for n in range(max(0, gap - 12), gap):
            archive.padding = bytes(n)
            if archive.ByteSize() == size:
                archive.padding = b""
                return size, n
        archive.padding = b""
        size += piece


def status_go_size(raw: int, piece: int) -> int:
    """manager_archive_file.go: padded to the next multiple above one piece (a whole extra
    piece when aligned), to exactly one piece at or below it."""
    return raw + piece - raw % piece if raw > piece else piece


def _values(a: Any) -> tuple:
    m = a.metadata
    messages = [_ser(x) for x in a.messages]
    return (getattr(m, "from"), m.to, list(m.contentTopic), m.version, messages)


def check_archive(d: dict, rng: random.Random, swept: bool) -> tuple[int, list[str], Any]:
    """One drawn archive both ways and its mutants; returns the entry for the index check."""
    name = d["layout"]
    ref = reference()[name]
    meta = _meta(d)
    records = _records(ref, d)
    plain = _ref_archive(ref, name, meta, records)
    raw = plain.ByteSize()
    piece = max(8, (raw + d["gap"]) // d["piece_div"])
    lay = layout_for(name, piece)
    offset = piece * rng.randrange(0, 50)
    where = f"{name} archive, piece {piece}, {len(records)} records"
    bad: list[str] = []
    try:
        ea = lay.encode_archive(meta, records, offset)
    except Exception as e:
        return 1, [f"{where}: encode_archive raised {type(e).__name__}: {e}"], None
    data = ea.data_bytes()
    entry = ea.entry
    # loglake's bytes, read by the reference
    if name == "spec":
        want_size, zeros = spec_padded_size(plain, piece)
        body = data
    else:
        want_size, zeros = status_go_size(raw, piece), 0
        body = data[: len(data) - entry.padding]
        if entry.padding != want_size - raw or data[len(body) :].strip(b"\x00"):
            bad.append(f"{where}: padding {entry.padding}, want {want_size - raw} zeros")
    if len(data) != want_size or entry.size != want_size:
        bad.append(f"{where}: {len(data)} bytes (entry {entry.size}), the rule gives {want_size}")
    got = _parse(ref["WakuMessageArchive"], body)
    if got is None:
        bad.append(f"{where}: the reference cannot parse loglake's archive {data.hex()}")
        return 1, bad, None
    if _values(got) != _values(plain) or got.version != plain.version:
        bad.append(f"{where}: the reference reads other values from {data.hex()}")
    if name == "spec" and (got.padding.strip(b"\x00") or len(got.padding) != zeros):
        bad.append(f"{where}: padding field of {len(got.padding)} bytes, want {zeros} zeros")
    if _ser(got) != body:
        bad.append(f"{where}: not the reference's bytes: {body.hex()} vs {_ser(got).hex()}")
    bad += _check_entry(ref, name, lay, entry, meta, offset, want_size, where)
    if name == "spec":
        bad += _every_gap(plain, meta, records, where)
    # the reference's archive, read by loglake
    if name == "spec":
        plain.padding = bytes(zeros)
        region = _ser(plain)
        plain.padding = b""
    else:
        region = _ser(plain) + bytes(want_size - raw)
    try:
        if lay.decode_archive(region, entry) != records:
            bad.append(f"{where}: decode_archive of the reference's bytes gives other records")
    except ArchiveError as e:
        bad.append(f"{where}: decode_archive refuses the reference's archive: {e}")
    # mutants: both accept or both refuse
    swept = swept and len(region) <= SWEEP_MAX
    mutants = mutations([region], MUTANTS, rng) + (sweep(region) if swept else [])
    for mutant in mutants:
        bad += _compare_archive(ref, name, lay, mutant, entry, where)
    return 2 + len(mutants), bad, (lay, entry, region)


def _every_gap(plain: Any, meta: ArchiveMetadata, records: list[bytes], where: str) -> list[str]:
    """The same spec archive over piece lengths that leave each of ``GAPS`` to pad: the size
    the rule gives and the reference's bytes, at every varint boundary of the padding field."""
    bad = []
    raw = plain.ByteSize()
    for gap in GAPS:
        piece = raw + gap
        if piece < 8:
            continue
        try:
            data = layout_for("spec", piece).encode_archive(meta, records, 0).data_bytes()
        except Exception as e:
            bad.append(f"{where}: at piece {piece} (gap {gap}) {type(e).__name__}: {e}")
            continue
        want, _ = spec_padded_size(plain, piece)
        got = _parse(reference()["spec"]["WakuMessageArchive"], data)
        if len(data) != want or got is None or _ser(got) != data:
            bad.append(f"{where}: at piece {piece} (gap {gap}) {len(data)} bytes, want {want}")
    return bad


def _check_entry(ref, name, lay, entry: IndexEntry, meta, offset, size, where) -> list[str]:
    bad = []
    m = _parse(ref["WakuMessageArchiveIndexMetadata"], entry.encoded)
    if m is None:
        return [f"{where}: the reference cannot parse the index metadata {entry.encoded.hex()}"]
    want = ref["WakuMessageArchiveIndexMetadata"](offset=offset)
    want.metadata.CopyFrom(_ref_meta(ref, name, meta))
    if name == "spec":
        want.version, want.num_pieces = 1, size // lay.piece_length
    else:
        want.size, want.padding = size, entry.padding
    if m != want or _ser(want) != entry.encoded:
        bad.append(f"{where}: index metadata {entry.encoded.hex()}, want {_ser(want).hex()}")
    if entry.archive_id != _keccak_id(entry.encoded):
        bad.append(f"{where}: archive id {entry.archive_id} is not keccak-256 of its metadata")
    return bad


def _ref_decode_archive(ref, name, piece, region: bytes, entry: IndexEntry) -> list[bytes] | None:
    """The reference's reading under the spec's rules: whole pieces, zero padding."""
    if len(region) % piece or not region:
        return None
    if name == "status-go":
        if entry.padding > len(region) or region[len(region) - entry.padding :].strip(b"\x00"):
            return None
        region = region[: len(region) - entry.padding]
    a = _parse(ref["WakuMessageArchive"], region)
    if a is None or (name == "spec" and a.padding.strip(b"\x00")):
        return None
    return [_ser(m) for m in a.messages]


def _compare_archive(ref, name, lay, mutant: bytes, entry, where) -> list[str]:
    theirs = _ref_decode_archive(ref, name, lay.piece_length, mutant, entry)
    try:
        ours = lay.decode_archive(mutant, entry)
    except ArchiveError as e:
        if theirs is not None:
            return [f"{where}: loglake refuses ({e}) what the reference reads: {mutant.hex()}"]
        return []
    except Exception as e:
        return [f"{where}: decode_archive raised {type(e).__name__}: {e} on {mutant.hex()}"]
    if theirs is None:
        return [f"{where}: loglake accepts what the reference refuses: {mutant.hex()}"]
    if ours != theirs:
        return [f"{where}: records differ on {mutant.hex()}"]
    return []


# -- index -----------------------------------------------------------------------------------


def _ref_index(ref, entries: list[IndexEntry]) -> bytes:
    idx = ref["WakuMessageArchiveIndex"]()
    for e in entries:
        idx.archives[_keccak_id(e.encoded)].ParseFromString(e.encoded)
    return _ser(idx)


def _ref_decode_index(ref, name, piece, raw: bytes, data_size: int) -> list[tuple] | None:
    """The spec's index rules over the reference's parse; None when they refuse it."""
    idx = _parse(ref["WakuMessageArchiveIndex"], raw)
    if idx is None or (raw and not idx.archives):
        return None
    out = []
    for key, m in idx.archives.items():
        if _keccak_id(_ser(m)) != key:
            return None
        size = m.num_pieces * piece if name == "spec" else m.size
        padding = 0 if name == "spec" else m.padding
        if m.offset % piece or size % piece or size <= 0 or padding > size:
            return None
        out.append((m.offset, size, padding, _ser(m)))
    out.sort()
    end = 0
    for offset, size, _, _ in out:
        if offset < end:
            return None
        end = offset + size
    return None if end > data_size else out


def check_index(done: list[tuple], rng: random.Random) -> tuple[int, list[str]]:
    """The index of one layout's archives laid end to end (offsets rewritten to be so)."""
    bad: list[str] = []
    by_layout: dict[tuple[str, int], list] = {}
    for lay, entry, _ in done:
        by_layout.setdefault((lay.name, lay.piece_length), []).append((lay, entry))
    cases = 0
    for (name, piece), items in by_layout.items():
        ref = reference()[name]
        lay = items[0][0]
        entries, offset = [], 0
        for _, e in items:
            entries.append(lay.make_entry(e.metadata, offset, e.size, e.padding))
            offset += e.size
        where = f"{name} index of {len(entries)} archives, piece {piece}"
        ours = lay.encode_index(entries)
        theirs = _ref_index(ref, entries)
        if ours != theirs:
            bad.append(f"{where}: bytes differ: {ours.hex()} vs {theirs.hex()}")
        want = sorted((e.offset, e.size, e.padding, e.encoded) for e in entries)
        if _ref_decode_index(ref, name, piece, theirs, offset) != want:
            bad.append(f"{where}: the rules refuse the index they were built from")
        mutants = [theirs, *mutations([theirs], MUTANTS, rng)]
        for raw in mutants:
            ref_out = _ref_decode_index(ref, name, piece, raw, offset)
            try:
                got = [
                    (e.offset, e.size, e.padding, e.encoded)
                    for e in lay.decode_index(raw, data_size=offset)
                ]
            except ArchiveError as e:
                if ref_out is not None:
                    bad.append(f"{where}: loglake refuses ({e}) what the rules take: {raw.hex()}")
                continue
            except Exception as e:
                bad.append(f"{where}: decode_index raised {type(e).__name__}: {e}: {raw.hex()}")
                continue
            if ref_out is None:
                bad.append(f"{where}: loglake accepts an index the rules refuse: {raw.hex()}")
            elif got != ref_out:
                bad.append(f"{where}: entries differ on {raw.hex()}")
        cases += 1 + len(mutants)
    return cases, bad


# -- magnet-link messages --------------------------------------------------------------------


def _ref_decode_magnet(ref, raw: bytes) -> tuple[int, str, str] | None:
    """status-go's reading: an ApplicationMetadataMessage of type 43 whose 65-byte recoverable
    signature over keccak-256(payload) recovers a key, and a payload whose URI is a magnet."""
    amm = _parse(ref["ApplicationMetadataMessage"], raw)
    if amm is None or amm.type != signing.COMMUNITY_ARCHIVE_MAGNETLINK:
        return None
    sig = amm.signature
    if len(sig) != 65 or sig[64] > 3:
        return None
    digest = keccak.new(data=amm.payload, digest_bits=256).digest()
    try:
        pub = PublicKey.from_signature_and_message(sig, digest, hasher=None)
    except Exception:
        return None
    link = _parse(ref["CommunityMessageArchiveMagnetlink"], amm.payload)
    if link is None or not link.magnet_uri.startswith("magnet:?"):
        return None
    return link.clock, link.magnet_uri, "0x" + pub.format(compressed=True).hex()


def check_magnets(items: list[tuple], rng: random.Random) -> tuple[int, list[str]]:
    ref = reference()["status-go"]
    bad: list[str] = []
    cases = 0
    for clock, uri, secret in items:
        key = PrivateKey((secret % (2**256 - 2**224) or 1).to_bytes(32, "big"))
        signer = signing.community_id(key)
        where = f"magnet message clock {clock} uri {uri!r}"
        ours = signing.encode_magnet_message(clock, uri, key)
        read = _ref_decode_magnet(ref, ours)
        valid = uri.startswith("magnet:?")
        if read != ((clock, uri, signer) if valid else None):
            bad.append(f"{where}: the reference reads {read} from {ours.hex()}")
        # the reference's message, read by loglake
        payload = _ser(ref["CommunityMessageArchiveMagnetlink"](clock=clock, magnet_uri=uri))
        digest = keccak.new(data=payload, digest_bits=256).digest()
        theirs = _ser(
            ref["ApplicationMetadataMessage"](
                signature=key.sign_recoverable(digest, hasher=None), payload=payload, type=43
            )
        )
        if theirs != ours:
            bad.append(f"{where}: bytes differ: {ours.hex()} vs {theirs.hex()}")
        for raw in [theirs, *mutations([theirs], MUTANTS, rng)]:
            want = _ref_decode_magnet(ref, raw)
            try:
                m = signing.decode_magnet_message(raw, None)
                got = (m.clock, m.magnet_uri, m.signer)
            except ArchiveError:
                got = None
            except Exception as e:
                bad.append(f"{where}: decode raised {type(e).__name__}: {e} on {raw.hex()}")
                continue
            if got != want:
                bad.append(f"{where}: loglake reads {got}, the reference {want}: {raw.hex()}")
            cases += 1
    return cases, bad


# -- records ---------------------------------------------------------------------------------


def check_records(d: dict, rng: random.Random) -> tuple[int, list[str]]:
    name = d["layout"]
    ref = reference()[name]
    lay = layout_for(name, 64)
    bad: list[str] = []
    records = _records(ref, d)
    inputs = records + mutations(records, MUTANTS, rng)
    for raw in inputs:
        m = _parse(ref["WakuMessage"], raw)
        # status-go's uint64 seconds: loglake's rule on top is that their nanoseconds fit the
        # int64 it keeps times in (past 2262 the record is refused, by name); the spec's
        # sint64: one before 1970 is refused (an archive's from/to are uint64)
        ok = m is not None and (
            m.HasField("timestamp") and m.timestamp >= 0
            if name == "spec"
            else 0 < m.timestamp <= (2**63 - 1) // NS
        )
        try:
            got = lay.decode_record(raw)
        except ArchiveError:
            if ok:
                bad.append(f"{name} record: loglake refuses what the reference reads: {raw.hex()}")
            continue
        except Exception as e:
            bad.append(f"{name} record: decode raised {type(e).__name__}: {e} on {raw.hex()}")
            continue
        if not ok:
            bad.append(f"{name} record: loglake accepts what the reference refuses: {raw.hex()}")
            continue
        if name == "spec":
            want = (m.timestamp, m.content_topic, len(m.payload))
        else:
            want = (m.timestamp * NS, m.topic, len(m.payload) + len(m.sig))
        if (got.timestamp_ns, got.topic, got.cap_size) != want or got.raw != raw:
            bad.append(f"{name} record: loglake reads {got[:2]}, the reference {want}")
    return len(inputs), bad


def check(drawn: tuple[list[dict], list[tuple], random.Random]) -> tuple[int, list[str]]:
    archives_, magnets_, rng = drawn
    cases, bad, done = 0, [], []
    for i, d in enumerate(archives_):
        n, b, entry = check_archive(d, rng, swept=i == 0)
        cases, bad = cases + n, bad + b
        if entry is not None:
            done.append(entry)
        n, b = check_records(d, rng)
        cases, bad = cases + n, bad + b
    n, b = check_index(done, rng)
    cases, bad = cases + n, bad + b
    n, b = check_magnets(magnets_, rng)
    return cases + n, bad + b
