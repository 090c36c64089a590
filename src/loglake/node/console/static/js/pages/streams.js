// Streams: every stream with live push/pull rates, then one stream's partitions and consumer lag.

import { useRef, useState } from "preact/hooks";

import {
  ErrorBox,
  Pager,
  Sparkline,
  act,
  fmtBytes,
  fmtInt,
  fmtRate,
  href,
  html,
  usePaged,
  usePoll,
} from "../ui.js";

const HISTORY = 60;
const STREAM_ROWS = 500; // streams a page shows (by name; a filter and next/previous for the rest)
const CONSUMER_ROWS = 200; // consumers a page shows: the most behind, or a page by client id

/** Streams the parts keep for their own bookkeeping (ICRC system namespaces and journals,
 *  Cardinal checkpoints): hidden from the list unless asked for. */
export function isSystemStream(name) {
  return name.startsWith("icrc72:") || name.startsWith("loglake.") || name.startsWith("cardinal.ckpt.");
}

/** Rates per stream: the node's own (metrics on), or computed here from two readings of the
 *  record count (metrics off), so the page shows a rate either way. */
function useRates(streams, at) {
  const prev = useRef({ at: 0, records: {} });
  const hist = useRef({});
  const last = useRef({ at: 0, rates: {} });
  if (!streams || at === last.current.at) return { rates: last.current.rates, hist: hist.current };
  const rates = {};
  const dt = prev.current.at ? (at - prev.current.at) / 1000 : 0;
  for (const s of streams) {
    let push = s.push_rate;
    if (push === null || push === undefined) {
      const before = prev.current.records[s.name];
      const known = s.records !== null && before !== undefined && before !== null;
      push = dt > 0 && known ? Math.max(0, (s.records - before) / dt) : null;
    }
    rates[s.name] = { push, pull: s.pull_rate ?? null };
    hist.current[s.name] = [...(hist.current[s.name] || []), push || 0].slice(-HISTORY);
  }
  prev.current = { at, records: Object.fromEntries(streams.map((s) => [s.name, s.records])) };
  last.current = { at, rates };
  return { rates, hist: hist.current };
}

export function StreamsPage() {
  const streams = usePaged("/streams", { limit: STREAM_ROWS }, 1000);
  const { data, error, at, total } = streams;
  const { rates, hist } = useRates(data, at);
  const [showSystem, setShowSystem] = useState(false);
  const hidden = data ? data.filter((s) => isSystemStream(s.name)).length : 0;
  const shown = data ? data.filter((s) => showSystem || !isSystemStream(s.name)) : null;
  return html`<section>
    <h1>Streams</h1>
    <${ErrorBox} error=${error} what="streams" />
    ${data && data.length === 0 && !streams.filter && !streams.page
      ? html`<p class="muted">No streams yet.</p>`
      : html`<${Pager} list=${streams} testid="streams" what="stream name" />`}
    ${data && data.length === 0 && streams.filter
      ? html`<p class="muted" data-testid="streams-none">No stream name holds “${streams.filter}”.</p>`
      : null}
    ${data && total !== null && (total > data.length || streams.page > 0)
      ? html`<p class="notice" data-testid="streams-shown">Showing ${data.length
          ? `${fmtInt(streams.page * STREAM_ROWS + 1)}–${fmtInt(streams.page * STREAM_ROWS + data.length)}`
          : "none"} of ${fmtInt(total)} streams${streams.filter ? " matching the filter" : ""} (by name).</p>`
      : null}
    ${hidden
      ? html`<p><label class="toggle"><input type="checkbox" data-testid="show-system" checked=${showSystem}
          onChange=${(e) => setShowSystem(e.target.checked)} /> show ${hidden} system streams
          (ICRC-72 system namespaces, journals, checkpoints)</label></p>`
      : null}
    ${shown && shown.length > 0
      ? html`<table data-testid="streams-table">
          <thead><tr>
            <th>stream</th><th class="num">partitions</th><th class="num">records</th>
            <th class="num">bytes</th><th class="num">push rate</th><th></th>
            <th class="num">pull rate</th><th>durability</th>
          </tr></thead>
          <tbody>
            ${shown.map((s) => {
              const r = rates[s.name] || {};
              return html`<tr data-stream=${s.name}>
                <td class="name"><a href=${href("/streams", { stream: s.name })}>${s.name}</a>${s.error
                  ? html` <span class="error" data-testid="stream-error" title=${s.error}>unreadable</span>`
                  : null}</td>
                <td class="num">${s.partitions}</td>
                <td class="num" data-testid="records">${fmtInt(s.records)}</td>
                <td class="num">${fmtBytes(s.bytes)}</td>
                <td class="num" data-testid="push-rate">${fmtRate(r.push)}</td>
                <td><${Sparkline} values=${hist[s.name]} /></td>
                <td class="num" data-testid="pull-rate">${fmtRate(r.pull)}</td>
                <td>${s.durability}</td>
              </tr>`;
            })}
          </tbody>
        </table>`
      : null}
    <h2>Consumers</h2>
    <${Consumers} path="/consumers" showStream=${true} />
  </section>`;
}

/** A consumer list: the most behind (one page: lags move between two requests, so the node
 *  pages only by client id), or every consumer by client id, a page at a time; a filter on
 *  the client id (and the stream, on the streams page). */
function Consumers({ path, showStream }) {
  const [order, setOrder] = useState("lag");
  const list = usePaged(path, { order, limit: CONSUMER_ROWS }, 2000);
  const paged = order === "client";
  const { data: rows, total } = list;
  return html`<${ErrorBox} error=${list.error} what="consumers" />
    ${rows && (rows.length || list.filter || list.page || order !== "lag")
      ? html`<div class="controls">
          <label>show <select data-testid="consumers-order" value=${order}
            onChange=${(e) => setOrder(e.target.value)}>
            <option value="lag">the ${CONSUMER_ROWS} most behind</option>
            <option value="client">all, by client id</option>
          </select></label>
          <${Pager} list=${list} testid="consumers" what=${showStream ? "client id or stream" : "client id"}
            paged=${paged} />
        </div>`
      : null}
    ${rows && rows.length === 0
      ? html`<p class="muted">${list.filter ? `No consumer matches “${list.filter}”.` : "No saved consumer indexes."}</p>`
      : null}
    ${rows && rows.length && total !== null && (total > rows.length || list.page > 0)
      ? html`<p class="notice" data-testid="consumers-shown">${paged
          ? `Showing ${fmtInt(list.page * CONSUMER_ROWS + 1)}–${fmtInt(list.page * CONSUMER_ROWS + rows.length)} of ${fmtInt(total)} consumers (by client id).`
          : `Showing the ${fmtInt(rows.length)} most behind of ${fmtInt(total)} consumers.`}</p>`
      : null}
    <${ConsumerTable} rows=${rows} showStream=${showStream} />`;
}

function ConsumerTable({ rows, showStream }) {
  const [message, setMessage] = useState(null);
  if (!rows || rows.length === 0) return null;
  return html`
    ${message
      ? html`<div class=${message.bad ? "error" : "notice"} data-testid="consumer-message">${message.text}</div>`
      : null}
    <table data-testid="consumers-table">
    <thead><tr>
      <th>client</th>${showStream ? html`<th>stream</th>` : null}<th class="num">partition</th>
      <th class="num">saved index</th><th class="num">end</th><th class="num">lag</th>
      <th>owner</th><th></th>
    </tr></thead>
    <tbody>
      ${rows.map(
        (c) => html`<tr data-consumer=${c.client_id} key=${c.client_id + "/" + c.stream + "/" + c.partition}>
          <td>${c.client_id}</td>
          ${showStream
            ? html`<td><a href=${href("/streams", { stream: c.stream })}>${c.stream}</a></td>`
            : null}
          <td class="num">${c.partition}</td>
          <td class="num" data-testid="index">${fmtInt(c.index)}</td>
          <td class="num">${fmtInt(c.next_index)}</td>
          <td class="num" data-testid="lag"><span class=${c.lag > 0 ? "warn" : "ok"}>${fmtInt(c.lag)}</span></td>
          <td data-testid="owner">${c.owner || html`<span class="muted">nobody</span>`}</td>
          <td><${ConsumerActions} c=${c} say=${setMessage} /></td>
        </tr>`,
      )}
    </tbody>
  </table>`;
}

/** An operator's reset (to an index, lower or not) or delete of one consumer's index: the way
 *  out for a consumer stuck too high, since saves only move an index up. Two clicks, so a
 *  stray one changes nothing. */
function ConsumerActions({ c, say }) {
  const [mode, setMode] = useState(null);
  const [to, setTo] = useState("0");
  const where = `${c.client_id} on ${c.stream}/${c.partition}`;
  const send = async (what) => {
    const path = `/streams/${encodeURIComponent(c.stream)}/consumers/${what}`;
    const body = { client_id: c.client_id, partition: c.partition };
    if (what === "reset") body.index = Number(to);
    const { data, error } = await act(path, { method: "POST", body });
    setMode(null);
    say(
      error
        ? { bad: true, text: `The ${what} of consumer ${where} failed: ${error.message}` }
        : what === "reset"
          ? { text: `Consumer ${where} reset from ${fmtInt(data.before)} to ${fmtInt(data.index)}.` }
          : { text: `Consumer ${where} deleted (it was at ${fmtInt(data.before)}).` },
    );
  };
  if (mode === "reset")
    return html`<span class="confirm">
      to <input type="number" min="0" value=${to} data-testid="reset-to" size="8"
        onInput=${(e) => setTo(e.target.value)} />
      <button class="danger" data-testid="confirm-reset" onClick=${() => send("reset")}>Reset</button>
      <button data-testid="cancel-action" onClick=${() => setMode(null)}>Cancel</button></span>`;
  if (mode === "delete")
    return html`<span class="confirm">
      <button class="danger" data-testid="confirm-delete" onClick=${() => send("delete")}>Delete ${c.client_id}</button>
      <button data-testid="cancel-action" onClick=${() => setMode(null)}>Cancel</button></span>`;
  return html`<button data-testid="reset" onClick=${() => setMode("reset")}>Reset…</button>
    <button data-testid="delete" onClick=${() => setMode("delete")}>Delete…</button>`;
}

export function StreamPage({ name }) {
  const enc = encodeURIComponent(name);
  const { data, error } = usePoll("/streams/" + enc, 1000, [name]);
  return html`<section>
    <p><a href="#/streams">← all streams</a></p>
    <h1>Stream <code data-testid="stream-name">${name}</code></h1>
    <${ErrorBox} error=${error} what="stream" />
    ${data
      ? html`<dl class="facts">
            <dt>records</dt><dd>${fmtInt(data.records)}</dd>
            <dt>bytes</dt><dd>${fmtBytes(data.bytes)}</dd>
            <dt>push rate</dt><dd>${fmtRate(data.push_rate)}</dd>
            <dt>pull rate</dt><dd>${fmtRate(data.pull_rate)}</dd>
            <dt>durability</dt><dd>${data.config.durability}</dd>
            <dt>segment</dt><dd>${fmtBytes(data.config.segment_bytes)}</dd>
            <dt>retention</dt><dd>${retention(data.config)}</dd>
            <dt>lake</dt><dd>${data.config.seal_to_lake ? "sealed to Parquet" : "off"}</dd>
          </dl>
          <h2>Partitions</h2>
          <table data-testid="partitions-table">
            <thead><tr>
              <th class="num">partition</th><th class="num">first</th><th class="num">next</th>
              <th class="num">durable</th><th class="num">records</th><th class="num">bytes</th>
              <th class="num">fsyncs</th><th>health</th><th></th>
            </tr></thead>
            <tbody>
              ${data.partition_stats.map(
                (p) => html`<tr data-partition=${p.partition}>
                  <td class="num">${p.partition}</td>
                  <td class="num">${fmtInt(p.first_index)}</td>
                  <td class="num">${fmtInt(p.next_index)}</td>
                  <td class="num">${fmtInt(p.durable_next)}</td>
                  <td class="num">${fmtInt(p.records)}</td>
                  <td class="num">${fmtBytes(p.bytes)}</td>
                  <td class="num">${fmtInt(p.fsyncs)}</td>
                  <td>${health(p)}</td>
                  <td><a href=${href("/records", { stream: name, partition: p.partition, start: p.first_index })}
                    data-testid="browse">browse records</a></td>
                </tr>`,
              )}
            </tbody>
          </table>`
      : null}
    <h2>Consumers and lag</h2>
    <${Consumers} key=${name} path=${`/streams/${enc}/consumers`} showStream=${false} />
  </section>`;
}

function retention(c) {
  const parts = [];
  if (c.retention_ms !== null) parts.push(`${(c.retention_ms / 3600000).toFixed(1)} h`);
  if (c.retention_bytes !== null) parts.push(fmtBytes(c.retention_bytes));
  if (c.retention_records !== null) parts.push(`${fmtInt(c.retention_records)} records`);
  return parts.length ? parts.join(", ") : "keep everything";
}

function health(p) {
  const problems = [p.storage_failed, p.seal_failure, p.retention_error].filter(Boolean);
  if (!problems.length) return html`<span class="ok">ok</span>`;
  return html`<span class="bad" title=${problems.join("\n")}>${problems.join("; ")}</span>`;
}
