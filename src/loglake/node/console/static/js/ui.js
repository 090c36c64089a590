// Shared pieces of the console's pages: htm bound to Preact, polling, formatting, small widgets.

import { h } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import htm from "htm";

import { ApiError, api, apiPage } from "./api.js";

export const html = htm.bind(h);

/** A console link: "#/records?stream=a&partition=1". */
export function href(path, params = {}) {
  const q = new URLSearchParams(params).toString();
  return "#" + path + (q ? "?" + q : "");
}

/** Poll `path` every `ms` while the component is mounted (the page updates without reload).
 *  Returns {data, error, at, total, next}: `total`, a paged list's row count in all (null when
 *  the route does not page), `next` the next page's `after` (null on the last page); a 401 is
 *  raised to the app (it shows the login form). */
export function usePoll(path, ms = 1000, deps = []) {
  const [state, setState] = useState({ data: null, error: null, at: 0, total: null, next: null });
  useEffect(() => {
    if (path === null) return undefined;
    let alive = true;
    let timer = null;
    const tick = async () => {
      try {
        const { data, total, next } = await apiPage(path);
        if (alive) setState({ data, error: null, at: Date.now(), total, next });
      } catch (e) {
        if (e instanceof ApiError && e.status === 401) unauthorized(e.message);
        if (alive) setState((s) => ({ ...s, error: e }));
      }
      if (alive && ms > 0) timer = setTimeout(tick, ms);
    };
    tick();
    return () => {
      alive = false;
      clearTimeout(timer);
    };
  }, [path, ms, ...deps]);
  return state;
}

export const MAX_FILTER = 200; // the node's longest `contains`

/** Poll a paged list (`path` with `params`) a page at a time: a name filter (the node's
 *  `contains`) and next/previous pages by the node's `X-Next-After` cursor (the cursors of the
 *  pages before are kept here: the node's pages only go forward). A new filter or `params`
 *  starts again at the first page. */
export function usePaged(path, params, ms) {
  const [filter, setFilterState] = useState("");
  const q = new URLSearchParams(params);
  const key = q.toString();
  const [nav, setNav] = useState({ key, cursors: [] });
  const pages = nav.key === key ? nav.cursors : [];
  const setCursors = (cursors) => setNav({ key, cursors });
  if (filter) q.set("contains", filter);
  if (pages.length) q.set("after", pages[pages.length - 1]);
  const state = usePoll(path + "?" + q.toString(), ms);
  return {
    ...state,
    filter,
    page: pages.length,
    setFilter: (f) => {
      setFilterState(f.slice(0, MAX_FILTER));
      setCursors([]);
    },
    onNext: state.next ? () => setCursors([...pages, state.next]) : null,
    onPrev: pages.length ? () => setCursors(pages.slice(0, -1)) : null,
  };
}

/** A paged list's filter box and previous/next buttons (`testid`-filter, -prev, -next). */
export function Pager({ list, testid, what, paged = true }) {
  return html`<div class="pager">
    <label>filter <input type="search" data-testid=${testid + "-filter"} maxlength=${MAX_FILTER}
      placeholder=${"part of a " + what} value=${list.filter}
      onInput=${(e) => list.setFilter(e.target.value)} /></label>
    ${paged
      ? html`<button type="button" data-testid=${testid + "-prev"} disabled=${!list.onPrev}
            onClick=${list.onPrev}>← previous</button>
          <button type="button" data-testid=${testid + "-next"} disabled=${!list.onNext}
            onClick=${list.onNext}>next →</button>`
      : null}
  </div>`;
}

/** A stream chooser: a filter box (the node's `contains`) and a dropdown of the first 500
 *  streams that match; the chosen stream stays in the dropdown whatever the filter. */
export function StreamSelect({ value, onChange, streams }) {
  const names = (streams.data || []).map((s) => s.name);
  if (value && !names.includes(value)) names.unshift(value);
  return html`<label>stream
      <input type="search" name="stream-filter" data-testid="stream-filter" maxlength=${MAX_FILTER}
        placeholder="filter" size="10" value=${streams.filter}
        onInput=${(e) => streams.setFilter(e.target.value)} />
      <select name="stream" value=${value} onChange=${(e) => onChange(e.target.value)}>
        ${names.map((n) => html`<option value=${n}>${n}</option>`)}
      </select>
    </label>${streams.total !== null && streams.total > (streams.data || []).length
      ? html` <span class="muted" data-testid="stream-choices">${`the first ${fmtInt((streams.data || []).length)} of ${fmtInt(streams.total)}: filter to find another`}</span>`
      : null}`;
}

/** Tell the app the node refused the token. */
export function unauthorized(message) {
  window.dispatchEvent(new CustomEvent("loglake:unauthorized", { detail: message }));
}

/** Call the API from an event handler; a 401 goes to the app, other errors are returned. */
export async function act(path, options) {
  try {
    return { data: await api(path, options), error: null };
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) unauthorized(e.message);
    return { data: null, error: e };
  }
}

export function ErrorBox({ error, what }) {
  if (!error) return null;
  const disabled = error.kind === "PartDisabled";
  return html`<div class=${disabled ? "notice" : "error"} data-testid="error" role="alert">
    ${what ? html`<strong>${what}: </strong>` : null}${error.message}
  </div>`;
}

export function fmtInt(n) {
  if (n === null || n === undefined) return "–";
  return Number(n).toLocaleString("en-US");
}

export function fmtRate(r) {
  if (r === null || r === undefined) return "–";
  if (r >= 100) return Math.round(r).toLocaleString("en-US") + "/s";
  return r.toFixed(1) + "/s";
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = Number(n);
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return (i === 0 ? v : v.toFixed(1)) + " " + units[i];
}

export function fmtTime(ns) {
  if (ns === null || ns === undefined) return "–";
  const d = new Date(Number(ns) / 1e6);
  if (isNaN(d.getTime())) return String(ns);
  return d.toISOString().replace("T", " ").replace("Z", " UTC");
}

export function fmtDuration(s) {
  if (s === null || s === undefined) return "–";
  s = Math.floor(s);
  const d = Math.floor(s / 86400);
  const hh = Math.floor((s % 86400) / 3600);
  const mm = Math.floor((s % 3600) / 60);
  const ss = s % 60;
  if (d) return `${d}d ${hh}h`;
  if (hh) return `${hh}h ${mm}m`;
  if (mm) return `${mm}m ${ss}s`;
  return `${ss}s`;
}

/** A tiny inline SVG line of the last values (no charting library needed for this). */
export function Sparkline({ values, width = 120, height = 24 }) {
  if (!values || values.length < 2) return html`<svg class="spark" width=${width} height=${height}></svg>`;
  const max = Math.max(...values, 1);
  const step = width / (values.length - 1);
  const pts = values
    .map((v, i) => `${(i * step).toFixed(1)},${(height - 2 - (v / max) * (height - 4)).toFixed(1)}`)
    .join(" ");
  return html`<svg class="spark" width=${width} height=${height} aria-hidden="true">
    <polyline points=${pts} fill="none" stroke="currentColor" stroke-width="1.5" />
  </svg>`;
}

/** Keep the last `n` values of something that changes on each render with a new `at`. */
export function useHistory(value, at, n = 60) {
  const ref = useRef([]);
  const last = useRef(0);
  if (at && at !== last.current) {
    last.current = at;
    ref.current = [...ref.current, value].slice(-n);
  }
  return ref.current;
}

export function Progress({ value, max }) {
  const pct = max > 0 ? Math.min(100, (100 * value) / max) : 0;
  return html`<div class="progress" title=${`${fmtInt(value)} / ${fmtInt(max)}`}>
    <div class="bar" style=${`width:${pct.toFixed(1)}%`}></div>
    <span>${pct.toFixed(0)}%</span>
  </div>`;
}

export function Badge({ kind, children }) {
  return html`<span class=${"badge " + (kind || "")}>${children}</span>`;
}

/** A page section for a part's endpoint: a notice when the node does not run the part
 *  (PartDisabled) or its API has no such route yet; otherwise `children(data)`. */
export function PartSection({ state, what, children }) {
  const { data, error } = state;
  if (error && error.status === 404 && error.kind === "PartDisabled")
    return html`<div class="notice" data-testid="part-disabled">${error.message}</div>`;
  if (error && error.status === 404 && !data)
    return html`<div class="notice" data-testid="no-endpoint">This node's API has no ${what} yet (${error.message}).</div>`;
  return html`<${ErrorBox} error=${error} what=${what} />${data ? children(data) : null}`;
}

/** A table of JSON rows: the given columns (key, label, render?) or every key of the first row. */
export function DataTable({ rows, columns, testid, rowKey }) {
  if (!rows) return null;
  if (!rows.length) return html`<p class="muted">None.</p>`;
  const cols = columns || Object.keys(rows[0]).map((k) => [k, k]);
  return html`<table data-testid=${testid}>
    <thead><tr>${cols.map(([k, label]) => html`<th>${label}</th>`)}</tr></thead>
    <tbody>
      ${rows.map(
        (r) => html`<tr data-key=${rowKey ? r[rowKey] : undefined}>
          ${cols.map(([k, , render]) => html`<td data-col=${k}>${render ? render(r) : cell(r[k])}</td>`)}
        </tr>`,
      )}
    </tbody>
  </table>`;
}

export function cell(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") return fmtInt(v);
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (Array.isArray(v)) return v.map((x) => (typeof x === "object" ? JSON.stringify(x) : String(x))).join(", ");
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}
