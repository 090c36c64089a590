"""``report.html`` of ``loglake job sds-audit``: one self-contained page, plots as inline SVG.

No script, no stylesheet or font from elsewhere: the page opens from a mail attachment. The plots
are drawn here (a few dozen lines of SVG each) rather than with a plotting library: three chart
shapes, deterministic bytes, no dependency. Data comes from the written tables, aggregated by
Spark (histogram bins, time buckets), so the page stays small at any channel size.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

W, H = 760, 260
ML, MR, MT, MB = 60, 150, 20, 40  # margins (right: legend)
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
MAX_SERIES = 8
BINS = 40


def _fmt(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.0f}"
    return f"{x:.2g}"


def _axes(x0: float, x1: float, y1: float, xlabel: str, ylabel: str) -> list[str]:
    pw, ph = W - ML - MR, H - MT - MB
    out = [
        f'<line x1="{ML}" y1="{MT + ph}" x2="{ML + pw}" y2="{MT + ph}" stroke="#333"/>',
        f'<line x1="{ML}" y1="{MT}" x2="{ML}" y2="{MT + ph}" stroke="#333"/>',
        f'<text x="{ML + pw / 2}" y="{H - 6}" text-anchor="middle">{html.escape(xlabel)}</text>',
        f'<text x="14" y="{MT + ph / 2}" text-anchor="middle" '
        f'transform="rotate(-90 14 {MT + ph / 2})">{html.escape(ylabel)}</text>',
    ]
    for k in range(5):
        fx = k / 4
        x = ML + fx * pw
        out.append(
            f'<text x="{x:.1f}" y="{MT + ph + 16}" text-anchor="middle">'
            f"{_fmt(x0 + fx * (x1 - x0))}</text>"
        )
        y = MT + ph - fx * ph
        out.append(f'<line x1="{ML}" y1="{y:.1f}" x2="{ML + pw}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{ML - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(fx * y1)}</text>')
    return out


def _svg(body: list[str], title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11" role="img">'
        f"<title>{html.escape(title)}</title>" + "".join(body) + "</svg>"
    )


def bars_svg(edges: list[float], counts: list[int], xlabel: str, ylabel: str, title: str) -> str:
    """A histogram: ``len(edges) == len(counts) + 1``."""
    if not counts:
        return "<p><em>no data</em></p>"
    pw, ph = W - ML - MR, H - MT - MB
    top = max(counts) or 1
    body = _axes(edges[0], edges[-1], top, xlabel, ylabel)
    span = (edges[-1] - edges[0]) or 1
    for k, c in enumerate(counts):
        x = ML + (edges[k] - edges[0]) / span * pw
        w = max(1.0, (edges[k + 1] - edges[k]) / span * pw - 1)
        h = c / top * ph
        body.append(
            f'<rect x="{x:.1f}" y="{MT + ph - h:.1f}" width="{w:.1f}" height="{h:.1f}" '
            f'fill="{PALETTE[0]}"><title>{_fmt(edges[k])}–{_fmt(edges[k + 1])}: {c}</title></rect>'
        )
    return _svg(body, title)


def lines_svg(
    xs: list[float],
    series: dict[str, list[float]],
    xlabel: str,
    ylabel: str,
    title: str,
    step: bool = False,
) -> str:
    if not xs or not series:
        return "<p><em>no data</em></p>"
    pw, ph = W - ML - MR, H - MT - MB
    top = max((max(v) for v in series.values() if v), default=1) or 1
    x0, x1 = xs[0], xs[-1] if xs[-1] > xs[0] else xs[0] + 1
    body = _axes(x0, x1, top, xlabel, ylabel)
    for n, (name, ys) in enumerate(series.items()):
        color = PALETTE[n % len(PALETTE)]
        pts: list[str] = []
        for x, y in zip(xs, ys, strict=True):
            px = ML + (x - x0) / (x1 - x0) * pw
            py = MT + ph - y / top * ph
            if step and pts:
                pts.append(f"{px:.1f},{pts[-1].split(',')[1]}")
            pts.append(f"{px:.1f},{py:.1f}")
        body.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{" ".join(pts)}">'
            f"<title>{html.escape(name)}</title></polyline>"
        )
        ly = MT + 12 + n * 15
        body.append(
            f'<rect x="{W - MR + 10}" y="{ly - 8}" width="10" height="10" fill="{color}"/>'
            f'<text x="{W - MR + 25}" y="{ly + 1}">{html.escape(name[:18])}</text>'
        )
    return _svg(body, title)


def _table(rows: list[list[Any]], head: list[str]) -> str:
    def cell(v: Any) -> str:
        if v is None:
            return "–"
        if isinstance(v, float):
            return "NaN" if math.isnan(v) else f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
        if isinstance(v, int):
            return f"{v:,}"
        return html.escape(str(v))

    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    for r in rows:
        out.append("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in r) + "</tr>")
    return "".join(out) + "</table>"


CSS = """
body{font-family:sans-serif;margin:24px;color:#222;max-width:980px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ddd;padding:3px 7px;
text-align:right}th{background:#f4f4f4}td:first-child{text-align:left}
.kpi{display:inline-block;margin:6px 18px 6px 0}.kpi b{display:block;font-size:20px}
.note{color:#666;font-size:12px}
"""


def build_html(data: dict[str, Any]) -> str:
    """The page from aggregated data (kept apart from Spark so it is testable alone)."""
    s = data["summary"]
    kpis = [
        ("records", s["records"]),
        ("content messages", s["content_messages"]),
        ("sync messages", s["sync_messages"]),
        ("participants", s["participants"]),
        ("acknowledgements", s["acks"]),
        ("repair requests", s["repair_requests"]),
        ("never delivered", s["never_delivered"]),
        ("rejects", s["rejects"]),
    ]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>SDS audit: {html.escape(s['channel'])}</title><style>{CSS}</style></head><body>",
        f"<h1>SDS audit of channel <code>{html.escape(s['channel'])}</code> "
        f"(stream <code>{html.escape(s['stream'])}</code>)</h1>",
        "".join(f"<span class='kpi'><b>{v:,}</b>{html.escape(k)}</span>" for k, v in kpis),
        "<h2>How long until others showed they had a message</h2>",
        "<p class='note'>Time from a message's first appearance on the channel to a "
        "participant's first later message that lists it in its causal history or bloom filter "
        "(one count per participant and message).</p>",
        data["latency_svg"],
        "<h2>Messages over time, per sender</h2>",
        data["timeline_svg"],
        "<h2>Missing dependencies over time</h2>",
        "<p class='note'>Per time bucket: causal-history references to messages not yet on the "
        "channel, references to messages never on it, and repair requests.</p>",
        data["missing_svg"],
        "<h2>Participants</h2>",
        _table(
            data["participants"],
            [
                "participant",
                "sent",
                "syncs",
                "delivery ratio",
                "ack p50 ms",
                "ack p90 ms",
                "ack p99 ms",
                "unresolved deps",
            ],
        ),
    ]
    if data["participants_more"]:
        parts.append(f"<p class='note'>… and {data['participants_more']:,} more.</p>")
    parts.append("<h2>Rejected records</h2>")
    if s["rejects"]:
        parts.append(
            _table([[k, v] for k, v in s["reject_reasons"].items()], ["reason", "records"])
        )
        parts.append(_table(data["rejects"], ["partition", "index", "reason", "detail"]))
    else:
        parts.append("<p>None: every record decoded.</p>")
    parts.append(
        f"<p class='note'>Tables (Parquet) beside this file: messages, acks, participants, "
        f"repairs, rejects. Audit took {s['seconds']:.1f} s.</p></body></html>"
    )
    return "\n".join(parts)


def gather(spark: SparkSession, out: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """The page's data from the written tables, read with pyarrow on the driver (which wrote
    them or sees them: the audit needs a shared filesystem). Why not Spark: each aggregate was
    a Spark job, ten for a page of a few kilobytes. The one Spark job left is the latency
    quantile, kept Spark's own (``approxQuantile``) so the histogram's range is the same."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    # latency histogram, range clipped at p99 (the tail goes into the last bin)
    lat_svg = "<p><em>no acknowledgements</em></p>"
    # the summary's counts spare a job where they already give the answer (no acks, no rejects)
    q = (
        spark.read.parquet(str(out / "acks")).approxQuantile("latency_ms", [0.99], 0.001)
        if summary["acks"]
        else []
    )
    if q:
        lat = pq.read_table(out / "acks", columns=["latency_ms"]).column(0)
        lat_np = np.asarray(lat.drop_null().to_numpy(), dtype=np.float64)
        lo = float(lat_np.min())
        hi = max(q[0], lo + 1e-9)
        width = (hi - lo) / BINS
        b = np.minimum(np.floor((lat_np - lo) / width), BINS - 1).astype(np.int64)
        counts = np.bincount(b, minlength=BINS).tolist()
        edges = [lo + k * width for k in range(BINS + 1)]
        lat_svg = bars_svg(
            edges, counts, "ms to acknowledgement (last bin: ≥ p99)", "acks", "ack latency"
        )

    # messages per sender per time bucket
    timeline_svg = missing_svg = "<p><em>no messages</em></p>"
    cols = [
        "first_timestamp_ns",
        "kind",
        "sender",
        "deps_seen_later",
        "never_delivered_deps",
        "repair_request",
    ]
    messages = pq.read_table(out / "messages", columns=cols)
    ts = messages.column("first_timestamp_ns")
    if messages.num_rows and ts.null_count < messages.num_rows:
        t0, t1 = pc.min(ts).as_py(), pc.max(ts).as_py()
        width_ns = max(1, (t1 - t0) // BINS + 1)
        ts_np = ts.to_numpy(zero_copy_only=False)
        bucket = np.floor((ts_np - t0) / width_ns).astype(np.int64)
        xs = [(k * width_ns) / 1e9 for k in range(BINS)]
        is_content = np.asarray(
            pc.equal(messages.column("kind"), "content").to_numpy(zero_copy_only=False), bool
        )
        senders = messages.column("sender").filter(pa.array(is_content))
        per = pc.value_counts(senders).to_pylist()
        top = [
            r["values"]
            for r in sorted(
                per, key=lambda r: (-r["counts"], r["values"] is not None, r["values"] or "")
            )
        ]
        shown = top[:MAX_SERIES]
        series: dict[str, list[float]] = {n: [0.0] * BINS for n in shown}
        if len(top) > MAX_SERIES:
            series["others"] = [0.0] * BINS
        in_shown = set(shown)
        for sender, k in zip(senders.to_pylist(), bucket[is_content].tolist(), strict=True):
            series[sender if sender in in_shown else "others"][k] += 1.0
        timeline_svg = lines_svg(
            xs, series, "seconds since the first message", "content messages", "messages", True
        )
        later = messages.column("deps_seen_later").to_numpy(zero_copy_only=False)
        never = pc.list_value_length(messages.column("never_delivered_deps")).fill_null(0)
        req = pc.list_value_length(messages.column("repair_request")).fill_null(0)
        ms: dict[str, list[float]] = {
            "not yet seen": np.bincount(bucket, later, BINS).tolist(),
            "never seen": np.bincount(bucket, never.to_numpy(zero_copy_only=False), BINS).tolist(),
            "repair requests": np.bincount(
                bucket, req.to_numpy(zero_copy_only=False), BINS
            ).tolist(),
        }
        missing_svg = lines_svg(
            xs, ms, "seconds since the first message", "references", "missing dependencies", True
        )

    n_parts = int(summary["participants"])
    parts = pq.read_table(out / "participants").to_pylist()
    parts.sort(
        key=lambda r: (r["delivery_ratio"] is None, r["delivery_ratio"] or 0.0, r["participant"])
    )
    prow = parts[:200]
    rejects: list[dict[str, Any]] = []
    if summary["rejects"]:
        rejects = pq.read_table(out / "rejects").sort_by("index").slice(0, 50).to_pylist()
    return {
        "summary": summary,
        "latency_svg": lat_svg,
        "timeline_svg": timeline_svg,
        "missing_svg": missing_svg,
        "participants": [
            [
                r["participant"],
                r["messages_sent"],
                r["syncs_sent"],
                r["delivery_ratio"],
                r["ack_p50_ms"],
                r["ack_p90_ms"],
                r["ack_p99_ms"],
                r["unresolved"],
            ]
            for r in prow
        ],
        "participants_more": max(0, n_parts - len(prow)),
        "rejects": [[r["partition"], r["index"], r["reason"], r["detail"]] for r in rejects],
    }


def write_report(spark: SparkSession, out: Path, summary: Any) -> Path:
    page = build_html(gather(spark, out, summary.as_dict()))
    path = out / "report.html"
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)
    return path
