"""The import graph of docs/architecture.md, enforced: no part imports a sibling it may not.

Every ``import`` in ``src/loglake`` is read with ``ast`` (function-level imports included: a
lazy import is still a dependency) and mapped to the part it names. A new edge either fits the
table below, or the table and docs/architecture.md change together.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "loglake"

COMMON = {"errors", "structured_logging", "clitools", "faces"}
"""Top-level modules every part may use (typed errors, structured logging, CLI helpers)."""

PARTS = {"wire", "log", "streams", "events", "cardinal", "archives", "sds", "pipeline", "node"}
EVERYTHING = PARTS | COMMON

MAY_USE: dict[str, set[str]] = {
    "wire": set(),
    "log": {"wire"},
    "streams": {"log", "wire"},
    "events": {"streams", "wire"},  # storage only through Streams (issue 18); see below
    "cardinal": {"log", "streams", "wire"},
    "archives": {"log", "streams", "wire"},
    "sds": {"log", "streams", "wire"},
    "pipeline": EVERYTHING,
    "node": EVERYTHING,
    "cli": EVERYTHING,
    "sparkdaemon": EVERYTHING,
}
"""Which parts each part may import, beyond ``COMMON`` (docs/architecture.md)."""

ALLOWED_FOR_NOW: set[tuple[str, str]] = set()
"""Edges that break ``MAY_USE`` and are being removed; empty since events moved onto the
``Streams`` API (issue 18). The test fails when an edge listed here is no longer used, so this
set only shrinks."""

LOG_CONTRACT = {"loglake.log", "loglake.log.api", "loglake.log.fs"}
"""What a protocol part may import from ``log``: its public face, the contract the ``Streams``
API speaks (entries, stream configs, its errors) and the file layer — never the engine's
modules (segments, partitions, the lake)."""
PROTOCOL_PARTS = {"events", "cardinal", "archives", "sds"}


def _part_of(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> list[tuple[str, int]]:
    """(module imported, line) for every absolute ``loglake.…`` import in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "loglake":  # ``from loglake import x``: x may be a part
                out += [(f"loglake.{a.name}", node.lineno) for a in node.names]
            else:
                out.append((node.module, node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}:{node.lineno}: relative import (loglake uses absolute)")
    return [(m, line) for m, line in out if m.startswith("loglake.")]


def _edges() -> dict[tuple[str, str], list[str]]:
    """(importer part, imported part) → where (``file:line module``)."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        part = _part_of(path)
        for module, line in _imports(path):
            target = module.split(".")[1]
            if target != part and target in EVERYTHING:
                where = f"{path.relative_to(SRC.parent)}:{line} {module}"
                edges.setdefault((part, target), []).append(where)
    return edges


def test_every_module_belongs_to_a_known_part() -> None:
    known = PARTS | COMMON | {"cli", "sparkdaemon", "__init__"}
    unknown = {_part_of(p) for p in SRC.rglob("*.py")} - known
    assert not unknown, f"new parts {unknown}: add them to MAY_USE and docs/architecture.md"


def test_no_part_imports_a_sibling_it_may_not() -> None:
    bad = {
        edge: where
        for edge, where in _edges().items()
        if edge[1] not in COMMON | MAY_USE.get(edge[0], set()) and edge not in ALLOWED_FOR_NOW
    }
    assert not bad, "imports docs/architecture.md does not allow:\n" + "\n".join(
        f"  {a} -> {b}: {', '.join(w)}" for (a, b), w in sorted(bad.items())
    )


def test_common_modules_import_no_part() -> None:
    bad = {e: w for e, w in _edges().items() if e[0] in COMMON and e[1] not in COMMON}
    assert not bad, bad


def test_allowed_for_now_lists_only_edges_still_in_use() -> None:
    gone = ALLOWED_FOR_NOW - set(_edges())
    assert not gone, f"no longer imported, remove from ALLOWED_FOR_NOW: {sorted(gone)}"


def test_protocol_parts_use_only_the_logs_contract() -> None:
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        if _part_of(path) in PROTOCOL_PARTS:
            for module, line in _imports(path):
                if module.split(".")[1] == "log" and module not in LOG_CONTRACT:
                    bad.append(f"{path.relative_to(SRC.parent)}:{line} {module}")
    assert not bad, "storage engine internals used by a protocol part:\n" + "\n".join(bad)


PIPELINE_CONTRACT = LOG_CONTRACT | {
    "loglake.log.lake",
    "loglake.log.lake_schema",
    "loglake.streams.jetstream_seal",
}
"""What ``pipeline`` may import from a part besides the part's face (``loglake.<part>``, names in
its ``__all__``): the log's contract; the lake's layout and file reader, which are the pipeline's
input (sealed history *is* the lake table the jobs read and compact); and the ``job seal`` command,
which lives beside the JetStream code it drives and is only mounted by the job group. The
JetStream log, whose unsealed history the ``loglake`` source reads (``backend=nats://…``), is on
the streams face, imported on first use (``import loglake.streams`` loads no nats-py)."""


def _face_names(module: str) -> set[str]:
    import importlib

    return set(getattr(importlib.import_module(module), "__all__", ()))


def _pipeline_imports_beyond_faces(src: str, where: str) -> list[str]:
    """Every import in ``src`` (a pipeline module) that reaches past another part's face."""
    bad = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            found = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found = [(node.module, [a.name for a in node.names])]
        else:
            continue
        for module, names in found:
            parts = module.split(".")
            if parts[0] != "loglake" or len(parts) < 2 or parts[1] not in PARTS - {"pipeline"}:
                continue
            if module in PIPELINE_CONTRACT:
                continue
            if len(parts) == 2 and names is not None:
                face = _face_names(module)
                off = [n for n in names if n not in face]
                if not off:
                    continue
                bad.append(f"{where}:{node.lineno} {module} {off} (not in its __all__)")
            else:
                bad.append(f"{where}:{node.lineno} {module}")
    return bad


def test_pipeline_uses_other_parts_only_through_their_faces() -> None:
    bad = []
    for path in sorted((SRC / "pipeline").rglob("*.py")):
        bad += _pipeline_imports_beyond_faces(path.read_text(), str(path.relative_to(SRC.parent)))
    assert not bad, (
        "pipeline reaches into a part's private modules; import the part's face, or add the name "
        "to the face if users need it:\n" + "\n".join(bad)
    )


def test_the_face_rule_catches_a_private_import() -> None:
    """The rule above can fail: a private module, a name off the face and a submodule are caught."""
    src = (
        "from loglake.archives.columnar import decode_waku_batch\n"
        "from loglake.events import Role\n"
        "import loglake.sds.bloom\n"
        "from loglake.archives import decode_waku_batch\n"
        "from loglake.log.api import Entry\n"
    )
    bad = _pipeline_imports_beyond_faces(src, "x.py")
    assert [b.split()[0] for b in bad] == ["x.py:1", "x.py:2", "x.py:3"], bad


def test_every_face_name_resolves() -> None:
    """A face is lazy (each name imported on first use); a name whose module moved would only
    fail when someone used it, so every name is looked up here."""
    import importlib

    for part in sorted(PARTS):
        face = importlib.import_module(f"loglake.{part}")
        missing = [n for n in getattr(face, "__all__", ()) if not hasattr(face, n)]
        assert not missing, f"loglake.{part}.__all__ names what it does not have: {missing}"


def test_the_streams_face_loads_no_nats_until_the_jetstream_log_is_used() -> None:
    """The JetStream backend is on the streams face for the pipeline and users, but a client of
    the stream service must not pay for nats-py: the face imports it on first use."""
    code = (
        "import sys, loglake.streams as s; assert 'nats' not in sys.modules; "
        "s.JetStreamLog; assert 'nats' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
