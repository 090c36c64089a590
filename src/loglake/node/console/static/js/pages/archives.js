// Status community history archives: what the control node built, its torrent and peers,
// and what the member fetched.

import { DataTable, PartSection, fmtBytes, fmtInt, fmtTime, html, usePoll } from "../ui.js";

const day = (ns) => fmtTime(ns).slice(0, 10);

export function ArchivesPage() {
  const state = usePoll("/archives", 2000);
  const peers = usePoll("/archives/peers", 2000);
  const archiveCols = [
    ["archive_id", "archive", (a) => html`<code title=${a.archive_id}>${a.archive_id.slice(0, 18)}…</code>`],
    ["window", "window", (a) => `${day(a.from_ns)} → ${day(a.to_ns)}`],
    ["offset", "offset", (a) => fmtInt(a.offset)],
    ["size", "size", (a) => fmtBytes(a.size)],
    ["padding", "padding", (a) => fmtBytes(a.padding)],
  ];
  return html`<section>
    <h1>Archives</h1>
    <${PartSection} state=${state} what="archives">
      ${(a) => html`
        <dl class="facts" data-testid="archives-facts">
          <dt>community</dt><dd><code title=${a.community}>${a.community.slice(0, 18)}…</code></dd>
          <dt>stream</dt><dd><a href=${"#/streams?stream=" + encodeURIComponent(a.stream)}>${a.stream}</a>
            · <a href=${"#/records?stream=" + encodeURIComponent(a.stream) + "&view=waku"} data-testid="browse-community">messages</a></dd>
          <dt>special channel</dt><dd>${a.channel}</dd>
          <dt>store messages</dt><dd>${fmtInt(a.store_messages)}</dd>
          <dt>never archived</dt><dd data-testid="never-archived">${fmtInt(a.future_records)} dated ahead · ${fmtInt(a.late_records)} late · ${fmtInt(a.topic_skipped_records)} past topic bounds</dd>
          <dt>last round</dt><dd>${fmtTime(a.last_round_ns)}</dd>
          <dt>uploaded</dt><dd>${fmtBytes(a.uploaded_bytes)}</dd>
        </dl>
        ${Object.entries(a.errors || {})
          .filter(([, e]) => e)
          .map(([loop, e]) => html`<div class="error" data-testid="archives-error">${loop} loop: ${e}</div>`)}
        <h2>Built by the control node</h2>
        <${DataTable} rows=${a.archives} columns=${archiveCols} testid="archives-table" rowKey="archive_id" />
        <h2>Torrent</h2>
        ${a.torrent
          ? html`<dl class="facts" data-testid="torrent">
              <dt>info hash</dt><dd><code data-testid="info-hash">${a.torrent.info_hash}</code></dd>
              <dt>size</dt><dd>${fmtBytes(a.torrent.size)}</dd>
              <dt>pieces</dt><dd>${fmtInt(Math.ceil(a.torrent.size / a.torrent.piece_length))} × ${fmtBytes(a.torrent.piece_length)}</dd>
              <dt>seeding</dt><dd>${a.torrent.seeding ? html`<span class="ok">yes</span>` : "no"}${a.seeder ? ` on ${a.seeder}` : ""}</dd>
              <dt>magnet</dt><dd style="grid-column: span 3"><code class="magnet">${a.torrent.magnet}</code></dd>
            </dl>`
          : html`<p class="muted">No torrent yet (no archive built).</p>`}
        <h2>Peers</h2>
        <${PartSection} state=${peers} what="peers">
          ${(rows) => html`<${DataTable} rows=${rows} testid="peers-table" columns=${[
            ["address", "address"], ["client", "client"],
            ["uploaded", "uploaded", (p) => fmtBytes(p.uploaded)],
            ["downloaded", "downloaded", (p) => fmtBytes(p.downloaded)],
          ]} />`}
        <//>
        <h2>Member</h2>
        ${a.member
          ? html`<div data-testid="member">
              <p>${fmtInt(a.member.archives.length)} archives fetched, ${fmtInt(a.member.messages)} messages hydrated
                ${a.member.ignored ? html`, <span class="warn">${fmtInt(a.member.ignored)} magnet messages ignored</span>` : null}.</p>
              <${DataTable} rows=${a.member.archives} testid="member-archives" columns=${archiveCols.slice(0, 2)} />
            </div>`
          : html`<p class="muted">This node runs no member loop.</p>`}
      `}
    <//>
  </section>`;
}
