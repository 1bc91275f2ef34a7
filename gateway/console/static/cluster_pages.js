// The cluster's pages: the overview, the nodes with their GPUs, and the NVLink domains (each
// tray with its fabric and IMEX state). One node's own page is node_page.js.

import { actionButton, badge, h, meter, num, table, workflowLink } from "./dom.js";

export function overview(data) {
  const cluster = data.cluster;
  const gw = data.gateway;
  const cards = [];
  if (cluster) {
    const gpus = cluster.nodes.flatMap((n) => n.gpus);
    const busy = gpus.filter((g) => g.replica).length;
    const ready = cluster.replicas.filter((r) => r.state === "ready").length;
    const placeable = cluster.nodes.filter((n) => !n.why_not_placeable.length).length;
    cards.push(
      card("Nodes", `${cluster.nodes.length}`, `${placeable} placeable`),
      card("GPUs", `${gpus.length}`, `${busy} allocated`),
      card("Replicas", `${cluster.replicas.length}`, `${ready} ready`),
      card("Models", `${cluster.models.length}`, `${cluster.fetches.length} fetch(es) running`),
    );
  }
  cards.push(
    card("Keys", `${gw.keys.filter((k) => !k.revoked_at).length}`, "active"),
    card("In flight", num(gw.in_flight), `routing table v${gw.routes_version}`),
  );
  const out = [h("ul", { class: "cards", "aria-label": "Cluster figures" }, cards)];
  if (!cluster) {
    out.push(h("p", { class: "empty" }, "This gateway was started without a view of the cluster."));
    return out;
  }
  out.push(
    table(
      "Replicas",
      ["Replica", "Model", "State", "Node(s)", "Engine", "Running", "Waiting", "Detail", "Temporal"],
      cluster.replicas.map((r) => [
        r.replica_id,
        r.model,
        badge(r.state),
        r.nodes.join(", "),
        r.engine,
        num(r.running),
        num(r.waiting),
        r.detail,
        workflowLink(cluster, r.workflow_id),
      ]),
      "no replica yet",
    ),
  );
  return out;
}

function card(title, figure, note) {
  return h(
    "li",
    { class: "card" },
    h("span", { class: "card-title" }, title),
    h("span", { class: "card-figure" }, figure),
    h("span", { class: "card-note" }, note),
  );
}

export function gpuRows(node) {
  return node.gpus.map((g) => {
    const used = g.memory_used_mb;
    const memory = used === null ? `${num(g.memory_mb)} MB` : `${num(used)} / ${num(g.memory_mb)} MB`;
    const power = g.power_w === null ? "–" : `${num(g.power_w)} / ${num(g.power_limit_w)} W`;
    return [
      g.parent === null ? String(g.index) : `${g.index} (card ${g.parent})`,
      g.gpu_class,
      g.mig_profile ? `MIG ${g.mig_profile}` : "–",
      meter(`GPU ${g.index} memory`, used, g.memory_mb, memory),
      meter(`GPU ${g.index} utilisation`, g.utilization_pct, 100, g.utilization_pct === null ? "–" : `${num(g.utilization_pct)}%`),
      g.temperature_c === null ? "–" : `${num(g.temperature_c)} °C`,
      power,
      g.replica || "free",
      [g.unusable && `unusable: ${g.unusable}`, g.warning].filter(Boolean).join("; ") || "",
    ];
  });
}

export function nodeActions(node, act) {
  return h(
    "div",
    { class: "actions", role: "group", "aria-label": `Commands for node ${node.name}` },
    node.cordoned
      ? actionButton(`uncordon:${node.name}`, "Uncordon", `Uncordon node ${node.name}`, () => act.node(node.name, "uncordon"))
      : actionButton(`cordon:${node.name}`, "Cordon", `Cordon node ${node.name}`, () => act.node(node.name, "cordon")),
    actionButton(`drain:${node.name}`, "Drain", `Drain node ${node.name}`, () => act.node(node.name, "drain")),
  );
}

function meanUse(node) {
  const figures = node.gpus.map((g) => g.utilization_pct).filter((u) => u !== null);
  if (!figures.length) return "–";
  return `${num(figures.reduce((a, b) => a + b, 0) / figures.length)}%`;
}

export function nodeState(node) {
  const flags = [node.cordoned && (node.draining ? "draining" : "cordoned")].filter(Boolean);
  return [badge(node.state), flags.map((f) => [" ", badge(f)])];
}

export function nodes(data, act) {
  const cluster = data.cluster;
  if (!cluster) return [h("p", { class: "empty" }, "No view of the cluster.")];
  if (!cluster.nodes.length) return [h("p", { class: "empty" }, "No node has joined yet.")];
  const summary = table(
    "All nodes",
    ["Node", "State", "CPU cores", "Memory", "GPUs", "GPU use now", "Placeable", "Commands"],
    cluster.nodes.map((node) => [
      nodeLink(node.name),
      nodeState(node),
      num(node.cpu_cores),
      `${num(node.memory_mb)} MB`,
      node.gpu_summary,
      meanUse(node),
      node.why_not_placeable.length ? "no" : "yes",
      nodeActions(node, act),
    ]),
  );
  const details = cluster.nodes.map((node) =>
    h(
      "article",
      { class: "node", "aria-labelledby": `nodes-${node.name}`, "data-node": node.name },
      h("h3", { id: `nodes-${node.name}` }, nodeLink(node.name, "more:"), " ", nodeState(node)),
      h(
        "dl",
        { class: "facts" },
        fact("Address", node.address),
        fact("CPU", `${node.cpu_cores} cores${node.cpu_model ? `, ${node.cpu_model}` : ""}`, "cpu"),
        fact("Memory", `${num(node.memory_mb)} MB`, "memory"),
        fact("GPUs", node.gpu_summary),
        fact("Engines", node.engines.map((e) => `${e.engine} ${e.version}: ${e.state}`).join("; ") || "none"),
        fact("Replicas", node.replicas.join(", ") || "none"),
        fact("Placeable", node.why_not_placeable.length ? "no" : "yes", "placeable"),
        node.note ? fact("Note", node.note) : null,
        fact("Temporal", workflowLink(cluster, node.workflow_id)),
      ),
      node.why_not_placeable.length
        ? h(
            "div",
            { class: "why" },
            h("p", {}, "Not placeable because:"),
            h("ul", {}, node.why_not_placeable.map((w) => h("li", {}, w))),
          )
        : null,
      node.telemetry_problem ? h("p", { class: "warn" }, `No GPU figures: ${node.telemetry_problem}`) : null,
      node.gpus.length
        ? table(`GPUs of ${node.name}`, ["GPU", "Class", "MIG", "Memory", "Utilisation", "Temperature", "Power", "Replica", "Warnings"], gpuRows(node))
        : null,
    ),
  );
  return [summary, ...details];
}

// A link to the node's own page (node_page.js), keeping its focus across live updates.
export function nodeLink(name, key = "goto:") {
  return h("a", { href: `#node-${encodeURIComponent(name)}`, "data-key": `${key}${name}` }, name);
}

export function fact(term, value, name) {
  return [h("dt", {}, term), h("dd", { "data-fact": name }, value)];
}

export function nvlink(data) {
  const cluster = data.cluster;
  if (!cluster) return [h("p", { class: "empty" }, "No view of the cluster.")];
  if (!cluster.domains.length) {
    return [h("p", { class: "empty" }, "No node reports an NVLink domain (multi-node NVLink fabric).")];
  }
  return cluster.domains.map((domain, d) => {
    const colour = new Map(domain.replicas.map((r, i) => [r, i % 8]));
    const spans = domain.replicas.map((r) => {
      const trays = domain.trays.filter((t) => t.gpus.some((g) => g.replica === r)).map((t) => t.node);
      return h("li", {}, h("span", { class: `swatch r${colour.get(r)}`, "aria-hidden": "true" }), `${r}: ${trays.length} tray(s), ${trays.join(", ")}`);
    });
    return h(
      "figure",
      { class: "domain", "aria-labelledby": `domain-${d}` },
      h("figcaption", { id: `domain-${d}` }, `Domain ${domain.domain}: ${domain.trays.length} tray(s), ${domain.trays.reduce((n, t) => n + t.gpus.length, 0)} GPUs`),
      h(
        "div",
        { class: "domain-body" },
      h(
        "ol",
        { class: "rack", "aria-label": `Trays of domain ${domain.domain}` },
        domain.trays.map((tray) =>
          h(
            "li",
            { class: "tray" },
            h("span", { class: "tray-name" }, tray.node),
            trayFabric(tray),
            h(
              "ul",
              { class: "tray-gpus", "aria-label": `GPUs of ${tray.node}` },
              tray.gpus.map((g) =>
                h(
                  "li",
                  {
                    class: `gpu-cell ${g.replica ? `r${colour.get(g.replica)}` : "free"}${g.unusable ? " unusable" : ""}`,
                    title: `${tray.node} GPU ${g.index}: ${g.replica || "free"}`,
                  },
                  h("span", { class: "sr-only" }, `GPU ${g.index}: ${g.replica || "free"}${g.unusable ? `, unusable: ${g.unusable}` : ""}`),
                ),
              ),
            ),
          ),
        ),
      ),
      h("ul", { class: "legend", "aria-label": "Replicas spanning this domain" }, spans.length ? spans : h("li", {}, "No replica here.")),
      ),
    );
  });
}

// A tray's NVLink fabric and IMEX state, in words (the colour only repeats them).
export function fabricWords(fabric) {
  if (!fabric) return "no fabric reported";
  const parts = [];
  if (fabric.state === "not joined") parts.push(`not joined (GPU ${fabric.not_joined.join(", ")})`);
  else if (fabric.state === "degraded") parts.push(`degraded (GPU ${fabric.degraded.join(", ")})`);
  else if (fabric.state) parts.push("joined");
  if (fabric.imex_up === true) parts.push(`IMEX up, ${fabric.imex_channels ?? 0} channel(s)`);
  else if (fabric.imex_up === false) parts.push("IMEX down");
  return parts.join(" · ");
}

function fabricKind(fabric) {
  if (!fabric) return "unknown";
  if (fabric.state === "not joined" || fabric.imex_up === false) return "bad";
  return fabric.state === "degraded" ? "degraded" : "ok";
}

function trayFabric(tray) {
  return h(
    "span",
    { class: `tray-fabric fabric-${fabricKind(tray.fabric)}`, "data-fabric": tray.node },
    fabricWords(tray.fabric),
  );
}
