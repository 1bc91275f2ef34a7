// Talking to the admin API from the page: same origin, JSON both ways. Changes go as
// application/json, which the admin API demands (a cross-site page cannot send it without a
// preflight the API never grants); the browser adds Origin and Sec-Fetch-Site itself.

// On the remote console (/console/) the server names another base and a CSRF token, which every
// change carries in a header; on the admin listener the token is empty and never sent.

export class ApiError extends Error {}

const meta = (name) =>
  document.querySelector(`meta[name="${name}"]`)?.getAttribute("content") ?? "";
const BASE = meta("llmgw-api") || "/admin/v1";
export const CSRF = meta("llmgw-csrf");
export const LOGIN = "/console/login";

async function call(method, path, body) {
  const init = { method, headers: { Accept: "application/json" }, credentials: "same-origin" };
  if (method !== "GET") {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body ?? {});
    if (CSRF) init.headers["X-CSRF-Token"] = CSRF;
  }
  const response = await fetch(path, init);
  if (response.status === 401 && CSRF) {
    // The session ended (logout elsewhere, idle, the key revoked): back to the login page.
    location.assign(LOGIN);
    throw new ApiError("Logged out.");
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const message = data?.error?.message ?? `${response.status} ${response.statusText}`;
    throw new ApiError(message);
  }
  return data;
}

export const readConsole = () => call("GET", `${BASE}/console`);
export const nodeCommand = (node, action, reason) =>
  call("POST", `${BASE}/nodes/${encodeURIComponent(node)}/${action}`, { reason });
export const scaleModel = (model, replicas) =>
  call("POST", `${BASE}/models/${encodeURIComponent(model)}/scale`, { replicas });
export const importOllama = (request) => call("POST", `${BASE}/imports/ollama`, request);
export const putModel = (spec) =>
  call("PUT", `${BASE}/models/${encodeURIComponent(spec.name ?? "")}`, spec);
export const createKey = (request) => call("POST", `${BASE}/keys`, request);
export const revokeKey = (nameOrId) =>
  call("DELETE", `${BASE}/keys/${encodeURIComponent(nameOrId)}`);
export const setLimits = (nameOrId, limits) =>
  call("PUT", `${BASE}/keys/${encodeURIComponent(nameOrId)}/limits`, limits);
export const logout = () => call("POST", "/console/logout");

// The request log and the charts' series (gateway/admin/observe.py); empty filters left out.
const query = (params) => {
  const given = Object.entries(params).filter(([, v]) => v !== "" && v !== null && v !== undefined);
  return given.length ? `?${new URLSearchParams(given)}` : "";
};
export const readRequests = (filters) => call("GET", `${BASE}/requests${query(filters)}`);
export const readSeries = (which) => call("GET", `${BASE}/series${query(which)}`);

// The playground (gateway/admin/playground.py): the models it offers, and a chat request that
// takes the OpenAI route's own path with the operator's key. The raw response is handed back:
// the page reads its stream, its status and its x-request-id itself. The key goes in this one
// request's header only.
export const readPlaygroundModels = () => call("GET", `${BASE}/playground/models`);
export function playgroundChat(apiKey, body) {
  const headers = { "Content-Type": "application/json", Accept: "text/event-stream" };
  if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
  if (CSRF) headers["X-CSRF-Token"] = CSRF;
  return fetch(`${BASE}/playground/chat/completions`, {
    method: "POST",
    headers,
    body: JSON.stringify(body),
    credentials: "same-origin",
    cache: "no-store",
  });
}
