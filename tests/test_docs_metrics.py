"""docs/operations.md names every Prometheus series a node exports, and no series it does not.

An operator builds dashboards and alerts from that page, so a series added in the code and left
out of the page is invisible to them, and a series named on the page and gone from the code is an
alert that never fires. The series are read from the code's metric constructors (every family
and histogram the node registers), with the ``_total`` suffix the Prometheus text format adds
to a counter's name.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSTRUCTOR = re.compile(
    r"\b(CounterMetricFamily|GaugeMetricFamily|Histogram)\(\s*\"(loglake_[a-z_]+)\"", re.S
)


def exported_series() -> set[str]:
    names = set()
    for path in (ROOT / "src" / "loglake").rglob("*.py"):
        for kind, name in CONSTRUCTOR.findall(path.read_text()):
            names.add(name + "_total" if kind == "CounterMetricFamily" else name)
    return names


def documented_series() -> set[str]:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`(loglake_[a-z_]+)`", section))


def test_the_code_registers_series_at_all() -> None:
    assert {"loglake_push_records_total", "loglake_push_latency_seconds"} <= exported_series()


def test_operations_page_names_every_exported_series_and_no_other() -> None:
    exported, documented = exported_series(), documented_series()
    assert sorted(exported - documented) == [], "exported but not on docs/operations.md"
    assert sorted(documented - exported) == [], "on docs/operations.md but not exported"
