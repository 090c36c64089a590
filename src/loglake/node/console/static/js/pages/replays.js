// ICRC-77 replays (state, progress, cancel) and the ICRC-72 namespaces they replay from.

import { useState } from "preact/hooks";

import {
  Badge,
  DataTable,
  PartSection,
  Progress,
  act,
  fmtInt,
  fmtTime,
  html,
  usePoll,
} from "../ui.js";

const FINAL = new Set(["completed", "canceled", "errored"]);
const KIND = { running: "run", pending: "", completed: "ok", canceled: "warn", errored: "bad" };

function short(principal) {
  return principal && principal.length > 14 ? principal.slice(0, 11) + "…" : principal;
}

export function ReplaysPage() {
  const replays = usePoll("/events/replays", 1000);
  const namespaces = usePoll("/events/namespaces", 2000);
  const [message, setMessage] = useState(null);

  const cancel = async (r) => {
    const { error } = await act(`/events/replays/${r.id}/cancel`, { method: "POST" });
    setMessage(
      error
        ? { bad: true, text: `Cancel of replay ${r.id} failed: ${error.message}` }
        : { text: `Cancel of replay ${r.id} sent to the orchestrator.` },
    );
  };

  const columns = [
    ["id", "replay"],
    ["namespace", "namespace"],
    ["range", "range", (r) => `${fmtInt(r.start)} … ${r.end === null ? "head" : fmtInt(r.end - 1)}`],
    ["subscriber", "subscriber", (r) => html`<code title=${r.subscriber}>${short(r.subscriber)}</code>`],
    ["status", "state", (r) => html`<span data-testid="replay-status"><${Badge} kind=${KIND[r.status]}>${r.status}<//></span>
      ${r.status_value ? html` <span class=${r.status === "errored" ? "bad" : "muted"}>${r.status_value}</span>` : null}
      ${r.cancel_requested && !FINAL.has(r.status) ? html` <span class="muted">cancelling…</span>` : null}`],
    ["progress", "progress", (r) => (r.expected > 0 || r.sent === 0
      ? html`<span data-testid="replay-progress"><${Progress} value=${r.sent} max=${r.expected} /></span>
          <span class="muted"> ${fmtInt(r.sent)} / ${fmtInt(r.expected)}</span>`
      // events the orchestrator did not count (they reached the stream another way): no total
      : html`<span data-testid="replay-progress">${fmtInt(r.sent)} sent</span>`)],
    ["cost", "cost", (r) => fmtInt(r.cost)],
    ["created_ns", "created", (r) => fmtTime(r.created_ns)],
    ["cancel", "", (r) => (FINAL.has(r.status) || r.cancel_requested
      ? null
      : html`<button class="danger" data-testid="cancel" onClick=${() => cancel(r)}>Cancel</button>`)],
  ];
  const nsColumns = [
    ["namespace", "namespace"],
    ["head", "events", (n) => fmtInt(n.head)],
    ["replay", "replay", (n) => (n.replay ? "on" : "off")],
    ["subscriptions", "subscriptions"],
    ["publisher", "publisher", (n) => html`<code title=${n.publisher}>${short(n.publisher)}</code>`],
    ["broadcaster", "broadcaster", (n) => html`<code title=${n.broadcaster}>${short(n.broadcaster)}</code>`],
    ["browse", "", (n) => html`<a href=${"#/records?stream=" + encodeURIComponent(n.namespace) + "&view=icrc"}>browse events</a>`],
  ];
  return html`<section>
    <h1>Replays</h1>
    ${message
      ? html`<div class=${message.bad ? "error" : "notice"} data-testid="replay-message">${message.text}</div>`
      : null}
    <${PartSection} state=${replays} what="ICRC-77 replays">
      ${(rows) => html`<${DataTable} rows=${[...rows].reverse()} columns=${columns} testid="replays-table" rowKey="id" />`}
    <//>
    <h2>Namespaces</h2>
    <${PartSection} state=${namespaces} what="ICRC-72 namespaces">
      ${(rows) => html`<${DataTable} rows=${rows} columns=${nsColumns} testid="namespaces-table" rowKey="namespace" />`}
    <//>
  </section>`;
}
