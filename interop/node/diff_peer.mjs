// loglake's one Node peer: the reference implementations, driven over stdin/stdout.
//
// One long-lived process; one JSON object per line in ({cmd, ...}), one per line out
// ({ok: true, ...} or {ok: false, error}). Bytes travel as lowercase hex, uint64 values as
// decimal strings. Used by every test and benchmark that needs a Node reference:
// tests/differential/ (fuzzers), tests/streams/test_bare_ts_interop.py, tests/sds/test_interop.py,
// benchmarks/fuzz.py and benchmarks/sds.py, all through tests/differential/peer.py.
//
// Two kinds of command:
// - codecs, in batches ({cmd, items} -> {out: [one result per item]}), so thousands of cases
//   cost one round trip:
//   - SDS messages: @waku/sds 0.0.8 `Message` (its protons-generated SdsMessage codec).
//   - SDS bloom filters: @waku/sds `DefaultBloomFilter`.
//   - Ockam stream service payloads: @bare-ts/lib 0.6.0 with the spec's schemas
//     (specs/ockam-stream-service.txt, "Payload BARE specs"; BasePayload {protocol, data}).
//   - Candid (ICRC-72/77): @dfinity/candid on types described in JSON (candid_diff.mjs).
// - SDS channels, one request each (`sds_*`): @waku/sds `MessageChannel` objects kept by name,
//   on a clock the caller sets (`sds_now` replaces Date.now), so lamport timestamps and SDS-R
//   timings are deterministic.
import readline from "node:readline";

import * as bare from "@bare-ts/lib";
import { Message, MessageChannel, MessageChannelEvent } from "@waku/sds";
import { DefaultBloomFilter } from "./node_modules/@waku/sds/dist/bloom_filter/bloom.js";
import { RepairManager } from "./node_modules/@waku/sds/dist/message_channel/repair/repair.js";
import { hashN } from "./node_modules/@waku/sds/dist/nim_hashn/nim_hashn.mjs";
import { Uint8ArrayReader } from "./node_modules/protons-runtime/dist/src/utils/reader.js";

import { candidDecode, candidEncode } from "./candid_diff.mjs";

const hex = (u8) => (u8 === undefined || u8 === null ? null : Buffer.from(u8).toString("hex"));
const unhex = (s) => (s === null || s === undefined ? undefined : new Uint8Array(Buffer.from(s, "hex")));

// ---- SDS messages ----------------------------------------------------------------------------

// protons reads a string field with a lenient hand-written UTF-8 decoder (invalid sequences
// become arbitrary code units); proto3 requires valid UTF-8, and the official runtimes (upb,
// Go) refuse it. To tell that one known difference from any other, a message the reference
// accepts is decoded a second time with a strict reader: `utf8_valid` says whether it passed.
const lenientString = Uint8ArrayReader.prototype.string;
const strictDecoder = new TextDecoder("utf-8", { fatal: true });
function strictString() {
  const bytes = this.bytes();
  return strictDecoder.decode(bytes);
}

function entryJson(e) {
  return {
    message_id: e.messageId,
    retrieval_hint: hex(e.retrievalHint),
    sender_id: e.senderId ?? null
  };
}

function messageJson(m) {
  return {
    sender_id: m.senderId,
    message_id: m.messageId,
    channel_id: m.channelId,
    lamport_timestamp: m.lamportTimestamp === undefined ? null : m.lamportTimestamp.toString(),
    causal_history: (m.causalHistory ?? []).map(entryJson),
    bloom_filter: hex(m.bloomFilter),
    repair_request: (m.repairRequest ?? []).map(entryJson),
    content: hex(m.content)
  };
}

const entryFromJson = (e) => ({
  messageId: e.message_id,
  retrievalHint: unhex(e.retrieval_hint),
  senderId: e.sender_id ?? undefined
});

function sdsEncode(m) {
  const msg = new Message(
    m.message_id,
    m.channel_id,
    m.sender_id,
    (m.causal_history ?? []).map(entryFromJson),
    m.lamport_timestamp === null || m.lamport_timestamp === undefined ? undefined : BigInt(m.lamport_timestamp),
    unhex(m.bloom_filter),
    unhex(m.content),
    (m.repair_request ?? []).map(entryFromJson)
  );
  return hex(msg.encode());
}

function sdsDecode(h) {
  const bytes = unhex(h);
  const m = Message.decode(bytes);
  if (!m) return { message: null };
  Uint8ArrayReader.prototype.string = strictString;
  let utf8Valid;
  try {
    utf8Valid = Message.decode(bytes) !== undefined;
  } finally {
    Uint8ArrayReader.prototype.string = lenientString;
  }
  return { message: messageJson(m), utf8_valid: utf8Valid };
}

// ---- SDS bloom filters -----------------------------------------------------------------------

const bloomOptions = (o) => ({ capacity: 10000, errorRate: 0.001, ...(o ?? {}) });

function bloom(c) {
  const f = new DefaultBloomFilter(bloomOptions(c.options));
  for (const id of c.ids) f.insert(id);
  return {
    bytes: hex(f.toBytes()),
    k: f.kHashes,
    m: f.totalBits,
    words: f.data.length,
    lookups: (c.lookup ?? []).map((id) => f.lookup(id))
  };
}

function bloomFrom(c) {
  const f = DefaultBloomFilter.fromBytes(unhex(c.bytes), bloomOptions(c.options));
  return { lookups: c.lookup.map((id) => f.lookup(id)), bytes: hex(f.toBytes()) };
}

// ---- BARE stream service payloads ------------------------------------------------------------

const cfg = bare.Config({});
const u = { w: (bc, v) => bare.writeUint(bc, BigInt(v)), r: (bc) => bare.readUint(bc).toString() };
const s = { w: bare.writeString, r: bare.readString };
const d = {
  w: (bc, h) => bare.writeData(bc, Uint8Array.from(Buffer.from(h, "hex")).buffer),
  r: (bc) => Buffer.from(bare.readData(bc)).toString("hex")
};
const opt = (t) => ({
  w: (bc, v) => {
    bare.writeBool(bc, v !== null);
    if (v !== null) t.w(bc, v);
  },
  r: (bc) => (bare.readBool(bc) ? t.r(bc) : null)
});
const arr = (t) => ({
  w: (bc, vs) => {
    bare.writeUintSafe(bc, vs.length);
    for (const v of vs) t.w(bc, v);
  },
  r: (bc) => {
    const n = bare.readUintSafe(bc);
    const out = [];
    for (let i = 0; i < n; i++) out.push(t.r(bc));
    return out;
  }
});
const enumOf = (names) => ({
  w: (bc, v) => bare.writeUintSafe(bc, names.indexOf(v)),
  r: (bc) => {
    const off = bc.offset;
    const v = bare.readUintSafe(bc);
    if (v >= names.length) throw new bare.BareError(off, "invalid enum value");
    return names[v];
  }
});
const struct = (fields) => ({
  w: (bc, v) => {
    for (const [k, t] of fields) t.w(bc, v[k]);
  },
  r: (bc) => Object.fromEntries(fields.map(([k, t]) => [k, t.r(bc)]))
});
const union = (members) => ({
  w: (bc, v) => {
    bare.writeUintSafe(bc, v.tag);
    members[v.tag].w(bc, v.value);
  },
  r: (bc) => {
    const off = bc.offset;
    const tag = bare.readUintSafe(bc);
    if (tag >= members.length) throw new bare.BareError(off, "invalid union tag");
    return { tag, value: members[tag].r(bc) };
  }
});

const message = struct([["index", u], ["data", d]]);
const getIndex = struct([["client_id", s], ["stream_name", s]]);
const saveIndex = struct([["client_id", s], ["stream_name", s], ["index", u]]);
const getPIndex = struct([["client_id", s], ["stream_name", s], ["partition", u]]);
const savePIndex = struct([["client_id", s], ["stream_name", s], ["partition", u], ["index", u]]);
// kind -> [protocol name, schema]; every request and response of the spec.
const KINDS = {
  create_request: ["stream_create", struct([["stream_name", opt(s)]])],
  init: ["stream_create", struct([["stream_name", s]])],
  create_partitions_request: [
    "stream_create_partitions",
    struct([["stream_name", opt(s)], ["partitions", u]])
  ],
  create_partitions_response: [
    "stream_create_partitions",
    struct([["stream_name", s], ["partition", u]])
  ],
  push_request: ["stream_push", struct([["request_id", u], ["data", d]])],
  push_confirm: ["stream_push", struct([["request_id", u], ["status", enumOf(["OK", "ERROR"])], ["index", u]])],
  pull_request: ["stream_pull", struct([["request_id", u], ["index", u], ["limit", u]])],
  pull_response: ["stream_pull", struct([["request_id", u], ["messages", arr(message)]])],
  index_request: ["stream_index", union([getIndex, saveIndex])],
  index: ["stream_index", struct([["client_id", s], ["stream_name", s], ["index", opt(u)]])],
  partition_index_request: ["stream_index", union([getPIndex, savePIndex])],
  partition_index: [
    "stream_index",
    struct([["client_id", s], ["stream_name", s], ["partition", u], ["index", opt(u)]])
  ],
  error: ["error", struct([["reason", s]])]
};

function bareEncode([kind, value]) {
  const [protocol, schema] = KINDS[kind];
  const inner = new bare.ByteCursor(new Uint8Array(cfg.initialBufferLength), cfg);
  schema.w(inner, value);
  const bc = new bare.ByteCursor(new Uint8Array(cfg.initialBufferLength), cfg);
  bare.writeString(bc, protocol);
  bare.writeData(bc, inner.bytes.slice(0, inner.offset).buffer);
  return Buffer.from(bc.bytes.subarray(0, bc.offset)).toString("hex");
}

// A decode answers the BasePayload's protocol name (when the outer layer decodes) and the body
// decoded under `kind`'s schema, so a caller can compare both layers.
function bareDecode([kind, h]) {
  const [, schema] = KINDS[kind];
  let protocol = null;
  try {
    const bc = new bare.ByteCursor(Uint8Array.from(Buffer.from(h, "hex")), cfg);
    protocol = bare.readString(bc);
    const data = new Uint8Array(bare.readData(bc));
    if (bc.offset !== bc.bytes.length) throw new Error("trailing bytes after BasePayload");
    const inner = new bare.ByteCursor(data, cfg);
    const value = schema.r(inner);
    if (inner.offset !== data.length) throw new Error("trailing bytes");
    return { protocol, ok: value };
  } catch (e) {
    return { protocol, error: String(e.message || e) };
  }
}

// ---- SDS channels (one request each) ------------------------------------------------------

let fakeNow = null;
const realNow = Date.now.bind(Date);
Date.now = () => (fakeNow === null ? realNow() : fakeNow);

const channels = new Map();

function detailJson(d) {
  if (d === null || d === undefined) return null;
  if (d instanceof Message) return { message_id: d.messageId };
  if (Array.isArray(d)) return d.map((e) => (e && e.messageId !== undefined ? entryJson(e) : e));
  if (typeof d === "object") {
    const o = {};
    for (const [k, v] of Object.entries(d)) o[k] = typeof v === "bigint" ? v.toString() : v;
    return o;
  }
  return d;
}

function sdsOpen(req) {
  const ch = new MessageChannel(req.channel, req.sender, req.options ?? {});
  const state = { ch, events: [] };
  // RepairManager (repair.ts) emits "RepairRequestQueued"/"RepairResponseQueued" by those raw
  // names, not the "sds:repair:*" enum values, so listen for both.
  for (const name of [...Object.values(MessageChannelEvent), "RepairRequestQueued", "RepairResponseQueued"]) {
    ch.addEventListener(name, (ev) => state.events.push({ type: name, detail: detailJson(ev.detail) }));
  }
  channels.set(req.name, state);
  return {};
}

function drain(state) {
  const ev = state.events;
  state.events = [];
  return ev;
}

const channelHandlers = {
  sds_now: (r) => { fakeNow = r.ms; return {}; },
  sds_open: sdsOpen,
  async sds_send(r) {
    const st = channels.get(r.name);
    let bytes = null, id = null;
    st.ch.pushOutgoingMessage(unhex(r.content), async (m) => {
      bytes = hex(m.encode()); id = m.messageId;
      return { success: true, retrievalHint: unhex(r.hint) };
    });
    await st.ch.processTasks();
    return { bytes, message_id: id, events: drain(st) };
  },
  async sds_send_ephemeral(r) {
    const st = channels.get(r.name);
    let bytes = null;
    await st.ch.pushOutgoingEphemeralMessage(unhex(r.content), async (m) => { bytes = hex(m.encode()); return true; });
    await st.ch.processTasks();
    return { bytes, events: drain(st) };
  },
  async sds_sync(r) {
    const st = channels.get(r.name);
    let bytes = null, id = null;
    const sent = await st.ch.pushOutgoingSyncMessage(async (m) => { bytes = hex(m.encode()); id = m.messageId; return true; });
    return { sent, bytes, message_id: id, events: drain(st) };
  },
  async sds_receive(r) {
    const st = channels.get(r.name);
    const m = Message.decode(unhex(r.bytes));
    if (!m) return { decoded: false, events: drain(st) };
    st.ch.pushIncomingMessage(m, unhex(r.hint));
    await st.ch.processTasks();
    return { decoded: true, events: drain(st) };
  },
  async sds_sweep_in(r) {
    const st = channels.get(r.name);
    const missing = st.ch.sweepIncomingBuffer().map(entryJson);
    return { missing, events: drain(st) };
  },
  async sds_sweep_out(r) {
    const st = channels.get(r.name);
    const { unacknowledged, possiblyAcknowledged } = st.ch.sweepOutgoingBuffer();
    return {
      unacknowledged: unacknowledged.map((m) => m.messageId),
      possibly_acknowledged: possiblyAcknowledged.map((m) => m.messageId),
      events: drain(st)
    };
  },
  async sds_sweep_repair(r) {
    const st = channels.get(r.name);
    const sent = [];
    await st.ch.sweepRepairIncomingBuffer(async (m) => { sent.push(hex(m.encode())); return true; });
    return { sent, events: drain(st) };
  },
  sds_state(r) {
    const ch = channels.get(r.name).ch;
    return {
      lamport: ch.lamportTimestamp.toString(),
      log: ch.localHistory.slice().map((m) => m.messageId),
      outgoing: ch.outgoingBuffer.map((m) => m.messageId),
      incoming: ch.incomingBuffer.map((m) => m.messageId),
      bloom: hex(ch.filter.toBytes())
    };
  },
  sds_repair_times(r) {
    const rm = new RepairManager(r.participant, r.config ?? {});
    return {
      t_req: r.items.map(([mid, now]) => rm.calculateTReq(mid, now)),
      t_resp: r.items.map(([mid, now, sender]) => rm.calculateTResp(sender, mid, now)),
      in_group: r.items.map(([mid, , sender]) => rm.isInResponseGroup(sender, mid))
    };
  },
  sds_hash_n(r) {
    return { values: r.items.map(([item, n, max]) => hashN(item, n, max)) };
  },
  // benchmark: n rounds of (a sends, b receives; b sends, a receives), timed inside Node
  async sds_pingpong(r) {
    const a = new MessageChannel(r.channel, "js-a", r.options ?? {});
    const b = new MessageChannel(r.channel, "js-b", r.options ?? {});
    const pairs = [[a, b], [b, a]];
    const marks = [];
    const t0 = performance.now();
    const c0 = process.cpuUsage();
    let done = 0;
    for (let i = 0; i < r.count; i++) {
      const [s, d] = pairs[i % 2];
      let bytes;
      s.pushOutgoingMessage(new TextEncoder().encode(`m${i}`), async (m) => { bytes = m.encode(); return { success: true }; });
      await s.processTasks();
      d.pushIncomingMessage(Message.decode(bytes), undefined);
      await d.processTasks();
      done = i + 1;
      if (r.marks.includes(done)) {
        const cpu = process.cpuUsage(c0);
        marks.push([done, performance.now() - t0, (cpu.user + cpu.system) / 1000]);
      }
      if (performance.now() - t0 > r.max_ms) break;
    }
    return { done, marks, total_ms: performance.now() - t0 };
  }
};

// ---- the loop --------------------------------------------------------------------------------

const each = (f) => (items) => items.map((x) => {
  try {
    return f(x);
  } catch (e) {
    return { throws: String(e && e.message ? e.message : e) };
  }
});

const handlers = {
  sds_encode: (r) => ({ out: each(sdsEncode)(r.items) }),
  sds_decode: (r) => ({ out: each(sdsDecode)(r.items) }),
  bloom: (r) => ({ out: each(bloom)(r.items) }),
  bloom_from: (r) => ({ out: each(bloomFrom)(r.items) }),
  bare_encode: (r) => ({ out: each(bareEncode)(r.items) }),
  bare_decode: (r) => ({ out: each(bareDecode)(r.items) }),
  candid_encode: (r) => ({ out: each(candidEncode)(r.items) }),
  candid_decode: (r) => ({ out: each(candidDecode)(r.items) }),
  ...channelHandlers
};

const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of rl) {
  if (!line.trim()) continue;
  let out;
  try {
    const req = JSON.parse(line);
    const h = handlers[req.cmd];
    if (!h) throw new Error(`unknown cmd ${req.cmd}`);
    out = { ok: true, ...(await h(req)) };
  } catch (e) {
    out = { ok: false, error: String(e && e.stack ? e.stack : e) };
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}
