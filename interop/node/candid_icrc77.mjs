// loglake interop helper: the ICRC-72/77 Candid types written with @dfinity/candid, and a
// batch encoder/decoder driven by tests/events/test_candid_interop.py.
//
// stdin: JSON array of {op: "decode", type, hex} | {op: "encode", type, value}
//        | {op: "principal", der} | {op: "parse_principal", text}
// stdout: JSON array of {value} | {hex} | {error}
// Typed JSON: {"$int": "123"} is a bigint (nat, int, nat64, int64), {"$blob": "hex"} bytes,
// {"$principal": "text"} a principal; plain numbers are nat8..32 / int8..32 / floats.
// Types follow specs/icrc-77-event-replay.txt and the ICRC-72 candidate, as
// src/loglake/events/candid_types.py does (same choices for the undefined types).
import { IDL } from "@dfinity/candid";
import { Principal } from "@dfinity/principal";

const ICRC16 = IDL.Rec();
const ICRC16Map = IDL.Vec(IDL.Tuple(IDL.Text, ICRC16));
const ICRC16Property = IDL.Record({ name: IDL.Text, value: ICRC16, immutable: IDL.Bool });
ICRC16.fill(
  IDL.Variant({
    Array: IDL.Vec(ICRC16),
    Blob: IDL.Vec(IDL.Nat8),
    Bool: IDL.Bool,
    Bytes: IDL.Vec(IDL.Nat8),
    Class: IDL.Vec(ICRC16Property),
    Float: IDL.Float64,
    Floats: IDL.Vec(IDL.Float64),
    Int: IDL.Int,
    Int16: IDL.Int16,
    Int32: IDL.Int32,
    Int64: IDL.Int64,
    Int8: IDL.Int8,
    Map: ICRC16Map,
    ValueMap: IDL.Vec(IDL.Tuple(ICRC16, ICRC16)),
    Nat: IDL.Nat,
    Nat16: IDL.Nat16,
    Nat32: IDL.Nat32,
    Nat64: IDL.Nat64,
    Nat8: IDL.Nat8,
    Nats: IDL.Vec(IDL.Nat),
    Option: IDL.Opt(ICRC16),
    Principal: IDL.Principal,
    Set: IDL.Vec(ICRC16),
    Text: IDL.Text,
  }),
);
const GenericError = IDL.Record({ error_code: IDL.Nat, message: IDL.Text });
const Range = IDL.Tuple(IDL.Nat, IDL.Opt(IDL.Nat));
const ReplayRegistration = IDL.Record({
  namespace: IDL.Text,
  range: Range,
  config: ICRC16Map,
  memo: IDL.Vec(IDL.Nat8),
});
const ReplayRegisterError = IDL.Variant({
  Unauthorized: IDL.Null,
  UnauthorizedSubscriber: IDL.Record({ namespace: IDL.Text }),
  ImproperConfig: IDL.Text,
  PaymentRequired: IDL.Text,
  RangeTooLarge: IDL.Text,
  GenericError: GenericError,
  GenericBatchError: IDL.Text,
  PublicationNotFound: IDL.Null,
  SubscriptionNotFound: IDL.Null,
});
const ReplayState = IDL.Variant({
  pending: IDL.Null,
  running: IDL.Null,
  completed: IDL.Nat,
  canceled: IDL.Nat,
  errored: IDL.Text,
});
const ReplayStatus = IDL.Record({
  replayId: IDL.Nat,
  namespace: IDL.Text,
  config: ICRC16Map,
  stats: ICRC16Map,
  range: Range,
  status: ReplayState,
});
const CancelReplayError = IDL.Variant({
  Unauthorized: IDL.Null,
  NotFound: IDL.Null,
  CannotCancel: IDL.Text,
  GenericError: GenericError,
  GenericBatchError: IDL.Text,
});
const Slice = IDL.Variant({
  BySubscriber: IDL.Principal,
  ByPublisher: IDL.Principal,
  ByBroadcaster: IDL.Principal,
  ByNamespace: IDL.Text,
});
const OrchestrationFilter = IDL.Record({
  statistics: IDL.Variant({ None: IDL.Null, All: IDL.Null, List: IDL.Vec(IDL.Text) }),
  slice: IDL.Vec(Slice),
});
const TYPES = {
  ICRC16,
  ICRC16Map,
  ReplayRegistration,
  ReplayRegisterError,
  ReplayRegisterResult: IDL.Opt(IDL.Variant({ Ok: IDL.Nat, Err: ReplayRegisterError })),
  ReplayState,
  ReplayStatus,
  ReplayStatusUpdate: IDL.Record({ replayId: IDL.Nat, status: ReplayState }),
  CancelReplayError,
  CancelReplayResult: IDL.Opt(IDL.Variant({ Ok: IDL.Nat, Err: CancelReplayError })),
  ReplayStatusUpdateResult: IDL.Variant({ Ok: IDL.Null, Err: GenericError }),
  GetReplaysArgs: IDL.Record({
    prev: IDL.Opt(IDL.Principal),
    take: IDL.Opt(IDL.Nat),
    filter: IDL.Opt(OrchestrationFilter),
  }),
  OrchestrationFilter,
  Event: IDL.Record({
    eventId: IDL.Nat,
    prevEventId: IDL.Opt(IDL.Nat),
    timestamp: IDL.Nat,
    namespace: IDL.Text,
    data: ICRC16,
    source: IDL.Principal,
    headers: IDL.Opt(ICRC16Map),
  }),
  EventNotification: IDL.Record({
    notificationId: IDL.Nat,
    eventId: IDL.Nat,
    prevEventId: IDL.Opt(IDL.Nat),
    timestamp: IDL.Nat,
    namespace: IDL.Text,
    data: ICRC16,
    headers: IDL.Opt(ICRC16Map),
    source: IDL.Principal,
    filter: IDL.Opt(IDL.Text),
  }),
};
// the replay data plane's batches (loglake.events.fastcodec writes them)
TYPES.EventNotificationBatch = IDL.Vec(TYPES.EventNotification);
TYPES.EventBatch = IDL.Vec(TYPES.Event);

function revive(v) {
  if (Array.isArray(v)) return v.map(revive);
  if (v && typeof v === "object") {
    if ("$int" in v) return BigInt(v.$int);
    if ("$blob" in v) return Uint8Array.from(Buffer.from(v.$blob, "hex"));
    if ("$principal" in v) return Principal.fromText(v.$principal);
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, revive(x)]));
  }
  return v;
}

function typed(v) {
  if (typeof v === "bigint") return { $int: v.toString() };
  if (v instanceof Uint8Array) return { $blob: Buffer.from(v).toString("hex") };
  if (v && typeof v === "object" && v._isPrincipal) return { $principal: v.toText() };
  if (Array.isArray(v)) return v.map(typed);
  if (v && typeof v === "object") {
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, typed(x)]));
  }
  return v;
}

const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const requests = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const out = requests.map((r) => {
  try {
    const t = TYPES[r.type];
    if (!t && (r.op === "decode" || r.op === "encode")) throw new Error(`unknown type ${r.type}`);
    if (r.op === "principal") {
      // self-authenticating principal of a DER public key, as text
      const der = new Uint8Array(Buffer.from(r.der, "hex"));
      return { text: Principal.selfAuthenticating(der).toText() };
    }
    if (r.op === "parse_principal") {
      return { hex: Buffer.from(Principal.fromText(r.text).toUint8Array()).toString("hex") };
    }
    if (r.op === "decode") {
      const [v] = IDL.decode([t], new Uint8Array(Buffer.from(r.hex, "hex")));
      return { value: typed(v) };
    }
    return { hex: Buffer.from(IDL.encode([t], [revive(r.value)])).toString("hex") };
  } catch (e) {
    return { error: String(e && e.message ? e.message : e) };
  }
});
process.stdout.write(JSON.stringify(out));
