// Status community history archives: the archives built, their torrents and peers.

import { DataTable, PartSection, html, usePoll } from "../ui.js";

export function ArchivesPage() {
  const archives = usePoll("/archives", 3000);
  const torrents = usePoll("/archives/torrents", 2000);
  return html`<section>
    <h1>Archives</h1>
    <${PartSection} state=${archives} what="archives">
      ${(rows) => html`<${DataTable} rows=${rows} testid="archives-table" />`}
    <//>
    <h2>Torrents</h2>
    <${PartSection} state=${torrents} what="torrents">
      ${(rows) => html`<${DataTable} rows=${rows} testid="torrents-table" />`}
    <//>
  </section>`;
}
