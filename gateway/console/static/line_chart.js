// A line chart as inline SVG, drawn from the series the gateway keeps (GET /admin/v1/series):
// no library, nothing fetched. One chart per figure: its title and unit in the caption, the
// time range on the x axis (clock times, local), the unit on the y axis, a legend for each
// line, and a text summary as the image's accessible name.

import { h, svg } from "./dom.js";

const WIDTH = 640;
const HEIGHT = 220;
const LEFT = 56;
const RIGHT = 12;
const TOP = 24;
const BOTTOM = 40;

const clock = (seconds) =>
  new Date(seconds * 1000).toLocaleTimeString("en-GB", { hour: "2-digit", minute: "2-digit" });

// A round top for the y axis: 1, 2 or 5 times a power of ten, at least the highest value.
export function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) if (step * power >= value) return step * power;
  return 10 * power;
}

function numberText(value) {
  const digits = Math.abs(value) >= 100 ? 0 : Math.abs(value) >= 10 ? 1 : 2;
  return Number(value).toLocaleString("en", { maximumFractionDigits: digits });
}

function figureText(value, unit) {
  if (value === null || value === undefined) return "–";
  return `${numberText(value)} ${unit}`;
}

// A bucket with a value and none on either side: a dot, since a line needs two.
function dotsOf(times, values, x, y, cls) {
  const has = (i) => values[i] !== null && values[i] !== undefined;
  const dots = [];
  values.forEach((value, i) => {
    if (has(i) && !has(i - 1) && !has(i + 1)) {
      dots.push(svg("circle", { cx: x(times[i]).toFixed(1), cy: y(value).toFixed(1), r: 2.5, class: `dot ${cls}` }));
    }
  });
  return dots;
}

// The line's path: a segment per run of buckets that have a value (null breaks the line).
function pathOf(times, values, x, y) {
  let d = "";
  let pen = false;
  values.forEach((value, i) => {
    if (value === null || value === undefined) {
      pen = false;
      return;
    }
    d += `${pen ? "L" : "M"}${x(times[i]).toFixed(1)},${y(value).toFixed(1)}`;
    pen = true;
  });
  return d;
}

// `lines`: [{ name, values, cls }], each value per time in `times` (a bucket's start, epoch
// seconds); `scale` turns a value into what is drawn (a share into a percentage).
export function lineChart({ name, title, unit, times, bucketS, lines, scale = (v) => v }) {
  const scaled = lines.map((line) => ({
    ...line,
    values: line.values.map((v) => (v === null || v === undefined ? null : scale(v))),
  }));
  const all = scaled.flatMap((line) => line.values).filter((v) => v !== null);
  const top = niceMax(Math.max(0, ...all));
  const start = times[0];
  const end = times[times.length - 1] + bucketS;
  const x = (t) => LEFT + ((t - start) / (end - start)) * (WIDTH - LEFT - RIGHT);
  const y = (v) => TOP + (1 - v / top) * (HEIGHT - TOP - BOTTOM);
  const latest = scaled.map((line) => {
    const last = [...line.values].reverse().find((v) => v !== null);
    return `${line.name} ${figureText(last ?? null, unit)}`;
  });
  const minutes = Math.round((end - start) / 60);
  const summary = `${title}, ${clock(start)} to ${clock(end)}: ${all.length ? `latest ${latest.join(", ")}, highest ${figureText(Math.max(...all), unit)}` : "no data"}`;
  const chart = svg("svg", {
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    class: "line-chart",
    role: "img",
    "aria-label": summary,
    "data-chart": name,
  });
  // The y axis: its unit above it, then 0, half and the top.
  chart.append(svg("text", { x: LEFT, y: TOP - 10, class: "axis unit", "text-anchor": "middle" }, unit));
  for (const v of [0, top / 2, top]) {
    chart.append(svg("line", { x1: LEFT, x2: WIDTH - RIGHT, y1: y(v), y2: y(v), class: "grid" }));
    chart.append(svg("text", { x: LEFT - 6, y: y(v) + 4, class: "axis", "text-anchor": "end" }, numberText(v)));
  }
  // The x axis: five clock times over the range, and what the range is.
  for (let i = 0; i <= 4; i += 1) {
    const t = start + ((end - start) * i) / 4;
    const anchor = i === 0 ? "start" : i === 4 ? "end" : "middle";
    chart.append(svg("line", { x1: x(t), x2: x(t), y1: HEIGHT - BOTTOM, y2: HEIGHT - BOTTOM + 4, class: "tick" }));
    chart.append(svg("text", { x: x(t), y: HEIGHT - BOTTOM + 16, class: "axis", "text-anchor": anchor }, clock(t)));
  }
  chart.append(
    svg("text", { x: (LEFT + WIDTH - RIGHT) / 2, y: HEIGHT - 4, class: "axis", "text-anchor": "middle" },
      `time (local), last ${minutes} min, ${bucketS} s buckets`),
  );
  chart.append(svg("line", { x1: LEFT, x2: LEFT, y1: TOP, y2: HEIGHT - BOTTOM, class: "frame" }));
  chart.append(svg("line", { x1: LEFT, x2: WIDTH - RIGHT, y1: HEIGHT - BOTTOM, y2: HEIGHT - BOTTOM, class: "frame" }));
  for (const line of scaled) {
    chart.append(svg("path", { d: pathOf(times, line.values, x, y), class: `series ${line.cls}` }));
    chart.append(...dotsOf(times, line.values, x, y, line.cls));
  }
  return h(
    "figure",
    { class: "chart-figure", "data-figure": name },
    h("figcaption", {}, h("strong", {}, title), ` (${unit})`),
    chart,
    h(
      "ul",
      { class: "legend" },
      scaled.map((line, i) => h("li", {}, h("span", { class: `swatch ${line.cls}`, "aria-hidden": "true" }), latest[i])),
    ),
  );
}
