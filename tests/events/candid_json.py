"""Typed JSON for comparing Candid values with interop/node/candid_icrc77.mjs.

Walks an icp_candid type beside a value in icp_candid's form and produces the JSON the Node
script reads and writes: bigints (nat, int, nat64, int64) as {"$int": str}, blobs as
{"$blob": hex}, principals as {"$principal": text}, records by field name (tuples as lists).
"""

from __future__ import annotations

from typing import Any

from icp_candid import candid as C

from loglake.wire import icrc16


def typed(t: Any, v: Any) -> Any:
    if isinstance(v, icrc16.RawValue):  # an Event's data kept as its bytes: its value
        v = icrc16.to_candid(v.decode())
    if isinstance(t, C.RecClass):
        return typed(t.get_type(), v)
    if isinstance(t, C.NatClass | C.IntClass):
        return {"$int": str(v)}
    if isinstance(t, C.FixedNatClass | C.FixedIntClass):
        return {"$int": str(v)} if t._bits == 64 else v
    if isinstance(t, C.FloatClass | C.TextClass | C.BoolClass | C.NullClass):
        return v
    if isinstance(t, C.PrincipalClass):
        return {"$principal": v.to_str()}
    if isinstance(t, C.VecClass):
        if t._is_blob:
            return {"$blob": bytes(v).hex()}
        return [typed(t._type, x) for x in v]
    if isinstance(t, C.OptClass):
        return [typed(t._type, x) for x in v]
    if isinstance(t, C.RecordClass):
        fields = [t._field_map[h] for h in t._sorted_hashes]
        if t.tryAsTuple() and fields:
            items = list(v.values()) if isinstance(v, dict) else list(v)
            by_index = sorted(fields, key=lambda f: int(f[0]))
            return [typed(ft, items[i]) for i, (_, ft) in enumerate(by_index)]
        return {name: typed(ft, v[name]) for name, ft in fields}
    if isinstance(t, C.VariantClass):
        ((k, x),) = v.items()
        _, ft = t._field_map[C.get_field_hash(k)]
        return {k: typed(ft, x)}
    raise TypeError(f"no typed JSON for {t!r}")
