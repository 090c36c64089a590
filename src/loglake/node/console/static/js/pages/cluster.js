// The cluster a node runs on (GET /api/cluster): who holds each lease, the JetStream meta group,
// every stream group's leader and replicas, and how far the sealer is behind.

import { Badge, DataTable, PartSection, fmtInt, fmtTime, html, usePoll } from "../ui.js";

function peerBadge(p) {
  if (p.leader) return html`<${Badge} kind="ok">leader<//>`;
  if (p.offline) return html`<${Badge} kind="bad">offline<//>`;
  if (!p.current) return html`<${Badge} kind="bad">behind ${fmtInt(p.lag)}<//>`;
  return html`<${Badge}>current<//>`;
}

function Peers({ peers }) {
  return html`${peers.map(
    (p) => html`<span class="peer" data-testid="peer" data-server=${p.name}
      data-state=${p.leader ? "leader" : p.offline ? "offline" : p.current ? "current" : "behind"}>
      <code>${p.name}</code> ${peerBadge(p)}${" "}</span>`,
  )}`;
}

function Leases({ c }) {
  const cols = [
    ["name", "lease"],
    ["holder", "held by", (l) => (l.holder
      ? html`<code>${l.holder}</code>${l.this_node ? html` <${Badge} kind="ok">this node<//>` : null}`
      : html`<${Badge} kind="bad">nobody<//>`)],
    ["held_here", "here", (l) => (l.held_here ? "yes" : "no")],
    ["token", "fencing token", (l) => fmtInt(l.token)],
    ["written_ns", "renewed", (l) => fmtTime(l.written_ns)],
  ];
  return html`<div class="card"><h3>Leases</h3>
    <p class="muted">Work that runs on one node at a time; this node is <code data-testid="node-name">${c.node}</code>.</p>
    <${DataTable} rows=${c.leases} columns=${cols} testid="leases-table" rowKey="name" /></div>`;
}

function Meta({ meta }) {
  if (!meta)
    return html`<div class="card"><h3>Meta group</h3><p class="muted" data-testid="meta-off">Set
      <code>[streams] nats_monitor</code> to the servers' monitoring URLs to see the meta leader.</p></div>`;
  return html`<div class="card" data-testid="meta"><h3>Meta group ${meta.cluster ? html`<code>${meta.cluster}</code>` : null}</h3>
    <p>leader <strong data-testid="meta-leader">${meta.leader || "none"}</strong>
      ${meta.size ? html` · ${meta.size} servers` : null}</p>
    <p><${Peers} peers=${meta.peers} /></p>
    <ul class="muted">${Object.entries(meta.monitors).map(([u, s]) => html`<li><code>${u}</code>: ${s}</li>`)}</ul>
  </div>`;
}

function Groups({ groups }) {
  const cols = [
    ["jetstream_stream", "JetStream stream"],
    ["stream", "loglake stream", (g) => (g.stream === null ? html`<span class="muted">bucket</span>` : `${g.stream} / ${g.partition}`)],
    ["leader", "leader", (g) => (g.leader ? html`<code>${g.leader}</code>` : html`<${Badge} kind="bad">no leader<//>`)],
    ["replicas", "replicas", (g) => html`<${Peers} peers=${g.replicas} />`],
    ["messages", "messages", (g) => fmtInt(g.messages)],
  ];
  return html`<div class="card"><h3>Stream groups</h3>
    <${DataTable} rows=${groups} columns=${cols} testid="groups-table" rowKey="jetstream_stream" /></div>`;
}

function Sealer({ s }) {
  if (!s) return null;
  const cols = [
    ["stream", "stream"],
    ["partition", "partition"],
    ["sealed_next", "sealed up to", (x) => fmtInt(x.sealed_next)],
    ["next_index", "JetStream end", (x) => fmtInt(x.next_index)],
    ["lag_records", "lag (records)", (x) => html`<span data-testid="lag-records">${fmtInt(x.lag_records)}</span>`],
    ["lag_seconds", "lag (s)", (x) => x.lag_seconds.toFixed(1)],
  ];
  return html`<div class="card" data-testid="sealer"><h3>Sealer</h3>
    ${s.here
      ? html`<p class="muted">This node seals every ${s.interval_s} s into its lake.</p>
          ${s.error ? html`<div class="error">${s.error}</div>` : null}
          <${DataTable} rows=${s.lag} columns=${cols} testid="sealer-table" rowKey="stream" />`
      : html`<p class="muted" data-testid="sealer-elsewhere">Sealed by <code>${s.holder || "nobody yet"}</code>; its console shows the lag.</p>`}
  </div>`;
}

export function ClusterPage() {
  const state = usePoll("/cluster", 2000);
  return html`<section>
    <h1>Cluster</h1>
    <${PartSection} state=${state} what="cluster">
      ${(c) => (c.backend === "embedded"
        ? html`<div class="notice" data-testid="embedded">This node keeps its streams in the embedded log of its
            data dir: there is no cluster, and every once-only work runs here.</div>`
        : html`<p data-testid="backend">NATS JetStream <code>${c.servers}</code>, R${c.replicas}, prefix <code>${c.prefix}</code>
            ${c.reachable
              ? html` <${Badge} kind="ok">reachable<//>`
              : html` <${Badge} kind="bad">unreachable<//> <span class="bad" data-testid="cluster-error">${c.error}</span>`}</p>
          <${Leases} c=${c} /><${Meta} meta=${c.meta} /><${Groups} groups=${c.groups} /><${Sealer} s=${c.sealer} />`)}
    <//>
  </section>`;
}
