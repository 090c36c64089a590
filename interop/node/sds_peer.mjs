// loglake interop peer for SDS: drives @waku/sds 0.0.8 over stdin/stdout JSON lines.
//
// One JSON object per line in, one per line out ({ok: true, ...} or {ok: false, error}).
// Bytes travel as lowercase hex. Date.now is replaced by a clock the test sets ("now"), so the
// lamport timestamps and SDS-R timings of @waku/sds are deterministic. Used by
// tests/sds/test_interop.py and benchmarks/sds.py.
import readline from "node:readline";

import { Message, MessageChannel, MessageChannelEvent } from "@waku/sds";
import { DefaultBloomFilter } from "./node_modules/@waku/sds/dist/bloom_filter/bloom.js";
import { RepairManager } from "./node_modules/@waku/sds/dist/message_channel/repair/repair.js";
import { hashN } from "./node_modules/@waku/sds/dist/nim_hashn/nim_hashn.mjs";

let fakeNow = null;
const realNow = Date.now.bind(Date);
Date.now = () => (fakeNow === null ? realNow() : fakeNow);

const channels = new Map();
const hex = (u8) => (u8 ? Buffer.from(u8).toString("hex") : null);
const unhex = (s) => (s === null || s === undefined ? undefined : new Uint8Array(Buffer.from(s, "hex")));

function entryJson(e) {
  return { message_id: e.messageId, retrieval_hint: hex(e.retrievalHint), sender_id: e.senderId ?? null };
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

function open(req) {
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

const handlers = {
  now: (r) => { fakeNow = r.ms; return {}; },
  open,
  async send(r) {
    const st = channels.get(r.name);
    let bytes = null, id = null;
    st.ch.pushOutgoingMessage(unhex(r.content), async (m) => {
      bytes = hex(m.encode()); id = m.messageId;
      return { success: true, retrievalHint: unhex(r.hint) };
    });
    await st.ch.processTasks();
    return { bytes, message_id: id, events: drain(st) };
  },
  async send_ephemeral(r) {
    const st = channels.get(r.name);
    let bytes = null;
    await st.ch.pushOutgoingEphemeralMessage(unhex(r.content), async (m) => { bytes = hex(m.encode()); return true; });
    await st.ch.processTasks();
    return { bytes, events: drain(st) };
  },
  async sync(r) {
    const st = channels.get(r.name);
    let bytes = null, id = null;
    const sent = await st.ch.pushOutgoingSyncMessage(async (m) => { bytes = hex(m.encode()); id = m.messageId; return true; });
    return { sent, bytes, message_id: id, events: drain(st) };
  },
  async receive(r) {
    const st = channels.get(r.name);
    const m = Message.decode(unhex(r.bytes));
    if (!m) return { decoded: false, events: drain(st) };
    st.ch.pushIncomingMessage(m, unhex(r.hint));
    await st.ch.processTasks();
    return { decoded: true, events: drain(st) };
  },
  async sweep_in(r) {
    const st = channels.get(r.name);
    const missing = st.ch.sweepIncomingBuffer().map(entryJson);
    return { missing, events: drain(st) };
  },
  async sweep_out(r) {
    const st = channels.get(r.name);
    const { unacknowledged, possiblyAcknowledged } = st.ch.sweepOutgoingBuffer();
    return {
      unacknowledged: unacknowledged.map((m) => m.messageId),
      possibly_acknowledged: possiblyAcknowledged.map((m) => m.messageId),
      events: drain(st)
    };
  },
  async sweep_repair(r) {
    const st = channels.get(r.name);
    const sent = [];
    await st.ch.sweepRepairIncomingBuffer(async (m) => { sent.push(hex(m.encode())); return true; });
    return { sent, events: drain(st) };
  },
  state(r) {
    const ch = channels.get(r.name).ch;
    return {
      lamport: ch.lamportTimestamp.toString(),
      log: ch.localHistory.slice().map((m) => m.messageId),
      outgoing: ch.outgoingBuffer.map((m) => m.messageId),
      incoming: ch.incomingBuffer.map((m) => m.messageId),
      bloom: hex(ch.filter.toBytes())
    };
  },
  bloom(r) {
    const f = new DefaultBloomFilter({ capacity: 10000, errorRate: 0.001, ...(r.options ?? {}) });
    for (const id of r.ids) f.insert(id);
    const lookups = (r.lookup ?? []).map((id) => f.lookup(id));
    return { bytes: hex(f.toBytes()), k: f.kHashes, m: f.totalBits, words: f.data.length, lookups };
  },
  repair_times(r) {
    const rm = new RepairManager(r.participant, r.config ?? {});
    return {
      t_req: r.items.map(([mid, now]) => rm.calculateTReq(mid, now)),
      t_resp: r.items.map(([mid, now, sender]) => rm.calculateTResp(sender, mid, now)),
      in_group: r.items.map(([mid, , sender]) => rm.isInResponseGroup(sender, mid))
    };
  },
  hash_n(r) {
    return { values: r.items.map(([item, n, max]) => hashN(item, n, max)) };
  },
  encode(r) {
    const m = r.message;
    const msg = new Message(
      m.message_id, m.channel_id, m.sender_id,
      (m.causal_history ?? []).map((e) => ({ messageId: e.message_id, retrievalHint: unhex(e.retrieval_hint), senderId: e.sender_id ?? undefined })),
      m.lamport_timestamp === null || m.lamport_timestamp === undefined ? undefined : BigInt(m.lamport_timestamp),
      unhex(m.bloom_filter),
      unhex(m.content),
      (m.repair_request ?? []).map((e) => ({ messageId: e.message_id, retrievalHint: unhex(e.retrieval_hint), senderId: e.sender_id ?? undefined }))
    );
    return { bytes: hex(msg.encode()) };
  },
  decode(r) {
    const m = Message.decode(unhex(r.bytes));
    return m ? { message: messageJson(m) } : { message: null };
  },
  // benchmark: n rounds of (a sends, b receives; b sends, a receives), timed inside Node
  async pingpong(r) {
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

const rl = readline.createInterface({ input: process.stdin });
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
