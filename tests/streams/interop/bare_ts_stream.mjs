// The Ockam stream service payloads written with an independent BARE implementation,
// @bare-ts/lib (npm), to cross-check loglake.streams.codec byte for byte.
// Schemas: specs/ockam-stream-service.txt ("Payload BARE specs"); BasePayload {protocol, data}.
// stdin: {"mode": "encode"|"decode", "items": [[kind, value|hex], ...]}; stdout: JSON results.
// argv[2]: the interop/node folder whose node_modules holds @bare-ts/lib.
import { createRequire } from "node:module";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const require = createRequire(join(resolve(process.argv[2]), "package.json"));
const bare = await import(pathToFileURL(require.resolve("@bare-ts/lib")).href);

const cfg = bare.Config({});
const u = {
  w: (bc, v) => bare.writeUint(bc, BigInt(v)),
  r: (bc) => bare.readUint(bc).toString(),
};
const s = { w: bare.writeString, r: bare.readString };
const d = {
  w: (bc, hex) => bare.writeData(bc, Uint8Array.from(Buffer.from(hex, "hex")).buffer),
  r: (bc) => Buffer.from(bare.readData(bc)).toString("hex"),
};
const opt = (t) => ({
  w: (bc, v) => {
    bare.writeBool(bc, v !== null);
    if (v !== null) t.w(bc, v);
  },
  r: (bc) => (bare.readBool(bc) ? t.r(bc) : null),
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
  },
});
const status = {
  w: (bc, v) => bare.writeUintSafe(bc, { OK: 0, ERROR: 1 }[v]),
  r: (bc) => {
    const off = bc.offset;
    const v = bare.readUintSafe(bc);
    if (v > 1) throw new bare.BareError(off, "invalid enum value");
    return ["OK", "ERROR"][v];
  },
};
const struct = (fields) => ({
  w: (bc, v) => {
    for (const [k, t] of fields) t.w(bc, v[k]);
  },
  r: (bc) => Object.fromEntries(fields.map(([k, t]) => [k, t.r(bc)])),
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
  },
});

const message = struct([["index", u], ["data", d]]);
const getIndex = struct([["client_id", s], ["stream_name", s]]);
const saveIndex = struct([["client_id", s], ["stream_name", s], ["index", u]]);
const getPIndex = struct([["client_id", s], ["stream_name", s], ["partition", u]]);
const savePIndex = struct([["client_id", s], ["stream_name", s], ["partition", u], ["index", u]]);
const KINDS = {
  create_request: ["stream_create", struct([["stream_name", opt(s)]])],
  init: ["stream_create", struct([["stream_name", s]])],
  create_partitions_request: [
    "stream_create_partitions",
    struct([["stream_name", opt(s)], ["partitions", u]]),
  ],
  create_partitions_response: [
    "stream_create_partitions",
    struct([["stream_name", s], ["partition", u]]),
  ],
  push_request: ["stream_push", struct([["request_id", u], ["data", d]])],
  push_confirm: ["stream_push", struct([["request_id", u], ["status", status], ["index", u]])],
  pull_request: ["stream_pull", struct([["request_id", u], ["index", u], ["limit", u]])],
  pull_response: ["stream_pull", struct([["request_id", u], ["messages", arr(message)]])],
  index_request: ["stream_index", union([getIndex, saveIndex])],
  index: ["stream_index", struct([["client_id", s], ["stream_name", s], ["index", opt(u)]])],
  partition_index_request: ["stream_index", union([getPIndex, savePIndex])],
  partition_index: [
    "stream_index",
    struct([["client_id", s], ["stream_name", s], ["partition", u], ["index", opt(u)]]),
  ],
  error: ["error", struct([["reason", s]])],
};

function encode(kind, value) {
  const [protocol, schema] = KINDS[kind];
  const inner = new bare.ByteCursor(new Uint8Array(cfg.initialBufferLength), cfg);
  schema.w(inner, value);
  const bc = new bare.ByteCursor(new Uint8Array(cfg.initialBufferLength), cfg);
  bare.writeString(bc, protocol);
  bare.writeData(bc, inner.bytes.slice(0, inner.offset).buffer);
  return Buffer.from(bc.bytes.subarray(0, bc.offset)).toString("hex");
}

function decode(kind, hex) {
  const [protocol, schema] = KINDS[kind];
  try {
    const bc = new bare.ByteCursor(Uint8Array.from(Buffer.from(hex, "hex")), cfg);
    const name = bare.readString(bc);
    const data = new Uint8Array(bare.readData(bc));
    if (bc.offset !== bc.bytes.length) throw new Error("trailing bytes after BasePayload");
    if (name !== protocol) throw new Error(`protocol ${name}, expected ${protocol}`);
    const inner = new bare.ByteCursor(data, cfg);
    const value = schema.r(inner);
    if (inner.offset !== data.length) throw new Error("trailing bytes");
    return { ok: value };
  } catch (e) {
    return { error: String(e.message || e) };
  }
}

let input = "";
process.stdin.on("data", (c) => (input += c));
process.stdin.on("end", () => {
  const { mode, items } = JSON.parse(input);
  const out = items.map(([kind, v]) => (mode === "encode" ? encode(kind, v) : decode(kind, v)));
  process.stdout.write(JSON.stringify(out));
});
