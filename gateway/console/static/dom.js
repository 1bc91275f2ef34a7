// Building the page from data with the DOM: text always goes in as text (never as HTML), so a
// model or key name cannot inject markup, and the strict Content-Security-Policy needs no
// exception. Styling is by class only (no style attributes, which the policy refuses).

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") el.className = value;
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

const SVG = "http://www.w3.org/2000/svg";

export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, String(value));
  append(el, children);
  return el;
}

// A table with a caption (its accessible name) and column headers; `name` marks it (and the
// line said in its place when it has no rows) for whoever looks it up.
export function table(caption, headers, rows, empty = "None.", name = undefined) {
  if (!rows.length) return h("p", { class: "empty", "data-table": name }, `${caption}: ${empty}`);
  return h(
    "table",
    { "data-table": name },
    h("caption", {}, caption),
    h("thead", {}, h("tr", {}, headers.map((text) => h("th", { scope: "col" }, text)))),
    h("tbody", {}, rows.map((cells) => h("tr", {}, cells.map((cell) => h("td", {}, cell))))),
  );
}

export function num(value, digits = 0) {
  if (value === null || value === undefined) return "–";
  return Number(value).toLocaleString("en", { maximumFractionDigits: digits });
}

// Bytes as the fetches' progress words them: decimal kB, MB, GB.
export function bytes(value) {
  if (value === null || value === undefined) return "–";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let n = Number(value);
  let unit = 0;
  while (n >= 1000 && unit < units.length - 1) {
    n /= 1000;
    unit += 1;
  }
  return `${n.toLocaleString("en", { maximumFractionDigits: unit ? 2 : 0 })} ${units[unit]}`;
}

// A share as a native <meter>, with its figure beside it for everyone.
export function meter(label, value, max, text) {
  if (value === null || value === undefined || !max) return h("span", {}, "–");
  return h(
    "span",
    { class: "with-meter" },
    h("meter", { min: 0, max, value, "aria-label": label }),
    h("span", {}, text),
  );
}

export function badge(state) {
  const kind = String(state).split(/[ :(]/)[0];
  return h("span", { class: `badge state-${kind}` }, state);
}

// A link to a workflow in the Temporal web UI, when the gateway knows where it runs.
export function workflowLink(cluster, workflowId, label = "workflow") {
  if (!cluster?.temporal_ui || !workflowId) return h("span", { class: "muted" }, "–");
  const ns = encodeURIComponent(cluster.namespace || "default");
  const href = `${cluster.temporal_ui}/namespaces/${ns}/workflows/${encodeURIComponent(workflowId)}`;
  return h(
    "a",
    { href, target: "_blank", rel: "noopener noreferrer", "aria-label": `${label}: ${workflowId} in the Temporal UI` },
    label,
  );
}

// A button whose focus survives the page being drawn again (live updates replace the DOM).
export function actionButton(key, text, label, onclick) {
  return h("button", { type: "button", "data-key": key, "aria-label": label, onclick }, text);
}

// Draw a region again, keeping what the operator had there: the focused control and the
// disclosures they opened (both found again by their data-key).
export function replaceChildren(id, ...children) {
  const el = document.getElementById(id);
  const focused = document.activeElement?.closest?.(`#${id}`) ? document.activeElement : null;
  const key = focused?.getAttribute("data-key");
  const opened = [...el.querySelectorAll("details[open][data-key]")].map((d) => d.getAttribute("data-key"));
  el.replaceChildren(...children.flat(Infinity).filter(Boolean));
  for (const k of opened) {
    const details = el.querySelector(`details[data-key="${CSS.escape(k)}"]`);
    if (details) details.open = true;
  }
  if (key) el.querySelector(`[data-key="${CSS.escape(key)}"]`)?.focus();
}
