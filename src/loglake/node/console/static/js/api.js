// The node's JSON API as the console uses it: the bearer token and one fetch wrapper.
//
// The token arrives once in the URL fragment (the node prints `/console/#token=...`; a fragment
// is never sent to a server, so it stays out of access logs and Referer headers) or through the
// login form. It is kept in sessionStorage (gone when the tab closes) and sent as
// `Authorization: Bearer` on every /api call. The fragment is cleared at once so the token does
// not linger in the address bar or the history.

const KEY = "loglake.token";

export class ApiError extends Error {
  constructor(status, kind, message) {
    super(message);
    this.status = status;
    this.kind = kind;
  }
}

/** Take `#token=...` (alone, or `#/page&token=...`) out of the fragment; keep the token. */
export function takeTokenFromFragment() {
  const hash = window.location.hash.replace(/^#/, "");
  const parts = hash.split("&");
  const rest = [];
  let token = null;
  for (const part of parts) {
    if (part.startsWith("token=")) token = decodeURIComponent(part.slice(6));
    else if (part) rest.push(part);
  }
  if (token !== null) {
    setToken(token);
    const route = rest.join("&") || "/streams";
    history.replaceState(null, "", window.location.pathname + "#" + route);
  }
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
export async function api(path, { method = "GET", body } = {}) {
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
  return data;
}

/** Base64 (the API's form of bytes) → Uint8Array. */
export function fromBase64(b64) {
  const bin = atob(b64 || "");
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}
