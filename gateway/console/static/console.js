// The console's main module: which page shows (the URL's #fragment), polling the admin API for
// fresh data and drawing the page shown, and the commands, each answered in a status line that
// screen readers announce.

import * as api from "./api.js";
import { nodes, nvlink, overview } from "./cluster_pages.js";
import { installs, models } from "./fleet_pages.js";
import { keys, routing } from "./gateway_pages.js";
import { mirror } from "./mirror_page.js";
import { node } from "./node_page.js";
import { charts, pageData as observeData, requests } from "./observe_pages.js";
import { playground, playgroundData, wirePlayground } from "./playground_page.js";
import { replaceChildren } from "./dom.js";

const POLL_MS = 2000;
const PAGES = { overview, nodes, nvlink, models, installs, mirror, keys, routing, node, requests, charts, playground };
// The pages that read data of their own on each poll, beside the console's.
const pageData = { ...observeData, playground: playgroundData };
let latest = null;
let drawn = "";

function currentPage() {
  const name = location.hash.slice(1);
  // #node-NAME: one node's own page.
  if (name.startsWith("node-")) return "node";
  return name in PAGES ? name : "overview";
}

function say(text, isError = false) {
  const el = document.getElementById("said");
  el.textContent = text;
  el.classList.toggle("error", isError);
}

async function run(what, promise) {
  try {
    const answer = await promise;
    say(answer?.result ?? what);
    await poll();
    return answer;
  } catch (err) {
    say(`${what} failed: ${err.message}`, true);
    return null;
  }
}

const act = {
  node(name, action) {
    if (action === "drain" && !window.confirm(`Drain node ${name}? Its replicas move elsewhere, each after its successor serves.`)) return;
    run(`${action} ${name}`, api.nodeCommand(name, action, "from the web console"));
  },
  scale(model, replicas) {
    run(`scale ${model} to ${replicas}`, api.scaleModel(model, replicas));
  },
  revoke(name) {
    if (!window.confirm(`Revoke key ${name}? Requests with it are refused at once.`)) return;
    run(`key ${name} revoked`, api.revokeKey(name));
  },
  setLimits(name, limits) {
    run(`limits of ${name} set`, api.setLimits(name, limits));
  },
  importOllama(request) {
    return run(`import of ${request.reference}`, api.importOllama(request));
  },
  // A page's own filters changed: read its data again now, and draw it though the operator's
  // focus is still on the filter they changed.
  async refresh() {
    await poll();
    draw(true);
    return latest;
  },
  latest: () => latest,
};

// The routing table's age changes on every poll; it alone is no reason to draw again.
const volatile = (key, value) => (key === "routes_age_s" ? undefined : value);

function typingIn(regionId) {
  const el = document.activeElement;
  return el && el.matches("input, textarea, select") && el.closest(`#${regionId}`);
}

function draw(force = false) {
  if (!latest) return;
  const page = currentPage();
  const region = `${page}-data`;
  const signature = location.hash + JSON.stringify(latest, volatile);
  if (!force && signature === drawn) return;
  // Never replace a field the operator is typing in: drawn once they leave it.
  if (!force && typingIn(region)) return;
  drawn = signature;
  replaceChildren(region, PAGES[page](latest, act));
  const cluster = latest.cluster;
  const problems = cluster?.problems ?? [];
  const box = document.getElementById("problems");
  box.hidden = !problems.length;
  box.replaceChildren(...problems.map((p) => Object.assign(document.createElement("p"), { textContent: p })));
}

async function poll() {
  try {
    const page = currentPage();
    // The pages with data of their own (the request log, the charts) read it beside.
    const [data, own] = await Promise.all([api.readConsole(), pageData[page]?.()]);
    latest = { ...data, page: own ?? null };
    document.getElementById("freshness").textContent = `Updated ${new Date().toLocaleTimeString()}`;
    draw();
  } catch (err) {
    document.getElementById("freshness").textContent = `Not updated: ${err.message}`;
  }
}

function showPage() {
  const page = currentPage();
  for (const section of document.querySelectorAll("main > section")) {
    section.hidden = section.dataset.page !== page;
  }
  for (const link of document.querySelectorAll("nav a")) {
    // A node's page is reached from the nodes list: that entry stays current.
    if (link.dataset.page === (page === "node" ? "nodes" : page)) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  draw(true);
}

function keyForm(form) {
  const value = (name) => form.elements[name].value.trim();
  const number = (name) => (value(name) ? Number(value(name)) : null);
  const limits = {};
  for (const name of ["rpm", "tpm", "token_budget"]) if (number(name) !== null) limits[name] = number(name);
  const request = { name: value("name"), limits };
  const models = value("models").split(",").map((m) => m.trim()).filter(Boolean);
  if (models.length) request.models = models;
  if (form.elements.admin.checked) request.admin = true;
  return request;
}

function wireForms() {
  document.getElementById("create-key").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = event.target;
    const answer = await run("key created", api.createKey(keyForm(form)));
    if (answer) {
      document.getElementById("new-key-value").textContent = answer.api_key;
      document.getElementById("new-key").hidden = false;
      say(`key ${answer.key.name} created; copy it now, it is not shown again`);
      form.reset();
    }
  });
  document.getElementById("import-ollama").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = event.target;
    const request = {
      reference: form.elements.reference.value.trim(),
      name: form.elements.name.value.trim(),
      mirror: form.elements.mirror.checked,
    };
    if (await act.importOllama(request)) form.reset();
  });
  document.getElementById("add-model").addEventListener("submit", async (event) => {
    event.preventDefault();
    let spec;
    try {
      spec = JSON.parse(document.getElementById("model-spec").value);
    } catch (err) {
      say(`The definition is not JSON: ${err.message}`, true);
      return;
    }
    const answer = await run("model added", api.putModel(spec));
    if (answer) say(`model ${answer.spec.name} defined: ${answer.spec.replicas} replica(s) wanted`);
  });
}

if (api.CSRF) {
  // Only the remote console has a session to end.
  const logout = document.getElementById("logout");
  logout.hidden = false;
  logout.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      await api.logout();
    } finally {
      location.assign(api.LOGIN);
    }
  });
}
document.getElementById("main").addEventListener("focusout", () => setTimeout(draw, 0));
window.addEventListener("hashchange", () => {
  say("");  // an answer belongs to the page it was given on
  showPage();
  if (currentPage() in pageData) poll();
  const target = document.getElementById(decodeURIComponent(location.hash.slice(1)));
  (target && target.tagName === "H3" ? target : document.getElementById("main")).focus();
});
wireForms();
wirePlayground(act);
showPage();
poll();
setInterval(poll, POLL_MS);
