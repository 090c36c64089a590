// Candid for the differential fuzzing peer (diff_peer.mjs): @dfinity/candid encodes and decodes
// values of types described in JSON, so tests/differential/candid.py can compare loglake's Candid
// codec with the reference on random types, values and mutated bytes.
//
// Type JSON: {k: "null"|"bool"|"nat"|"int"|"nat8".."int64"|"text"|"principal"|"reserved"}
//            | {k: "opt"|"vec", t} | {k: "record"|"variant", f: [[name, type], ...]}.
// Value JSON, driven by the type: nat/int/nat64/int64 as decimal strings, nat8..int32 numbers,
// opt as [] or [v], vec as a list, record as an object, variant as {tag: v}, principal as text.
import { IDL } from "@dfinity/candid";
import { Principal } from "@dfinity/principal";

const PRIM = {
  null: IDL.Null, bool: IDL.Bool, nat: IDL.Nat, int: IDL.Int, text: IDL.Text, reserved: IDL.Reserved,
  nat8: IDL.Nat8, nat16: IDL.Nat16, nat32: IDL.Nat32, nat64: IDL.Nat64,
  int8: IDL.Int8, int16: IDL.Int16, int32: IDL.Int32, int64: IDL.Int64, principal: IDL.Principal
};
const BIG = new Set(["nat", "int", "nat64", "int64"]);

function idl(t) {
  if (t.k in PRIM) return PRIM[t.k];
  if (t.k === "opt") return IDL.Opt(idl(t.t));
  if (t.k === "vec") return IDL.Vec(idl(t.t));
  const fields = Object.fromEntries(t.f.map(([n, ft]) => [n, idl(ft)]));
  if (t.k === "record") return IDL.Record(fields);
  if (t.k === "variant") return IDL.Variant(fields);
  throw new Error(`unknown type ${t.k}`);
}

function toJs(t, v) {
  if (BIG.has(t.k)) return BigInt(v);
  if (t.k === "principal") return Principal.fromText(v);
  if (t.k === "reserved") return null;
  if (t.k === "opt") return v.length ? [toJs(t.t, v[0])] : [];
  if (t.k === "vec") return v.map((x) => toJs(t.t, x));
  if (t.k === "record") return Object.fromEntries(t.f.map(([n, ft]) => [n, toJs(ft, v[n])]));
  if (t.k === "variant") {
    const [tag] = Object.keys(v);
    const ft = t.f.find(([n]) => n === tag)[1];
    return { [tag]: toJs(ft, v[tag]) };
  }
  return v;
}

function fromJs(t, v) {
  if (BIG.has(t.k)) return v.toString();
  if (t.k === "principal") return v.toText();
  if (t.k === "reserved") return null;
  if (t.k === "opt") return v.length ? [fromJs(t.t, v[0])] : [];
  if (t.k === "vec") return Array.from(v, (x) => fromJs(t.t, x));
  if (t.k === "record") return Object.fromEntries(t.f.map(([n, ft]) => [n, fromJs(ft, v[n])]));
  if (t.k === "variant") {
    const [tag] = Object.keys(v);
    const ft = t.f.find(([n]) => n === tag)[1];
    return { [tag]: fromJs(ft, v[tag]) };
  }
  return v;
}

// {type, value} -> hex of IDL.encode([type], [value])
export function candidEncode(x) {
  const t = idl(x.type);
  return Buffer.from(IDL.encode([t], [toJs(x.type, x.value)])).toString("hex");
}

// {type, hex} -> {value} (the first argument, decoded as `type`)
export function candidDecode(x) {
  const [v] = IDL.decode([idl(x.type)], new Uint8Array(Buffer.from(x.hex, "hex")));
  return { value: fromJs(x.type, v) };
}
