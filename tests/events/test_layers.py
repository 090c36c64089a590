"""The import graph of ``loglake.events`` as docs/events.md states it ("Structure"): vocabulary,
then sans-I/O cores, then adapters; a core never imports an adapter, a ``Log`` or a ``Streams``;
events uses no sibling part."""

from __future__ import annotations

import ast
from pathlib import Path

import loglake.events

PKG = Path(loglake.events.__file__).parent
VOCABULARY = {
    "messages",
    "actions",
    "filters",
    "sysmsg",
    "identity",
    "candid_types",
    "codec",
    "fastcodec",
    "journal",
    "ledger",
    "resend",
    "live",
}
CORES = {
    "role",
    "orchestrator",
    "orchestrator_state",
    "orchestrator_replays",
    "broadcaster",
    "publisher",
    "subscriber",
}
ADAPTERS = {"store", "network", "server", "client", "cli", "__init__"}
# what vocabulary and cores may take from outside events: values and names, never I/O
PURE_OUTSIDE = {
    "loglake.errors": None,
    "loglake.wire": None,
    "loglake.wire.icrc16": None,
    "loglake.wire.candid": None,
    "loglake.wire.varint": None,
    "loglake.streams.api": {"StreamMessage", "check_stream_name"},
}
SIBLINGS = ("loglake.sds", "loglake.cardinal", "loglake.archives", "loglake.pipeline")


def _imports(name: str) -> list[tuple[str, list[str]]]:
    tree = ast.parse((PKG / f"{name}.py").read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("loglake"):
            names = [a.name for a in node.names]
            if node.module == "loglake.events":  # `from loglake.events import sysmsg`
                out += [(f"loglake.events.{n}", []) for n in names]
            else:
                out.append((node.module, names))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("loglake")]
    return out


def test_every_module_has_a_layer():
    modules = {p.stem for p in PKG.glob("*.py")}
    assert modules == VOCABULARY | CORES | ADAPTERS


def test_vocabulary_and_cores_import_no_adapter_and_no_io():
    for name in VOCABULARY | CORES:
        allowed_inside = VOCABULARY if name in VOCABULARY else VOCABULARY | CORES
        for module, names in _imports(name):
            if module.startswith("loglake.events."):
                assert module.split(".")[2] in allowed_inside, f"{name} imports {module}"
            else:
                assert module in PURE_OUTSIDE, f"{name} imports {module}"
                allowed = PURE_OUTSIDE[module]
                assert allowed is None or set(names) <= allowed, f"{name}: {module} {names}"


def test_only_the_store_calls_streams_and_only_the_cli_opens_a_log():
    for p in PKG.glob("*.py"):
        for module, names in _imports(p.stem):
            assert not module.startswith(SIBLINGS), f"{p.stem} imports {module}"
            if module == "loglake.streams.api" and p.stem not in ("store", "cli"):
                assert set(names) <= {"StreamMessage", "check_stream_name"}, (p.stem, names)
            if module.startswith("loglake.log"):  # the embedded default, behind LocalStreams
                assert (p.stem, module, names) == ("cli", "loglake.log", ["open_log"])
