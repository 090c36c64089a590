// ICRC-77 replays: state, progress, cancel; and the ICRC-72 namespaces they replay from.

import { useState } from "preact/hooks";

import { Badge, DataTable, PartSection, Progress, act, cell, html, usePoll } from "../ui.js";

const FINAL = new Set(["completed", "canceled", "errored"]);

function stateBadge(state) {
  const kind = { running: "run", pending: "", completed: "ok", canceled: "warn", errored: "bad" }[state];
  return html`<${Badge} kind=${kind}>${state}<//>`;
}

export function ReplaysPage() {
  const replays = usePoll("/replays", 1000);
  const namespaces = usePoll("/namespaces", 3000);
  const [message, setMessage] = useState(null);
  const cancel = async (r) => {
    const { error } = await act(`/replays/${encodeURIComponent(r.replay_id)}/cancel`, { method: "POST" });
    setMessage(error ? { bad: true, text: `cancel ${r.replay_id}: ${error.message}` } : { text: `cancel of replay ${r.replay_id} requested` });
  };
  const columns = [
    ["replay_id", "replay"],
    ["namespace", "namespace"],
    ["subscriber", "subscriber"],
    ["range", "range", (r) => `${cell(r.start)} … ${r.end === null || r.end === undefined ? "head" : cell(r.end)}`],
    ["state", "state", (r) => html`${stateBadge(r.state)}${r.error ? html` <span class="bad">${r.error}</span>` : null}`],
    ["progress", "progress", (r) => html`<${Progress} value=${r.delivered || 0} max=${r.total || 0} />
      <span class="muted"> ${cell(r.delivered)} / ${cell(r.total)}</span>`],
    ["cancel", "", (r) => FINAL.has(r.state) ? null
      : html`<button class="danger" data-testid="cancel" onClick=${() => cancel(r)}>Cancel</button>`],
  ];
  return html`<section>
    <h1>Replays</h1>
    ${message ? html`<div class=${message.bad ? "error" : "notice"} data-testid="replay-message">${message.text}</div>` : null}
    <${PartSection} state=${replays} what="replays">
      ${(rows) => html`<${DataTable} rows=${rows} columns=${columns} testid="replays-table" rowKey="replay_id" />`}
    <//>
    <h2>Namespaces</h2>
    <${PartSection} state=${namespaces} what="ICRC-72 namespaces">
      ${(rows) => html`<${DataTable} rows=${rows} testid="namespaces-table" />`}
    <//>
  </section>`;
}
