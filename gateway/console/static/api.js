// Talking to the admin API from the page: same origin, JSON both ways. Changes go as
// application/json, which the admin API demands (a cross-site page cannot send it without a
// preflight the API never grants); the browser adds Origin and Sec-Fetch-Site itself.

export class ApiError extends Error {}

async function call(method, path, body) {
  const init = { method, headers: { Accept: "application/json" }, credentials: "same-origin" };
  if (method !== "GET") {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body ?? {});
  }
  const response = await fetch(path, init);
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

export const readConsole = () => call("GET", "/admin/v1/console");
export const nodeCommand = (node, action, reason) =>
  call("POST", `/admin/v1/nodes/${encodeURIComponent(node)}/${action}`, { reason });
export const scaleModel = (model, replicas) =>
  call("POST", `/admin/v1/models/${encodeURIComponent(model)}/scale`, { replicas });
export const putModel = (spec) =>
  call("PUT", `/admin/v1/models/${encodeURIComponent(spec.name ?? "")}`, spec);
export const createKey = (request) => call("POST", "/admin/v1/keys", request);
export const revokeKey = (nameOrId) =>
  call("DELETE", `/admin/v1/keys/${encodeURIComponent(nameOrId)}`);
export const setLimits = (nameOrId, limits) =>
  call("PUT", `/admin/v1/keys/${encodeURIComponent(nameOrId)}/limits`, limits);
