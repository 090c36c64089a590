// SDS channel health: per participant, unacknowledged messages and missing dependencies.

import { Badge, DataTable, PartSection, fmtInt, href, html, usePoll } from "../ui.js";

function ids(list, max = 4) {
  if (!list.length) return html`<span class="muted">none</span>`;
  const shown = list.slice(0, max).map((id) => html`<code title=${id}>${id.slice(0, 10)}…</code> `);
  return html`${shown}${list.length > max ? html`<span class="muted">+${list.length - max}</span>` : null}`;
}

function Channel({ name }) {
  const { data, error } = usePoll("/sds/channels/" + encodeURIComponent(name), 1000, [name]);
  const cols = [
    ["id", "participant"],
    ["lamport", "lamport", (p) => String(p.lamport)],
    ["next_index", "read up to", (p) => fmtInt(p.next_index)],
    ["sent", "sent", (p) => fmtInt(p.sent)],
    ["delivered", "delivered", (p) => fmtInt(p.delivered)],
    ["acknowledged", "acked", (p) => fmtInt(p.acknowledged)],
    ["repaired", "repaired", (p) => fmtInt(p.repaired)],
    ["lost", "lost", (p) => html`<span class=${p.lost ? "bad" : ""}>${fmtInt(p.lost)}</span>`],
    ["unacknowledged", "unacknowledged", (p) => html`<span data-testid="unacked" data-count=${p.unacknowledged.length}>${ids(p.unacknowledged)}</span>`],
    ["missing", "missing dependencies", (p) => html`<span data-testid="missing" data-count=${p.missing.length}>${ids(p.missing.map((m) => m.message_id))}</span>`],
    ["pending", "buffered", (p) => fmtInt(p.pending)],
  ];
  return html`<div class="card" data-testid="sds-channel" data-channel=${name}>
    <h3>channel ${name} ${data ? html`<span data-testid="health"><${Badge} kind=${data.healthy ? "ok" : "bad"}>${data.healthy ? "healthy" : "degraded"}<//></span>` : null}</h3>
    <${PartSection} state=${{ data, error }} what="channel">
      ${(c) => html`<p class="muted">stream <a href=${href("/records", { stream: c.stream, view: "sds" })}>${c.stream}</a>${" "}
          · ${c.participants.length} participants</p>
        <${DataTable} rows=${c.participant_states} columns=${cols} testid="participants-table" rowKey="id" />`}
    <//>
  </div>`;
}

export function SdsPage() {
  const channels = usePoll("/sds/channels", 3000);
  return html`<section>
    <h1>SDS channels</h1>
    <${PartSection} state=${channels} what="SDS channels">
      ${(rows) => (rows.length
        ? rows.map((c) => html`<${Channel} name=${c.channel} />`)
        : html`<p class="muted">No SDS channels.</p>`)}
    <//>
  </section>`;
}
