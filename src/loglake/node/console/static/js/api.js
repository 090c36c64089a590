// The node's JSON API as the console uses it: the bearer token and one fetch wrapper.
//
// The token arrives through a link the node prints (`/console/#login=<code>`: a one-time code
// the console trades for the token, `POST /console/login`, so what the browser's history keeps
// of the link is spent), through `#token=<token>` (a link made by hand; the browser's history
// keeps that one), or through the login form. A fragment is never sent to a server, so neither
// reaches access logs or Referer headers; it is cleared from the address bar at once. The token
// is kept in sessionStorage (gone when the tab closes) and sent as `Authorization: Bearer` on
// every /api call.

const KEY = "loglake.token";

export class ApiError extends Error {
  constructor(status, kind, message) {
    super(message);
    this.status = status;
    this.kind = kind;
  }
}

/** Why the link's login failed (shown by the login form), or null. */
export let loginError = null;

/** Take `#login=<code>` or `#token=<token>` (alone, or `#/page&...`) out of the fragment, and
 * keep the token (a code is traded for it first). */
export async function takeTokenFromFragment() {
  const hash = window.location.hash.replace(/^#/, "");
  const rest = [];
  let token = null;
  let code = null;
  for (const part of hash.split("&")) {
    if (part.startsWith("token=")) token = decodeURIComponent(part.slice(6));
    else if (part.startsWith("login=")) code = decodeURIComponent(part.slice(6));
    else if (part) rest.push(part);
  }
  if (token === null && code === null) return null;
  history.replaceState(null, "", window.location.pathname + "#" + (rest.join("&") || "/streams"));
  if (code !== null) {
    try {
      const res = await fetch("/console/login", {
        method: "POST",
        headers: { "Content-Type": "application/json", Accept: "application/json" },
        body: JSON.stringify({ code }),
      });
      const body = await res.json().catch(() => ({}));
      if (res.ok) token = body.token;
      else loginError = body.message || res.status + " " + res.statusText;
    } catch (e) {
      loginError = "the node did not answer (" + e.message + ")";
    }
  }
  if (token !== null) setToken(token);
  return token;
}

export function getToken() {
  return sessionStorage.getItem(KEY);
}

export function setToken(token) {
  sessionStorage.setItem(KEY, token.trim());
}

export function clearToken() {
  sessionStorage.removeItem(KEY);
}

/** Call `/api` + `path`; JSON in and out; errors as ApiError with the node's message. */
export async function api(path, options) {
  return (await apiPage(path, options)).data;
}

/** `api`, with the total of a paged list (its `X-Total-Count` header; null on other routes)
 *  and the next page's `after` (its `X-Next-After` header; null on the last page). */
export async function apiPage(path, { method = "GET", body } = {}) {
  const headers = { Accept: "application/json" };
  const token = getToken();
  if (token) headers.Authorization = "Bearer " + token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let res;
  try {
    res = await fetch("/api" + path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
    });
  } catch (e) {
    throw new ApiError(0, "NetworkError", "the node does not answer (" + e.message + ")");
  }
  let data = null;
  const text = await res.text();
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { message: text };
    }
  }
  if (!res.ok) {
    const kind = (data && data.error) || "HTTPError";
    const message = (data && data.message) || res.statusText;
    throw new ApiError(res.status, kind, message);
  }
  const total = res.headers.get("X-Total-Count");
  return { data, total: total === null ? null : Number(total), next: res.headers.get("X-Next-After") };
}

/** Base64 (the API's form of bytes) → Uint8Array. */
export function fromBase64(b64) {
  const bin = atob(b64 || "");
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}
