// The console's shell: token handling, navigation (routes in the URL fragment), the pages.

import { render } from "preact";
import { useEffect, useState } from "preact/hooks";

import { clearToken, getToken, loginError, setToken, takeTokenFromFragment } from "./api.js";
import { ArchivesPage } from "./pages/archives.js";
import { ClusterPage } from "./pages/cluster.js";
import { JobsPage } from "./pages/jobs.js";
import { RecordsPage } from "./pages/records.js";
import { ReplaysPage } from "./pages/replays.js";
import { SdsPage } from "./pages/sds.js";
import { StreamPage, StreamsPage } from "./pages/streams.js";
import { fmtDuration, html, usePoll } from "./ui.js";

const PAGES = [
  ["/streams", "Streams"],
  ["/records", "Records"],
  ["/replays", "Replays"],
  ["/archives", "Archives"],
  ["/sds", "SDS channels"],
  ["/jobs", "Spark jobs"],
  ["/cluster", "Cluster"],
];

/** "#/records?stream=a&partition=1" → {path: "/records", params: {stream: "a", ...}} */
function parseRoute() {
  const hash = window.location.hash.replace(/^#/, "") || "/streams";
  const [path, query = ""] = hash.split("?");
  return { path, params: Object.fromEntries(new URLSearchParams(query)) };
}

function useRoute() {
  const [route, setRoute] = useState(parseRoute());
  useEffect(() => {
    const on = () => setRoute(parseRoute());
    window.addEventListener("hashchange", on);
    return () => window.removeEventListener("hashchange", on);
  }, []);
  return route;
}

function Login({ message }) {
  const [value, setValue] = useState("");
  const submit = (e) => {
    e.preventDefault();
    if (!value.trim()) return;
    setToken(value);
    window.dispatchEvent(new CustomEvent("loglake:login"));
  };
  return html`<main class="login">
    <h1><span class="logo">loglake</span> console</h1>
    ${message ? html`<div class="error" role="alert" data-testid="auth-error">${message}</div>` : null}
    <form onSubmit=${submit} data-testid="login-form">
      <label for="token">Access token</label>
      <input id="token" name="token" type="password" autocomplete="off" value=${value}
        onInput=${(e) => setValue(e.target.value)} placeholder="paste the node's token" />
      <button type="submit">Open</button>
    </form>
    <p class="muted">The node printed a console URL with the token when it first started; the token
      is also in <code>node.token</code> in the node's data dir. It is kept for this tab only.</p>
  </main>`;
}

function NodeBadge() {
  const { data } = usePoll("/node", 5000);
  if (!data) return null;
  return html`<span class="node" data-testid="node-info">
    v${data.version} · up ${fmtDuration(data.uptime_s)}${data.metrics ? "" : " · metrics off"}
  </span>`;
}

function Shell({ route, onLogout }) {
  let page;
  const p = route.params;
  if (route.path === "/streams" && p.stream) page = html`<${StreamPage} name=${p.stream} />`;
  else if (route.path === "/streams") page = html`<${StreamsPage} />`;
  else if (route.path === "/records") page = html`<${RecordsPage} params=${p} />`;
  else if (route.path === "/replays") page = html`<${ReplaysPage} />`;
  else if (route.path === "/archives") page = html`<${ArchivesPage} />`;
  else if (route.path === "/sds") page = html`<${SdsPage} params=${p} />`;
  else if (route.path === "/jobs") page = html`<${JobsPage} />`;
  else if (route.path === "/cluster") page = html`<${ClusterPage} />`;
  else page = html`<p class="error">No page ${route.path}. <a href="#/streams">Streams</a></p>`;
  return html`<div class="shell">
    <header>
      <a class="logo" href="#/streams">loglake</a>
      <nav>
        ${PAGES.map(
          ([path, label]) =>
            html`<a href=${"#" + path} class=${route.path === path ? "active" : ""}
              data-testid=${"nav-" + path.slice(1)}>${label}</a>`,
        )}
      </nav>
      <${NodeBadge} />
      <button class="link" onClick=${onLogout} data-testid="logout">Forget token</button>
    </header>
    <main>${page}</main>
  </div>`;
}

function App() {
  const route = useRoute();
  const [authed, setAuthed] = useState(!!getToken());
  const [authError, setAuthError] = useState(
    loginError && "This console link did not log in: " + loginError,
  );
  useEffect(() => {
    const onBad = (e) => {
      clearToken();
      setAuthError(
        "The node refused this token (" + (e.detail || "401 Unauthorized") + "). " +
          "Paste the token the node printed, or the one in node.token in its data dir.",
      );
      setAuthed(false);
    };
    const onLogin = () => {
      setAuthError(null);
      setAuthed(true);
    };
    window.addEventListener("loglake:unauthorized", onBad);
    window.addEventListener("loglake:login", onLogin);
    return () => {
      window.removeEventListener("loglake:unauthorized", onBad);
      window.removeEventListener("loglake:login", onLogin);
    };
  }, []);
  if (!authed) return html`<${Login} message=${authError} />`;
  const logout = () => {
    clearToken();
    setAuthError(null);
    setAuthed(false);
  };
  return html`<${Shell} route=${route} onLogout=${logout} />`;
}

await takeTokenFromFragment();
const root = document.getElementById("app");
root.textContent = ""; // the "Loading" text: render() adds to a container, it does not replace it
render(html`<${App} />`, root);
