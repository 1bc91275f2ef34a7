// The gateway's memory of its requests: the Requests page (the last requests, with filters;
// GET /admin/v1/requests) and the Charts page (per model or key over the last hour; GET
// /admin/v1/series). Each page's data is read on the console's poll while the page shows
// (`pageData`), with the filters and the choice kept here between draws.

import * as api from "./api.js";
import { h, num, table } from "./dom.js";
import { lineChart } from "./line_chart.js";

const filters = { model: "", key: "", status: "", replica: "", min_ttft_ms: "" };
const chosen = { series: "", minutes: "60" };

// A page's answer, marked with the page: drawn right after a change of page, the data still
// is the other page's.
async function settled(page, promise) {
  try {
    return { page, answer: await promise };
  } catch (err) {
    return { page, error: err.message };
  }
}

// What each of these pages reads on a poll, beside the console's own data.
export const pageData = {
  requests: () => settled("requests", api.readRequests({ ...filters, limit: 200 })),
  charts: () => {
    const [kind, name] = chosen.series ? chosen.series.split(":", 2) : ["", ""];
    return settled("charts", api.readSeries({ [kind]: name, minutes: chosen.minutes }));
  },
};

function select(id, label, value, options, data) {
  return h(
    "label",
    {},
    label,
    h(
      "select",
      { id, name: id, "data-key": id, ...data },
      options.map(([v, text]) => h("option", { value: v, selected: v === value }, text)),
    ),
  );
}

const ms = (seconds) => (seconds === null || seconds === undefined ? "–" : `${num(seconds * 1000)} ms`);
const time = (epoch) => new Date(epoch * 1000).toLocaleTimeString("en-GB");

function filterForm(answer, act) {
  // A choice from a list applies at once; the TTFT figure when the form is sent.
  const chosenNow = {
    onchange: (event) => {
      filters[event.target.name] = event.target.value;
      act.refresh();
    },
  };
  const pick = (list, current) => [["", "any"], ...[...new Set([...list, current].filter(Boolean))].map((v) => [v, v])];
  return h(
    "form",
    {
      id: "request-filters",
      class: "panel filters",
      "aria-label": "Filter the requests",
      onsubmit: (event) => {
        event.preventDefault();
        const form = event.target.elements;
        for (const name of Object.keys(filters)) filters[name] = form[name].value.trim();
        act.refresh();
      },
    },
    h(
      "div",
      { class: "fields" },
      select("model", "Model", filters.model, pick(answer?.models ?? [], filters.model), chosenNow),
      select("key", "Key", filters.key, pick(answer?.keys ?? [], filters.key), chosenNow),
      select("status", "Status", filters.status, [["", "any"], ["2xx", "2xx"], ["4xx", "4xx"], ["5xx", "5xx"]], chosenNow),
      select("replica", "Replica", filters.replica, pick(answer?.replicas ?? [], filters.replica), chosenNow),
      h("label", {}, "TTFT at least (ms)",
        h("input", { id: "min_ttft_ms", name: "min_ttft_ms", type: "number", min: 0, value: filters.min_ttft_ms, "data-key": "min_ttft_ms" })),
    ),
    h("button", { type: "submit", "data-key": "filter" }, "Filter"),
  );
}

export function requests(data, act) {
  const read = data.page?.page === "requests" ? data.page : null;
  if (read?.error) return [filterForm(null, act), h("p", { class: "empty" }, `The request log: ${read.error}`)];
  const answer = read?.answer;
  if (!answer) return h("p", { class: "empty" }, "Loading…");
  const rows = answer.data.map((r) => [
    time(r.started_at),
    h("code", {}, r.request_id),
    r.key_name ?? "–",
    r.adapter ? `${r.model} (${r.adapter})` : (r.model ?? "–"),
    r.replica ? `${r.replica} on ${r.node}` : "–",
    r.reason ? `${r.reason}, ${r.routing_state}` : "–",
    h("span", { class: r.status >= 400 && r.status !== 499 ? "bad" : "" }, r.error_code ? `${r.status} ${r.error_code}` : String(r.status)),
    r.stream ? ms(r.ttft_s) : "not streamed",
    ms(r.total_s),
    r.prompt_tokens === null ? "–" : `${num(r.prompt_tokens)} / ${num(r.completion_tokens)}${r.cached_tokens === null ? "" : ` (${num(r.cached_tokens)} cached)`}`,
    r.prompt === null ? h("span", { class: "muted" }, "not kept") : h("details", { "data-key": `prompt:${r.request_id}` }, h("summary", {}, "prompt"), h("pre", { class: "prompt" }, r.prompt)),
  ]);
  return [
    filterForm(answer, act),
    h("p", { class: "hint" }, `The newest ${num(answer.data.length)} matching of the ${num(answer.held)} requests this gateway process holds (it keeps the last ${num(answer.size)}).`),
    table(
      "Requests, newest first",
      ["Started", "Request id", "Key", "Model", "Replica", "Routing", "Status", "TTFT", "Total", "Tokens in / out", "Prompt"],
      rows,
      "none match.",
      "requests",
    ),
  ];
}

// The figures the Charts page draws, one chart each.
const FIGURES = [
  { name: "requests", title: "Requests a second", unit: "req/s", lines: [["requests_per_s", "requests", "c0"]] },
  { name: "ttft", title: "Time to first token (streams)", unit: "ms", lines: [["ttft_p50_ms", "p50", "c0"], ["ttft_p99_ms", "p99", "c1"]] },
  { name: "tokens", title: "Tokens a second", unit: "tok/s", lines: [["prompt_tokens_per_s", "prompt", "c0"], ["completion_tokens_per_s", "completion", "c1"]] },
  { name: "cached", title: "Cached share of prompt tokens", unit: "%", lines: [["cached_share", "cached", "c0"]], scale: (v) => v * 100 },
  { name: "errors", title: "Errors a second (4xx and 5xx, not client-closed)", unit: "err/s", lines: [["errors_per_s", "errors", "c1"]] },
  { name: "queue", title: "Fair queue depth", unit: "requests", lines: [["queue_depth", "waiting", "c0"]] },
];

function seriesPicker(answer, act) {
  const options = [
    ["", "All requests"],
    ...(answer?.models ?? []).map((m) => [`model:${m}`, `Model: ${m}`]),
    ...(answer?.keys ?? []).map((k) => [`key:${k}`, `Key: ${k}`]),
  ];
  const change = (event) => {
    chosen[event.target.name] = event.target.value;
    act.refresh();
  };
  return h(
    "form",
    { id: "chart-choice", class: "panel filters", "aria-label": "Which series", onsubmit: (event) => event.preventDefault() },
    h(
      "div",
      { class: "fields" },
      select("series", "Series", chosen.series, options, { onchange: change }),
      select("minutes", "Range", chosen.minutes, [["15", "last 15 minutes"], ["60", "last hour"]], { onchange: change }),
    ),
  );
}

export function charts(data, act) {
  const read = data.page?.page === "charts" ? data.page : null;
  if (read?.error) return [seriesPicker(null, act), h("p", { class: "empty" }, `The charts: ${read.error}`)];
  const answer = read?.answer;
  if (!answer) return h("p", { class: "empty" }, "Loading…");
  const columns = answer.series;
  return [
    seriesPicker(answer, act),
    h("p", { class: "hint" }, "Kept in this gateway process's memory for the last hour (each process of a gateway started with --workers keeps its own)."),
    h(
      "div",
      { class: "chart-grid" },
      FIGURES.map((figure) =>
        lineChart({
          name: figure.name,
          title: figure.title,
          unit: figure.unit,
          times: columns.t,
          bucketS: answer.bucket_s,
          scale: figure.scale,
          lines: figure.lines.map(([column, name, cls]) => ({ name, values: columns[column], cls })),
        }),
      ),
    ),
  ];
}
