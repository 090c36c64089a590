"""Filters and skip for subscriptions and replays — loglake's definition.

ICRC-72 says filters SHOULD use "ICRC16 Path" notation (CandyPath) and leaves the grammar to the
implementation; ICRC-77 requires ImproperConfig for an unsupported filter or skip. The Motoko
code is no guide here (FIELD-NOTES "ICRC-72/77": its subscriber never applies filter or skip, its
broadcaster misreads skip, and its CandyPath lookup does not walk #Map). So loglake defines:

Filter text::

    filter  := path [op literal]
    path    := seg ("." seg)*            seg := name | index | "quoted name"
    index   := [0-9]+                    (so ``m.0.1`` is element 1 of element 0)
    op      := "==" | "!=" | "<" | "<=" | ">" | ">=" | "~="
    literal := integer | decimal | "text" | 'text' | true | false

The path walks the event's ICRC-16 ``data``: a name selects a ``#Map`` key, a ``#Class``
property or a ``#ValueMap`` entry keyed ``#Text(name)``; an index selects an element of
``#Array``, ``#Set``, ``#Nats`` or ``#Floats``; ``#Option`` is unwrapped at every step. With no
operator the filter matches when the path exists. Numbers compare numerically across every
numeric variant; ``#Text`` compares with text literals (``~=``: contains); ``#Bool`` with
``true``/``false`` (``==``/``!=``); ``#Principal`` by its text form; ``~=`` on ``#Array``/``#Set``
means "has an element equal to the literal". A missing path or a type mismatch does not match.

Skip ``[#Nat(mod), #Nat(offset)?]``: deliver event id ``i`` iff ``(i + offset) mod mod == 0``
(ICRC-72 "Skipping records": "only receive a message if the mod of the value provided is 0",
offset for partitioning); ``mod = 0`` → ImproperConfig.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from loglake.errors import LocalProtocolError
from loglake.events.messages import C_SUB_FILTER, C_SUB_SKIP, C_SUB_STOPPED
from loglake.wire.icrc16 import RawValue, Value, map_get

MAX_FILTER_LEN = 1024


class ImproperConfig(LocalProtocolError, ValueError):
    """A config value loglake does not support (→ the ``ImproperConfig`` error variant)."""


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<op>==|!=|<=|>=|~=|<|>)
      | (?P<num>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
      | "(?P<dq>(?:[^"\\]|\\.)*)"
      | '(?P<sq>(?:[^'\\]|\\.)*)'
      | (?P<name>[A-Za-z_][A-Za-z0-9_:\-]*)
      | (?P<dot>\.)
    )""",
    re.VERBOSE | re.ASCII,  # an index is ASCII digits (``\d`` would take any script's)
)
_INDEXES = re.compile(r"[0-9]+(?:\.[0-9]+)*", re.ASCII)
"""What the number token reads where a path segment goes: ``0.1`` in ``m.0.1`` is two index
segments (element 1 of element 0), not a decimal."""
_NUMERIC = {"Nat", "Int", "Float", "Nat8", "Nat16", "Nat32", "Nat64", "Int8", "Int16", "Int32"}
_NUMERIC |= {"Int64"}
_MISSING = object()


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ImproperConfig(f"filter: unexpected {text[pos : pos + 10]!r} at {pos}")
        kind = m.lastgroup or ""
        val = m.group(kind)
        if kind in ("dq", "sq"):
            kind, val = "str", re.sub(r"\\(.)", r"\1", val)
        out.append((kind, val))
        pos = m.end()
    return out


@dataclass(frozen=True)
class Filter:
    text: str
    path: tuple[str | int, ...]
    op: str | None
    literal: Any

    @classmethod
    def parse(cls, text: str) -> Filter:
        if not isinstance(text, str) or not text.strip():
            raise ImproperConfig("filter: empty")
        if len(text) > MAX_FILTER_LEN:
            raise ImproperConfig(f"filter: longer than {MAX_FILTER_LEN} characters")
        toks = _tokens(text)
        path: list[str | int] = []
        i = 0
        while True:
            if i >= len(toks):
                raise ImproperConfig("filter: path expected")
            kind, val = toks[i]
            if kind == "name" or kind == "str":
                path.append(val)
            elif kind == "num" and _INDEXES.fullmatch(val):
                path.extend(int(x) for x in val.split("."))
            else:
                raise ImproperConfig(f"filter: path segment expected, got {val!r}")
            i += 1
            if i < len(toks) and toks[i][0] == "dot":
                i += 1
                continue
            break
        if i == len(toks):
            return cls(text, tuple(path), None, None)
        if toks[i][0] != "op":
            raise ImproperConfig(f"filter: operator expected, got {toks[i][1]!r}")
        op = toks[i][1]
        if i + 2 != len(toks):
            raise ImproperConfig("filter: one literal expected after the operator")
        kind, val = toks[i + 1]
        if kind == "num":
            lit: Any = float(val) if any(c in val for c in ".eE") else int(val)
        elif kind == "str":
            lit = val
        elif kind == "name" and val in ("true", "false"):
            lit = val == "true"
        else:
            raise ImproperConfig(f"filter: literal expected, got {val!r}")
        if isinstance(lit, bool) and op not in ("==", "!="):
            raise ImproperConfig("filter: booleans compare with == or != only")
        return cls(text, tuple(path), op, lit)

    def matches(self, data: Value | RawValue) -> bool:
        if isinstance(data, RawValue):  # stored bytes not decoded yet (in-process callers)
            data = data.decode()
        v = _walk(data, self.path)
        if v is _MISSING:
            return False
        if self.op is None:
            return True
        return _compare(v, self.op, self.literal)


def _unwrap(v: Any) -> Any:
    while isinstance(v, dict) and "Option" in v:
        v = v["Option"]
        if v is None:
            return _MISSING
    return v


def _walk(v: Any, path: tuple[str | int, ...]) -> Any:
    for seg in path:
        v = _unwrap(v)
        if v is _MISSING or not isinstance(v, dict):
            return _MISSING
        ((tag, x),) = v.items()
        if isinstance(seg, int):
            if tag in ("Array", "Set") and seg < len(x):
                v = x[seg]
            elif tag == "Nats" and seg < len(x):
                v = {"Nat": x[seg]}
            elif tag == "Floats" and seg < len(x):
                v = {"Float": x[seg]}
            else:
                seg = str(seg)  # a Map key may be digits
        if isinstance(seg, str):
            if tag == "Map":
                v = map_get(x, seg)
            elif tag == "Class":
                v = next((p.value for p in x if p.name == seg), None)
            elif tag == "ValueMap":
                v = next((val for k, val in x if k == {"Text": seg}), None)
            else:
                return _MISSING
            if v is None:
                return _MISSING
    return _unwrap(v)


def _cmp(a: Any, op: str, b: Any) -> bool:
    if op == "==":
        return a == b
    if op == "!=":
        return a != b
    if op == "<":
        return a < b
    if op == "<=":
        return a <= b
    if op == ">":
        return a > b
    if op == ">=":
        return a >= b
    return False


def _compare(v: Any, op: str, lit: Any) -> bool:
    ((tag, x),) = v.items()
    if op == "~=":
        if tag == "Text" and isinstance(lit, str):
            return lit in x
        if tag in ("Array", "Set"):
            return any(_compare(_unwrap(e), "==", lit) for e in x if _unwrap(e) is not _MISSING)
        return _compare(v, "==", lit)
    if tag in _NUMERIC and isinstance(lit, int | float) and not isinstance(lit, bool):
        return _cmp(x, op, lit)
    if tag == "Text" and isinstance(lit, str):
        return _cmp(x, op, lit)
    if tag == "Bool" and isinstance(lit, bool):
        return _cmp(x, op, lit)
    if tag == "Principal" and isinstance(lit, str):
        return _cmp(x.to_str(), op, lit)
    return False


@dataclass(frozen=True)
class Skip:
    mod: int
    offset: int = 0

    def keeps(self, event_id: int) -> bool:
        return (event_id + self.offset) % self.mod == 0

    def to_icrc16(self) -> Value:
        return {"Array": [{"Nat": self.mod}, {"Nat": self.offset}]}


def parse_skip(v: Value | None) -> Skip | None:
    v = _unwrap(v) if v is not None else None
    if v is None or v is _MISSING:
        return None
    if not isinstance(v, dict) or "Array" not in v:
        raise ImproperConfig("skip: expected #Array([#Nat(mod), #Nat(offset)?])")
    items = v["Array"]
    if not 1 <= len(items) <= 2:
        raise ImproperConfig("skip: expected one or two #Nat")
    nums = []
    for it in items:
        it = _unwrap(it)
        if not isinstance(it, dict) or "Nat" not in it:
            raise ImproperConfig("skip: every element must be #Nat")
        nums.append(it["Nat"])
    if nums[0] == 0:
        raise ImproperConfig("skip: mod must not be 0")
    return Skip(nums[0], nums[1] if len(nums) == 2 else 0)


def parse_filter(v: Value | None) -> Filter | None:
    v = _unwrap(v) if v is not None else None
    if v is None or v is _MISSING:
        return None
    if not isinstance(v, dict) or "Text" not in v:
        raise ImproperConfig("filter: expected #Text or #Option(#Text)")
    return Filter.parse(v["Text"])


REPLAY_FILTER_KEYS = ("filter", C_SUB_FILTER)
REPLAY_SKIP_KEYS = ("skip", C_SUB_SKIP)


def parse_replay_config(config: list[tuple[str, Value]]) -> tuple[Filter | None, Skip | None]:
    """Filter and skip of a ReplayRegistration config; any other key → ImproperConfig."""
    f = s = None
    for key, val in config:
        if key in REPLAY_FILTER_KEYS:
            f = parse_filter(val)
        elif key in REPLAY_SKIP_KEYS:
            s = parse_skip(val)
        else:
            raise ImproperConfig(f"unsupported replay config key {key!r}")
    return f, s


def parse_subscription_config(
    config: list[tuple[str, Value]],
) -> tuple[Filter | None, Skip | None, bool]:
    """``icrc72:subscription:filter|skip|stopped`` (ICRC-72 "Subscription Configs")."""
    f = parse_filter(map_get(config, C_SUB_FILTER))
    s = parse_skip(map_get(config, C_SUB_SKIP))
    stopped = map_get(config, C_SUB_STOPPED)
    if stopped is not None and "Bool" not in stopped:
        raise ImproperConfig(f"{C_SUB_STOPPED} must be #Bool")
    return f, s, bool(stopped and stopped["Bool"])
