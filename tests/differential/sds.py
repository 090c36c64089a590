"""Differential fuzzing of loglake.sds against @waku/sds 0.0.8, the reference.

Three comparisons, each over batches drawn by hypothesis:

- messages: loglake's two encoders (``codec.encode``: the protobuf runtime; ``encode_message_fast``:
  the participant's) and the reference's ``Message.encode`` give the same bytes; each side decodes
  the other's bytes to the same value;
- mutations of valid messages: both decoders accept or both reject, and accepted values are
  equal (under the rules below);
- bloom filters: same bytes, k and m for the same inserts and options, same membership answers,
  and each side loads the other's serialized filter (and bit-flipped copies of it) with the same
  answers.

Rules where loglake and the reference differ on purpose (each is a reason a disagreement is not
a defect; anything else is one):

- invalid UTF-8 in a string field: proto3 requires valid UTF-8 and the protobuf runtime loglake
  uses (upb) refuses it; protons, the reference's runtime, decodes it leniently. loglake must
  reject exactly the messages a strict-UTF-8 run of the reference rejects (``utf8_valid``).
- empty ``message_id`` or ``sender_id`` (message or history entry): the reference's
  ``Message.decode`` takes them; loglake refuses them with ``MISSING_FIELD`` (a message without
  an id cannot be acknowledged, a history entry without one names nothing).
- a sync message's ``content`` field present but empty: the reference's ``Message.decode``
  builds a ``SyncMessage`` with ``content`` undefined; loglake keeps the field's presence. Both
  call it a sync message; the values are compared with a sync message's content as absent.
- a known field with another wire type than its own (e.g. ``sender_id`` as a varint), or bytes
  that are not protobuf's wire format at all (field number 0, an unmatched end-group, a
  truncated length): protons switches on the field number alone and reads whatever follows as
  the field's type, or skips it leniently; the protobuf encoding spec (and upb) treat a
  mismatched wire type as an unknown field and refuse malformed wire format. For such inputs
  (``well_typed`` is false) only loglake's typed error is checked, not agreement.
- ``lamport_timestamp`` from 2**31 to 2**32 - 1: protons-runtime 5.6.0 (``LongBits.fromBigInt``
  through ``fromNumber``) writes such a uint64 as a broken varint (``2**31`` becomes
  ``50 00 00 00 00 00``: lamport 0, then field-0 tags). A reference bug, not loglake's: those
  reference encodings are not compared and not used as valid inputs. @waku/sds's own lamport
  clock starts at ``Date.now()`` in ms (above 2**32), so live traffic does not hit it.
- a serialized bloom filter longer than the configured size: the reference reads the words it
  needs and ignores the rest; loglake refuses a filter of the wrong length (a peer with other
  bloom options would otherwise be read as wrong membership answers). Shorter: both refuse.
"""

from __future__ import annotations

import random

from hypothesis import strategies as st

from loglake.sds.bloom import BloomFilter
from loglake.sds.codec import decode, encode, encode_message_fast
from loglake.sds.errors import DropReason, SdsDecodeError
from loglake.sds.messages import HistoryEntry, SdsMessage
from tests.differential.mutate import RNGS, mutate, mutations
from tests.differential.peer import DiffPeer

UINT64_MAX = (1 << 64) - 1
MUTANTS_PER_MESSAGE = 12


def _hx(b: bytes | None) -> str | None:
    return None if b is None else b.hex()


def entry_json(e: HistoryEntry) -> dict:
    return {
        "message_id": e.message_id,
        "retrieval_hint": _hx(e.retrieval_hint),
        "sender_id": e.sender_id,
    }


def to_json(m: SdsMessage) -> dict:
    """The shape the peer's ``messageJson`` answers (uint64 as a decimal string)."""
    return {
        "sender_id": m.sender_id,
        "message_id": m.message_id,
        "channel_id": m.channel_id,
        "lamport_timestamp": None if m.lamport_timestamp is None else str(m.lamport_timestamp),
        "causal_history": [entry_json(e) for e in m.causal_history],
        "bloom_filter": _hx(m.bloom_filter),
        "repair_request": [entry_json(e) for e in m.repair_request],
        "content": _hx(m.content),
    }


def comparable(v: dict) -> dict:
    """A sync message's content as absent (see the module's rules)."""
    if v["lamport_timestamp"] is not None and not v["content"]:
        return {**v, "content": None}
    return v


def _ids_missing(v: dict) -> bool:
    entries = v["causal_history"] + v["repair_request"]
    return not v["message_id"] or not v["sender_id"] or any(not e["message_id"] for e in entries)


# wire types of the known fields (sds.proto): 0 varint, 2 length-delimited
ENTRY_WIRE = {1: 2, 2: 2, 3: 2}
MESSAGE_WIRE = {1: 2, 2: 2, 3: 2, 10: 0, 11: 2, 12: 2, 13: 2, 20: 2}
NESTED = {11: ENTRY_WIRE, 13: ENTRY_WIRE}
MAX_FIELD_NUMBER = (1 << 29) - 1  # protobuf encoding spec; protons reads any uint32 tag


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    for i in range(10):
        b = buf[pos + i]  # IndexError: truncated
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, pos + i + 1
    raise ValueError("varint longer than 10 bytes")


def well_typed(buf: bytes, wire: dict[int, int] = MESSAGE_WIRE, group: int | None = None) -> bool:
    """The protobuf encoding spec's reading of ``buf``: well-formed wire format, and every
    known field (``wire``: number -> wire type) with its own wire type, nested entries too.
    A spec oracle for the fuzzer's rules, not a decoder loglake uses."""
    pos = 0
    try:
        while pos < len(buf):
            tag, pos = _varint(buf, pos)
            number, wt = tag >> 3, tag & 7
            if not 0 < number <= MAX_FIELD_NUMBER or wt in (6, 7):
                return False
            if wt == 4:
                return number == group and pos == len(buf)
            if number in wire and wire[number] != wt:
                return False
            if wt == 0:
                _, pos = _varint(buf, pos)
            elif wt in (1, 5):
                pos += 8 if wt == 1 else 4
            elif wt == 2:
                n, pos = _varint(buf, pos)
                if number in NESTED and not well_typed(buf[pos : pos + n], NESTED[number]):
                    return False
                pos += n
            else:  # a group: to its matching end-group
                return _group_ok(buf, pos, number)
            if pos > len(buf):
                return False
    except (IndexError, ValueError):
        return False
    return group is None


def _group_ok(buf: bytes, pos: int, number: int) -> bool:
    """Groups are legal but rare: a well-formed one (any content) up to its end, then the rest."""
    depth = [number]
    try:
        while depth:
            tag, pos = _varint(buf, pos)
            n, wt = tag >> 3, tag & 7
            if not 0 < n <= MAX_FIELD_NUMBER or wt in (6, 7):
                return False
            if wt == 4:
                if depth.pop() != n:
                    return False
            elif wt == 3:
                depth.append(n)
            elif wt == 0:
                _, pos = _varint(buf, pos)
            elif wt in (1, 5):
                pos += 8 if wt == 1 else 4
            else:
                ln, pos = _varint(buf, pos)
                pos += ln
            if pos > len(buf):
                return False
    except (IndexError, ValueError):
        return False
    return well_typed(buf[pos:])


def compare_decode(data: bytes, ref: dict) -> str | None:
    """loglake's ``decode`` of ``data`` against the reference's answer ``ref``; a disagreement
    as one line with the input's hex, or None."""
    try:
        ours: SdsMessage | None = decode(data)
        err: SdsDecodeError | None = None
    except SdsDecodeError as e:
        ours, err = None, e
    theirs = ref.get("message")
    if "throws" in ref:
        return f"reference threw {ref['throws']!r} on {data.hex()}"
    if not well_typed(data):
        return None  # outside protons' reading of the spec (module rules); typed error only
    if theirs is None:
        if ours is not None:
            return f"loglake accepts, reference rejects: {data.hex()}"
        return None
    if not ref["utf8_valid"]:
        # refused either way; another check (an empty id) may fire before the UTF-8 one,
        # since history entries are parsed after the message's own fields
        if err is None:
            return f"loglake accepts invalid UTF-8: {data.hex()}"
        return None
    if err is not None:
        if err.reason is DropReason.MISSING_FIELD and _ids_missing(theirs):
            return None
        return f"loglake rejects ({err}), reference accepts: {data.hex()}"
    assert ours is not None
    if comparable(to_json(ours)) != comparable(theirs):
        return f"values differ: loglake {to_json(ours)} reference {theirs}: {data.hex()}"
    return None


# -- strategies ------------------------------------------------------------------------------

ids = st.text(max_size=24)
entries = st.builds(
    HistoryEntry, ids, st.none() | st.binary(max_size=24), st.none() | st.text(max_size=12)
)
messages = st.builds(
    SdsMessage,
    sender_id=ids,
    message_id=ids,
    channel_id=st.text(max_size=16),
    lamport_timestamp=st.none() | st.integers(0, UINT64_MAX),
    causal_history=st.lists(entries, max_size=5).map(tuple),
    bloom_filter=st.none() | st.binary(max_size=48),
    repair_request=st.lists(entries, max_size=3).map(tuple),
    content=st.none() | st.binary(max_size=48),
)
message_batches = st.tuples(st.lists(messages, min_size=1, max_size=25), RNGS)


def _protons_uint64_bug(m: SdsMessage) -> bool:
    return m.lamport_timestamp is not None and 2**31 <= m.lamport_timestamp < 2**32


def check_messages(peer: DiffPeer, drawn: tuple[list[SdsMessage], random.Random]):
    """Encode both ways, decode both ways, then mutants of every encoding."""
    msgs, rng = drawn
    bad: list[str] = []
    ours = [encode(m) for m in msgs]
    theirs = peer.call("sds_encode", [to_json(m) for m in msgs])
    theirs_valid = []
    for m, a, b in zip(msgs, ours, theirs, strict=True):
        fast = encode_message_fast(m)
        if fast != a:
            bad.append(f"loglake's encoders differ for {m}: pb {a.hex()} fast {fast.hex()}")
        if isinstance(b, str) and bytes.fromhex(b) != a and _protons_uint64_bug(m):
            continue  # the reference's broken uint64 writer (module rules)
        if not isinstance(b, str):
            bad.append(f"reference cannot encode {m}: {b}")
        elif bytes.fromhex(b) != a:
            bad.append(f"bytes differ for {m}: loglake {a.hex()} reference {b}")
        else:
            theirs_valid.append(bytes.fromhex(b))
    valid = sorted({*ours, *theirs_valid})
    inputs = valid + mutations(valid, MUTANTS_PER_MESSAGE * len(valid), rng)
    answers = peer.call("sds_decode", [d.hex() for d in inputs])
    for data, ref in zip(inputs, answers, strict=True):
        if (why := compare_decode(data, ref)) is not None:
            bad.append(why)
    return len(msgs) + len(inputs), bad


ERROR_RATES = (0.1, 0.05, 0.01, 0.001, 0.0001)
blooms = st.tuples(
    st.integers(1, 12_000),
    st.sampled_from(ERROR_RATES),
    st.lists(st.text(max_size=70), max_size=60),
    st.lists(st.text(max_size=70), max_size=20),
)
bloom_batches = st.tuples(st.lists(blooms, min_size=1, max_size=6), RNGS)


def _py_loads(data: bytes, capacity: int, error_rate: float) -> BloomFilter | None:
    try:
        return BloomFilter.from_bytes(data, capacity, error_rate)
    except ValueError:
        return None


def check_blooms(peer: DiffPeer, drawn: tuple[list[tuple], random.Random]):
    cases, rng = drawn
    bad: list[str] = []
    filters = []
    items = []
    for capacity, rate, inserted, probes in cases:
        f = BloomFilter(capacity, rate)
        for i in inserted:
            f.insert(i)
        filters.append(f)
        lookup = inserted + probes
        items.append({"options": {"capacity": capacity, "errorRate": rate}, "ids": inserted})
        items[-1]["lookup"] = lookup
    built = peer.call("bloom", items)
    loads = []
    for f, item, ref in zip(filters, items, built, strict=True):
        where = f"capacity {f.capacity}, error rate {f.error_rate}, ids {item['ids'][:5]}…"
        ours = f.to_bytes()
        if (ref["k"], ref["m"]) != (f.k, f.m_bits) or ref["bytes"] != ours.hex():
            km = f"k/m {ref['k']}/{ref['m']} vs {f.k}/{f.m_bits}"
            bad.append(f"bloom bytes differ ({where}): {km}")
        if ref["lookups"] != [f.lookup(i) for i in item["lookup"]]:
            bad.append(f"bloom lookups differ ({where})")
        # each side loads the other's bytes, and bit-flipped or resized copies of them
        theirs = bytes.fromhex(ref["bytes"])
        copies = [ours, theirs, mutate_bits(ours, rng)]
        if rng.random() < 0.3:
            copies.append(mutate(ours, rng, rounds=1))
        for data in copies:
            loads.append((f, item, data))
    asks = [
        {"options": it["options"], "bytes": d.hex(), "lookup": it["lookup"]} for _, it, d in loads
    ]
    answers = peer.call("bloom_from", asks)
    for (f, item, data), ref in zip(loads, answers, strict=True):
        mine = _py_loads(data, f.capacity, f.error_rate)
        where = f"{len(data)}-byte filter, capacity {f.capacity}, error rate {f.error_rate}"
        if mine is None:
            # refused by loglake: the reference throws on a short filter and ignores the
            # tail of a long one (module rules)
            if "throws" not in ref and len(data) <= f.n_bytes:
                bad.append(f"loglake refuses a {where} the reference loads")
            continue
        if "throws" in ref:
            bad.append(f"reference refuses a {where} loglake loads: {ref['throws']}")
            continue
        if ref["lookups"] != [mine.lookup(i) for i in item["lookup"]]:
            bad.append(f"lookups differ on a loaded {where}")
    return len(cases) + len(loads), bad


def mutate_bits(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randrange(1, 40)):
        i = rng.randrange(len(buf))
        buf[i] ^= 1 << rng.randrange(8)
    return bytes(buf)
