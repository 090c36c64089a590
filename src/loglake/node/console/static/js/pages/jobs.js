// Spark jobs: start one on a stream, follow its progress (Spark's status tracker), see its result.

import { useState } from "preact/hooks";

import {
  Badge,
  DataTable,
  PartSection,
  Progress,
  StreamSelect,
  act,
  fmtInt,
  fmtTime,
  html,
  usePaged,
  usePoll,
} from "../ui.js";

const JOBS = ["compact", "sds-audit"];
const KIND = { queued: "", running: "run", succeeded: "ok", failed: "bad" };

export function JobsPage() {
  const jobs = usePoll("/jobs", 1000);
  const streams = usePaged("/streams", { limit: 500 }, 0);
  const [form, setForm] = useState({ name: JOBS[0], stream: "" });
  const [message, setMessage] = useState(null);
  const start = async (e) => {
    e.preventDefault();
    const stream = form.stream || (streams.data && streams.data[0] && streams.data[0].name);
    const { data, error } = await act("/jobs", { method: "POST", body: { name: form.name, stream } });
    setMessage(error ? { bad: true, text: `Could not start ${form.name}: ${error.message}` }
      : { text: `Job ${data.id} (${data.name} on ${data.stream}) submitted.` });
  };
  const cols = [
    ["id", "job"],
    ["name", "name"],
    ["stream", "stream"],
    ["state", "state", (j) => html`<span data-testid="job-state"><${Badge} kind=${KIND[j.state]}>${j.state}<//></span>
      ${j.error ? html` <span class="bad">${j.error}</span>` : null}`],
    ["progress", "progress", (j) => html`<${Progress} value=${j.state === "succeeded" ? 1 : j.progress.fraction} max=${1} />
      <span class="muted"> ${fmtInt(j.progress.tasks_done)} / ${fmtInt(j.progress.tasks_total)} tasks, ${j.progress.stages} stages</span>`],
    ["submitted_ns", "submitted", (j) => fmtTime(j.submitted_ns)],
    ["result", "result", (j) => (j.result ? html`<code>${JSON.stringify(j.result)}</code>` : "–")],
  ];
  return html`<section>
    <h1>Spark jobs</h1>
    ${message ? html`<div class=${message.bad ? "error" : "notice"} data-testid="job-message">${message.text}</div>` : null}
    <${PartSection} state=${jobs} what="Spark jobs">
      ${(rows) => html`
        <form class="controls" onSubmit=${start} data-testid="job-form">
          <label>job
            <select name="job" value=${form.name} onChange=${(e) => setForm({ ...form, name: e.target.value })}>
              ${JOBS.map((j) => html`<option value=${j}>${j}</option>`)}
            </select>
          </label>
          <${StreamSelect} value=${form.stream} streams=${streams}
            onChange=${(name) => setForm({ ...form, stream: name })} />
          <button type="submit">Start</button>
        </form>
        <${DataTable} rows=${[...rows].reverse()} columns=${cols} testid="jobs-table" rowKey="id" />`}
    <//>
  </section>`;
}
