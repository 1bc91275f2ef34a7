// The Playground page: a chat request sent with an API key the operator pastes (held in this
// module's memory for the one request, never stored or put in a URL), streamed back over fetch,
// then what the gateway knew of it, read from the request log by its x-request-id: the replica,
// node and the router's reason, the gateway's TTFT beside the browser's, the tokens, and what
// the key was billed and has left of its budget.

import * as api from "./api.js";
import { h, num, table } from "./dom.js";

// How long the page looks for the request in the log: it is added as the request ends, a moment
// after the stream's last byte may have reached the page.
const LOG_TRIES = 20;
const LOG_WAIT_MS = 150;
const USAGE_TRIES = 8;
const USAGE_WAIT_MS = 400;

let models = [];

export const playgroundData = async () => {
  try {
    return { page: "playground", answer: await api.readPlaygroundModels() };
  } catch (err) {
    return { page: "playground", error: err.message };
  }
};

function setOptions(select, values, keep) {
  const wanted = JSON.stringify(values);
  if (select.dataset.options === wanted) return;
  select.dataset.options = wanted;
  select.replaceChildren(...values.map(([value, text]) => h("option", { value, selected: value === keep }, text)));
}

function offerAdapters() {
  const chosen = models.find((m) => m.model === document.getElementById("pg-model").value);
  const select = document.getElementById("pg-adapter");
  setOptions(select, [["", "none"], ...(chosen?.adapters ?? []).map((a) => [a, a])], select.value);
}

// The region under the form: the models on offer. The pickers above are filled as a side
// effect, keeping what the operator chose.
export function playground(data) {
  const read = data.page?.page === "playground" ? data.page : null;
  if (read?.error) return h("p", { class: "empty" }, `The models: ${read.error}`);
  if (!read?.answer) return h("p", { class: "empty" }, "Loading…");
  models = read.answer.data;
  const select = document.getElementById("pg-model");
  setOptions(select, models.map((m) => [m.model, m.model]), select.value);
  offerAdapters();
  return table(
    "Models the gateway routes",
    ["Model", "Ready replicas", "Adapters"],
    models.map((m) => [m.model, num(m.ready_replicas), m.adapters.join(", ") || "–"]),
    "none yet.",
    "playground-models",
  );
}

const ms = (value) => (value === null || value === undefined ? "–" : `${num(value, 1)} ms`);

function showError(text) {
  const box = document.getElementById("pg-error");
  box.textContent = text;
  box.hidden = !text;
}

function showFacts(facts) {
  document.getElementById("pg-facts").replaceChildren(
    ...facts.flatMap(([name, term, value]) => [h("dt", {}, term), h("dd", { "data-fact": name }, value)]),
  );
}

async function errorMessage(response) {
  const text = await response.text();
  try {
    return JSON.parse(text).error.message;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

// The stream's events, each data line's JSON handed to `onEvent`; "[DONE]" ends it.
async function readStream(response, onEvent) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const payload = line.slice(5).trim();
        if (payload === "[DONE]") return;
        onEvent(JSON.parse(payload));
      }
    }
  }
}

async function logged(requestId) {
  for (let i = 0; i < LOG_TRIES; i += 1) {
    const answer = await api.readRequests({ request_id: requestId, limit: 1 });
    if (answer.data.length) return answer.data[0];
    await new Promise((resolve) => setTimeout(resolve, LOG_WAIT_MS));
  }
  return null;
}

// The key's use this UTC day or month (its budget's period) as the store has recorded it, from
// the console's own data (the keys and their usage by day); null for a key without a budget.
function periodUse(data, keyId) {
  const key = data?.gateway?.keys?.find((k) => k.key_id === keyId);
  const budget = key?.limits?.token_budget;
  if (!budget) return null;
  const period = key.limits.budget_period || "day";
  const today = new Date().toISOString().slice(0, 10);
  const inPeriod = (day) => (period === "month" ? day.slice(0, 7) === today.slice(0, 7) : day === today);
  const used = data.gateway.usage
    .filter((r) => r.key_id === keyId && inPeriod(r.day))
    .reduce((n, r) => n + r.prompt_tokens + r.completion_tokens, 0);
  return { budget, period, used };
}

// The console's data once the store's usage holds this request (the gateway writes usage about
// every second), or the latest read after USAGE_TRIES polls.
async function withUsage(before, record, billed, act) {
  const wanted = (periodUse(before, record.key_id)?.used ?? 0) + billed;
  let data = before;
  for (let i = 0; i < USAGE_TRIES; i += 1) {
    data = await act.refresh();
    const use = periodUse(data, record.key_id);
    if (!use || use.used >= wanted) break;
    await new Promise((resolve) => setTimeout(resolve, USAGE_WAIT_MS));
  }
  return data;
}

function budgetText(data, keyId) {
  const use = periodUse(data, keyId);
  if (!use) return "no token budget";
  return `${num(Math.max(use.budget - use.used, 0))} of ${num(use.budget)} tokens left this ${use.period}`;
}

function requestFacts(record, browserTtftMs, data) {
  if (!record) return [["request", "Request", "not found in the request log"]];
  const billed = (record.prompt_tokens ?? 0) + (record.completion_tokens ?? 0);
  return [
    ["request", "Request id", h("code", {}, record.request_id)],
    ["status", "Status", record.error_code ? `${record.status} ${record.error_code}` : String(record.status)],
    ["key", "Key", record.key_name ?? "–"],
    ["replica", "Replica", record.replica ? `${record.replica} on ${record.node}` : "–"],
    ["routing", "Routing", record.reason ? `${record.reason} (${record.routing_state})` : "–"],
    ["queue", "Fair queue", ms(record.queue_s === null ? null : record.queue_s * 1000)],
    ["ttft", "TTFT (gateway)", ms(record.ttft_s === null ? null : record.ttft_s * 1000)],
    ["browser-ttft", "TTFT (this browser)", ms(browserTtftMs)],
    ["total", "Total (gateway)", ms(record.total_s * 1000)],
    [
      "tokens",
      "Tokens in / out",
      record.prompt_tokens === null
        ? "–"
        : `${num(record.prompt_tokens)} / ${num(record.completion_tokens)}${record.cached_tokens === null ? "" : ` (${num(record.cached_tokens)} cached)`}`,
    ],
    ["billed", "Billed to the key", `${num(billed)} tokens`],
    ["budget", "Budget", budgetText(data, record.key_id)],
  ];
}

async function send(form, act) {
  const value = (name) => form.elements[name].value.trim();
  const model = value("adapter") ? `${value("model")}:${value("adapter")}` : value("model");
  const body = { model, messages: [{ role: "user", content: value("prompt") }], stream: true };
  if (value("max_tokens")) body.max_tokens = Number(value("max_tokens"));
  const answer = document.getElementById("pg-answer");
  answer.textContent = "";
  showError("");
  showFacts([]);
  const button = form.querySelector("button[type=submit]");
  button.disabled = true;
  const before = act.latest();
  const started = performance.now();
  let browserTtft = null;
  try {
    const response = await api.playgroundChat(form.elements.key.value.trim(), body);
    const requestId = response.headers.get("x-request-id");
    if (!response.ok) {
      showError(await errorMessage(response));
    } else {
      await readStream(response, (event) => {
        if (event.error) {
          showError(event.error.message ?? "The stream ended with an error.");
          return;
        }
        const text = event.choices?.[0]?.delta?.content;
        if (!text) return;
        if (browserTtft === null) browserTtft = performance.now() - started;
        answer.textContent += text;
      });
    }
    if (requestId) {
      const record = await logged(requestId);
      const billed = (record?.prompt_tokens ?? 0) + (record?.completion_tokens ?? 0);
      const data = record ? await withUsage(before, record, billed, act) : before;
      showFacts(requestFacts(record, browserTtft, data));
    }
  } catch (err) {
    showError(`The request failed: ${err.message}`);
  } finally {
    button.disabled = false;
  }
}

export function wirePlayground(act) {
  document.getElementById("pg-model").addEventListener("change", offerAdapters);
  document.getElementById("playground").addEventListener("submit", (event) => {
    event.preventDefault();
    send(event.target, act);
  });
}
