// Record browser: a range of one partition as text, hex, or decoded by the node for the four
// protocol formats loglake stores (WakuMessage, SDS, Cardinal, ICRC-72 events).

import { useEffect, useState } from "preact/hooks";

import { fromBase64 } from "../api.js";
import { ErrorBox, StreamSelect, act, fmtInt, fmtTime, href, html, usePaged, usePoll } from "../ui.js";

export const VIEWS = [
  ["text", "text"],
  ["hex", "hex"],
  ["waku", "WakuMessage (14/WAKU2)"],
  ["waku-status-go", "WakuMessage (status-go)"],
  ["sds", "SDS message"],
  ["cardinal", "Cardinal message"],
  ["icrc", "ICRC-72 event"],
];
const SHORT_HEX = 80; // hex digits shown before a long value folds
const DECODED = new Set(["waku", "waku-status-go", "sds", "cardinal", "icrc"]);

function go(params) {
  window.location.hash = href("/records", params);
}

export function RecordsPage({ params }) {
  const streams = usePaged("/streams", { limit: 500 }, 0);
  const stream = params.stream || (streams.data && streams.data[0] && streams.data[0].name) || "";
  // the stream's own info (its partitions): it may be none of the streams the dropdown lists
  const chosen = usePoll(stream ? "/streams/" + encodeURIComponent(stream) : null, 0);
  const partition = Number(params.partition || 0);
  const start = Number(params.start || 0);
  const limit = Number(params.limit || 50);
  const view = params.view || "text";
  const state = { stream, partition, start, limit, view };
  const set = (change) => go({ ...state, ...change });

  const [range, setRange] = useState({ data: null, error: null, decoded: null, loading: false });
  useEffect(() => {
    if (!stream) return undefined;
    let alive = true;
    setRange((r) => ({ ...r, loading: true }));
    (async () => {
      const path =
        `/streams/${encodeURIComponent(stream)}/partitions/${partition}/records` +
        `?start=${start}&limit=${limit}`;
      const got = await act(path);
      let decoded = null;
      let error = got.error;
      if (!error && DECODED.has(view) && got.data.records.length) {
        const dec = await act("/console/decode", {
          method: "POST",
          body: { format: view, records: got.data.records.map((r) => r.data) },
        });
        error = dec.error;
        decoded = dec.data && dec.data.records;
      }
      if (alive) setRange({ data: got.data, error, decoded, loading: false });
    })();
    return () => {
      alive = false;
    };
  }, [stream, partition, start, limit, view]);

  const info = chosen.data && chosen.data.name === stream ? chosen.data : null;
  const nparts = info ? info.partitions : partition + 1;
  const d = range.data;
  return html`<section>
    <h1>Records</h1>
    <${ErrorBox} error=${streams.error} what="streams" />
    <form class="controls" data-testid="records-form" onSubmit=${(e) => e.preventDefault()}>
      <${StreamSelect} value=${stream} streams=${streams}
        onChange=${(name) => set({ stream: name, partition: 0, start: 0 })} />
      <label>partition
        <select name="partition" value=${partition} onChange=${(e) => set({ partition: e.target.value, start: 0 })}>
          ${Array.from({ length: nparts }, (_, i) => html`<option value=${i}>${i}</option>`)}
        </select>
      </label>
      <label>from index
        <input name="start" type="number" min="0" value=${start}
          onChange=${(e) => set({ start: Math.max(0, Number(e.target.value) || 0) })} />
      </label>
      <label>count
        <input name="limit" type="number" min="1" max="1000" value=${limit}
          onChange=${(e) => set({ limit: Math.min(1000, Math.max(1, Number(e.target.value) || 50)) })} />
      </label>
      <label>show as
        <select name="view" value=${view} onChange=${(e) => set({ view: e.target.value })}>
          ${VIEWS.map(([v, label]) => html`<option value=${v}>${label}</option>`)}
        </select>
      </label>
    </form>
    ${!stream && streams.data && !streams.filter ? html`<p class="muted">No streams yet.</p>` : null}
    <${ErrorBox} error=${range.error} what="records" />
    ${d
      ? html`<p class="muted" data-testid="range-info">
            partition ${d.partition} holds ${fmtInt(d.first_index)}…${fmtInt(d.next_index - 1)};
            showing ${d.records.length ? `${fmtInt(d.records[0].index)}…${fmtInt(d.records[d.records.length - 1].index)}` : "nothing"}
            ${d.truncated ? " (cut at 4 MiB)" : ""} ${range.loading ? " · loading…" : ""}
          </p>
          <div class="pager">
            <button type="button" data-testid="prev" disabled=${start <= d.first_index}
              onClick=${() => set({ start: Math.max(d.first_index, start - limit) })}>← previous</button>
            <button type="button" data-testid="next" disabled=${d.next >= d.next_index}
              onClick=${() => set({ start: d.next })}>next →</button>
          </div>
          <table class="records" data-testid="records-table">
            <thead><tr><th class="num">index</th><th>time</th><th class="num">size</th><th>${viewName(view)}</th></tr></thead>
            <tbody>
              ${d.records.map(
                (r, i) => html`<tr data-index=${r.index}>
                  <td class="num">${r.index}</td>
                  <td class="nowrap">${fmtTime(r.timestamp_ns)}</td>
                  <td class="num">${fmtInt(r.size)}</td>
                  <td class="content">${content(view, r, range.decoded && range.decoded[i])}</td>
                </tr>`,
              )}
            </tbody>
          </table>`
      : null}
  </section>`;
}

function viewName(view) {
  return (VIEWS.find(([v]) => v === view) || [view, view])[1];
}

function content(view, record, decoded) {
  const bytes = fromBase64(record.data);
  if (view === "hex") return html`<pre class="hex">${hexdump(bytes)}</pre>`;
  if (view === "text") return html`<pre class="text">${asText(bytes)}</pre>`;
  if (!decoded) return html`<span class="muted">…</span>`;
  if (decoded.skipped) return html`<span class="muted" data-testid="decode-skipped">${decoded.error}</span>`;
  if (!decoded.ok) return html`<span class="bad" data-testid="decode-error">not a ${viewName(view)}: ${decoded.error}</span>`;
  return html`<div class="decoded" data-testid="decoded">
    <div class="dtype">${decoded.type}</div>
    <${Fields} value=${decoded.fields} />
  </div>`;
}

/** UTF-8 where the bytes are, `·` for control bytes and `�` for invalid sequences. */
function asText(bytes) {
  const text = new TextDecoder("utf-8", { fatal: false }).decode(bytes);
  return text.replace(/[\u0000-\u0008\u000b-\u001f\u007f]/g, "·");
}

function hexdump(bytes, max = 4096) {
  const lines = [];
  const n = Math.min(bytes.length, max);
  for (let off = 0; off < n; off += 16) {
    const row = bytes.subarray(off, Math.min(off + 16, n));
    const hex = Array.from(row, (b) => b.toString(16).padStart(2, "0")).join(" ");
    const ascii = Array.from(row, (b) => (b >= 32 && b < 127 ? String.fromCharCode(b) : ".")).join("");
    lines.push(off.toString(16).padStart(6, "0") + "  " + hex.padEnd(48) + "  " + ascii);
  }
  if (bytes.length > max) lines.push(`… ${bytes.length - max} more bytes`);
  return lines.join("\n");
}

function isBytes(v) {
  return v && typeof v === "object" && !Array.isArray(v) && "hex" in v && "len" in v;
}

/** What the node puts in place of the items of a list (or dict) past its budget. */
function isCut(v) {
  if (!v || typeof v !== "object" || Array.isArray(v)) return false;
  const keys = Object.keys(v);
  return keys.length === 1 && keys[0] === "truncated" && typeof v.truncated === "number";
}

/** Decoded fields as nested key/value rows; bytes show their text, else hex. */
export function Fields({ value }) {
  if (value === null || value === undefined) return html`<span class="muted">null</span>`;
  if (isCut(value))
    return html`<span class="muted" data-testid="truncated">… ${fmtInt(value.truncated)} more not shown</span>`;
  if (isBytes(value)) {
    if (value.text !== undefined)
      return html`<span class="str" title=${value.hex}>"${value.text}${value.text_truncated ? "…" : ""}"</span>${value.text_truncated
        ? html`<span class="muted"> (${fmtInt(value.len)} B)</span>`
        : null}`;
    const size = html`<span class="muted"> (${fmtInt(value.len)} B)</span>`;
    if (value.hex.length <= SHORT_HEX) return html`<code class="hexval">${value.hex}</code>${size}`;
    return html`<details class="hexval"><summary><code>${value.hex.slice(0, SHORT_HEX)}…</code>${size}</summary>
      <code>${value.hex}${value.truncated ? "…" : ""}</code></details>`;
  }
  if (Array.isArray(value)) {
    if (!value.length) return html`<span class="muted">[]</span>`;
    return html`<ol class="arr">${value.map((v) => html`<li><${Fields} value=${v} /></li>`)}</ol>`;
  }
  if (typeof value === "object") {
    const keys = Object.keys(value);
    if (!keys.length) return html`<span class="muted">{}</span>`;
    return html`<dl class="fields">
      ${keys.map((k) =>
        k === "…" && isCut(value[k])
          ? html`<dt></dt><dd><${Fields} value=${value[k]} /></dd>`
          : html`<dt>${k}</dt><dd data-field=${k}><${Fields} value=${value[k]} /></dd>`,
      )}
    </dl>`;
  }
  return html`<span class=${typeof value}>${String(value)}</span>`;
}
