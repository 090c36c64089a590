// SDS channels: participants, unacknowledged messages, missing dependencies.

import { DataTable, PartSection, html, usePoll } from "../ui.js";

export function SdsPage() {
  const channels = usePoll("/sds/channels", 2000);
  return html`<section>
    <h1>SDS channels</h1>
    <${PartSection} state=${channels} what="SDS channels">
      ${(rows) => html`<${DataTable} rows=${rows} testid="sds-table" />`}
    <//>
  </section>`;
}
