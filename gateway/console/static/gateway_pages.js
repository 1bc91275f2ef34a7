// The gateway's pages: keys (limits, revoke) with usage per key, model and day, and routing
// (the fair queue: who waits for what, refusals, replica depths; each model's routing state
// over the last minute and its incorrect routes; decisions by reason, cache hits, requests by
// status).

import { actionButton, h, num, svg, table } from "./dom.js";

function usageByKey(usage) {
  const byKey = new Map();
  for (const row of usage) {
    const tokens = row.prompt_tokens + row.completion_tokens;
    const entry = byKey.get(row.key_id) ?? { requests: 0, tokens: 0 };
    entry.requests += row.requests;
    entry.tokens += tokens;
    byKey.set(row.key_id, entry);
  }
  return byKey;
}

function limitsText(limits) {
  const parts = [];
  if (limits?.rpm) parts.push(`${num(limits.rpm)} req/min`);
  if (limits?.tpm) parts.push(`${num(limits.tpm)} tok/min`);
  if (limits?.token_budget) parts.push(`${num(limits.token_budget)} tokens a ${limits.budget_period || "day"}`);
  // Fair queuing: shown where they differ from a new key's (weight 1, interactive).
  if (limits?.weight != null && limits.weight !== 1) parts.push(`weight ${limits.weight}`);
  if (limits?.top_priority && limits.top_priority !== "interactive") parts.push(`priority up to ${limits.top_priority}`);
  return parts.join(", ") || "none";
}

export function keys(data, act) {
  const gw = data.gateway;
  const active = gw.keys.filter((k) => !k.revoked_at);
  const used = usageByKey(gw.usage);
  const rows = active.map((key) => {
    const u = used.get(key.key_id) ?? { requests: 0, tokens: 0 };
    const limitId = `limits-${key.key_id}`;
    return [
      key.name,
      key.admin ? "admin" : "client",
      (key.models ?? []).join(", ") || "all",
      limitsText(key.limits),
      num(u.requests),
      num(u.tokens),
      h(
        "form",
        {
          class: "limits",
          "aria-label": `Limits of key ${key.name}`,
          onsubmit: (event) => {
            event.preventDefault();
            const value = event.target.elements.rpm.value;
            act.setLimits(key.name, { ...key.limits, rpm: value ? Number(value) : null });
          },
        },
        h("label", { for: limitId }, "req/min"),
        h("input", { id: limitId, name: "rpm", type: "number", min: 1, value: key.limits?.rpm ?? "", "data-key": limitId }),
        h("button", { type: "submit", "data-key": `limits:${key.key_id}`, "aria-label": `Set requests per minute of ${key.name}` }, "Set"),
      ),
      actionButton(`revoke:${key.key_id}`, "Revoke", `Revoke key ${key.name}`, () => act.revoke(key.name)),
    ];
  });
  const names = new Map(gw.keys.map((k) => [k.key_id, k.name]));
  return [
    table("Active keys (usage over the last 31 days)", ["Name", "Role", "Models", "Limits", "Requests", "Tokens", "Requests per minute", "Revoke"], rows, "no active key", "keys"),
    h("h3", {}, "Tokens per day"),
    usageChart(gw.usage),
    table(
      "Usage per key, model and day",
      ["Day", "Key", "Model", "Requests", "Prompt tokens", "Completion tokens"],
      [...gw.usage]
        .sort((a, b) => (a.day < b.day ? 1 : -1))
        .map((r) => [r.day, names.get(r.key_id) ?? r.key_id, r.model, num(r.requests), num(r.prompt_tokens), num(r.completion_tokens)]),
      "no request yet",
      "usage",
    ),
  ];
}

// Tokens per UTC day as bars, one colour band per model; the table below has every figure.
function usageChart(usage) {
  const days = [...new Set(usage.map((r) => r.day))].sort();
  if (!days.length) return h("p", { class: "empty" }, "No usage yet.");
  const models = [...new Set(usage.map((r) => r.model))].sort();
  const total = (day, model) =>
    usage.filter((r) => r.day === day && (model === undefined || r.model === model)).reduce((n, r) => n + r.prompt_tokens + r.completion_tokens, 0);
  const peak = Math.max(...days.map((d) => total(d)), 1);
  const width = 40 * days.length + 40;
  const chart = svg("svg", { viewBox: `0 0 ${width} 140`, preserveAspectRatio: "xMinYMid meet", class: "chart", role: "img", "aria-label": `Tokens per day, ${days[0]} to ${days[days.length - 1]}, highest ${peak}` });
  days.forEach((day, i) => {
    let y = 120;
    models.forEach((model, m) => {
      const height = (100 * total(day, model)) / peak;
      if (!height) return;
      y -= height;
      chart.append(svg("rect", { x: 30 + 40 * i, y, width: 28, height, class: `bar r${m % 8}` }, svg("title", {}, `${day} ${model}: ${total(day, model)} tokens`)));
    });
    chart.append(svg("text", { x: 44 + 40 * i, y: 135, class: "axis", "text-anchor": "middle" }, day.slice(5)));
  });
  const legend = h("ul", { class: "legend", "aria-hidden": "true" }, models.map((m, i) => h("li", {}, h("span", { class: `swatch r${i % 8}` }), m)));
  return h("div", { class: "chart-box" }, chart, legend);
}

const REFUSALS = {
  queue_full: "queue_full (429: the key's queue for its class was full)",
  queue_timeout: "queue_timeout (503: no replica had room in time)",
};

function seconds(value) {
  return value === null || value === undefined ? "–" : `${num(value, 1)} s`;
}

// The fair queue now: who waits for what (highest class first, as the gateway sends them),
// what it refused, and how many requests each replica is sent at once.
function queue(q) {
  if (!q) return [];
  if (!q.enabled) return [h("p", { "data-table": "queue" }, "The fair queue is off: requests go to the engines as they arrive.")];
  const waiting = q.waiting.reduce((n, w) => n + w.waiting, 0);
  const admitted = q.admitted.reduce((n, a) => n + a.requests, 0);
  return [
    h("p", {}, `${num(waiting)} request(s) waiting in the fair queue; ${num(admitted)} let through and not ended.`),
    table(
      "Waiting for a replica",
      ["Model", "Key", "Class", "Waiting", "Oldest has waited"],
      q.waiting.map((w) => [w.model, w.key, w.priority, num(w.waiting), seconds(w.oldest_s)]),
      "nothing waits",
      "queue",
    ),
    table(
      "Refused by the queue (since this gateway started)",
      ["Model", "Reason", "Requests"],
      q.refusals.map((r) => [r.model, REFUSALS[r.reason] ?? r.reason, num(r.count)]),
      "none",
      "refusals",
    ),
    table(
      "Replica depths (requests sent at once, learnt from the engine's gauges)",
      ["Replica", "Model", "Depth"],
      q.depths.map((d) => [d.replica, d.model || "–", num(d.depth)]),
      "none learnt yet",
      "depths",
    ),
  ];
}

const STATES = ["exact", "approximate", "degraded", "fallback"];

function share(part, whole) {
  return whole ? `${num((100 * part) / whole, 1)}%` : "–";
}

function rate(value) {
  return value === null || value === undefined ? "–" : `${num(100 * value, 1)}%`;
}

// Per model: the state its routing is in (docs/routing-states.md), the share of its decisions
// in each state over the gateway's window, and how often a replica predicted to hold the
// prompt's prefix did not (over the window, and since the gateway started).
// The peer bus (docs/peer-bus.md): whether this gateway routes by every gateway's record.
function peersLine(peers) {
  if (peers == null) return "The peer bus is off: this gateway routes by its own record alone.";
  const names = Object.keys(peers);
  if (names.length === 0) return "No other gateway process on the store: this one's record is the whole picture.";
  const missing = names.filter((name) => !peers[name]);
  const heard = `${names.length - missing.length} of ${names.length} other gateway process(es) heard`;
  return missing.length ? `${heard}; waiting on ${missing.join(", ")}: routing is degraded until they are.` : `${heard}: every gateway's record is in this one's picture.`;
}

function routingStates(rows) {
  if (!rows) return [];
  const window = rows.length ? rows[0].window_s : 60;
  return table(
    `Routing state by model (shares over the last ${num(window)} s)`,
    ["Model", "State", "Why", ...STATES.map((s) => s[0].toUpperCase() + s.slice(1)), "Incorrect routes", "Since start"],
    rows.map((r) => {
      const total = STATES.reduce((n, s) => n + r.decisions[s], 0);
      const checked = STATES.reduce((n, s) => n + r.predicted[s], 0);
      const checkedAll = STATES.reduce((n, s) => n + r.predicted_since_start[s], 0);
      return [
        r.model,
        r.state ?? "–",
        r.why ?? "–",
        ...STATES.map((s) => share(r.decisions[s], total)),
        checked ? `${rate(r.incorrect_rate)} of ${num(checked)}` : "–",
        checkedAll ? `${rate(r.incorrect_rate_since_start)} of ${num(checkedAll)}` : "–",
      ];
    }),
    "no request routed yet",
    "routing-states",
  );
}

export function routing(data) {
  const gw = data.gateway;
  const byModel = new Map();
  for (const d of gw.decisions) {
    const entry = byModel.get(d.model) ?? { total: 0, cache: 0 };
    entry.total += d.count;
    if (d.cache_hit) entry.cache += d.count;
    byModel.set(d.model, entry);
  }
  return [
    h(
      "p",
      {},
      `Routing table version ${gw.routes_version}`,
      gw.routes_error ? ` (last error: ${gw.routes_error})` : "",
      `; ${num(gw.in_flight)} request(s) in flight. Counted since this gateway started.`,
    ),
    h("h3", {}, "Fair queue"),
    queue(gw.queue),
    h("h3", {}, "Replica choices"),
    h("p", {}, peersLine(gw.peers)),
    routingStates(gw.routing_states),
    table(
      "Cache hits by model",
      ["Model", "Replica choices", "To a replica holding the prefix", "Share"],
      [...byModel].map(([model, e]) => [model, num(e.total), num(e.cache), e.total ? `${num((100 * e.cache) / e.total, 1)}%` : "–"]),
      "no request routed yet",
    ),
    table(
      "Routing decisions by reason",
      ["Model", "Reason", "Decisions", "Cache hit"],
      gw.decisions.map((d) => [d.model, d.reason, num(d.count), d.cache_hit ? "yes" : "no"]),
      "none yet",
      "decisions",
    ),
    table("Requests by status", ["Model", "Status", "Requests"], gw.requests.map((r) => [r.model, r.status, num(r.count)]), "none yet", "requests"),
  ];
}
