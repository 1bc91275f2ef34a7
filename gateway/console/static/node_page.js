// One node's page (#node-NAME, opened from the nodes list): its hardware, its GPUs with their
// telemetry and NVLink fabric, IMEX, its engines and their states, the replicas on it with
// what each reserved against what its engine uses, and the node's commands.

import { fabricWords, fact, gpuRows, nodeActions, nodeState } from "./cluster_pages.js";
import { badge, h, meter, num, table, workflowLink } from "./dom.js";

export function nodeName() {
  return decodeURIComponent(location.hash.slice("#node-".length));
}

function gpuFabric(g) {
  if (g.fabric_joined === null) return "–";
  if (!g.fabric_joined) return "not joined";
  return g.fabric_degraded ? "joined, degraded" : "joined";
}

function hardware(node, cluster) {
  const hw = node.hardware;
  return h(
    "dl",
    { class: "facts", "aria-label": `Hardware of ${node.name}` },
    fact("Address", node.address),
    fact("Host name", hw.hostname || "–"),
    fact("OS", [hw.os, hw.kernel, hw.arch].filter(Boolean).join(", ") || "–", "os"),
    fact("CPU", `${node.cpu_cores} cores${node.cpu_model ? `, ${node.cpu_model}` : ""}`, "cpu"),
    fact("Memory", `${num(node.memory_mb)} MB`, "memory"),
    fact("GPUs", node.gpu_summary),
    fact("NVIDIA driver", hw.nvidia_driver ? `${hw.nvidia_driver} (CUDA ${hw.cuda_version || "?"})` : "none", "driver"),
    fact("Disk free for weights", hw.artifact_disk_free_mb === null ? "not reported" : `${num(hw.artifact_disk_free_mb)} MB`),
    fact("Placeable", node.why_not_placeable.length ? "no" : "yes", "placeable"),
    node.note ? fact("Note", node.note) : null,
    fact("Temporal", workflowLink(cluster, node.workflow_id)),
  );
}

function fabric(node) {
  const f = node.fabric;
  if (!f) return h("p", { class: "muted", "data-part": "fabric" }, "No NVLink fabric or IMEX on this node.");
  const source = f.source === "agent" ? "from its agent's metrics now" : "from its record (its agent's metrics could not be read)";
  return h(
    "p",
    { "data-part": "fabric" },
    "NVLink fabric: ",
    f.state ? badge(f.state) : null,
    " ",
    fabricWords(f),
    h("span", { class: "muted" }, ` (${source})`),
  );
}

function usedOf(used, reserved, label) {
  if (reserved === null) return "–";
  const text = `${used === null ? "?" : num(used)} / ${num(reserved)} MiB`;
  return used === null ? text : meter(label, Math.min(used, reserved), reserved, text);
}

// The shards' rows, each reserved against used; one over its reservation says so in words.
export function resourceRows(rows) {
  return rows.map((r) => [
    r.replica,
    r.node,
    num(r.cores),
    usedOf(r.memory_used_mb, r.memory_reserved_mb, `Memory of ${r.replica} on ${r.node}`),
    usedOf(r.gpu_used_mb, r.gpu_reserved_mb, `GPU memory of ${r.replica} on ${r.node}`),
    r.over.length
      ? h("strong", { class: "over", "data-over": r.replica }, `Over its reservation: ${r.over.join("; ")}`)
      : h("span", { class: "muted" }, r.unmeasured || "within"),
  ]);
}

export const RESOURCE_HEADERS = ["Replica", "Node", "Cores", "Memory used / reserved", "GPU memory used / reserved", "Note"];

export function node(data, act) {
  const cluster = data.cluster;
  if (!cluster) return [h("p", { class: "empty" }, "No view of the cluster.")];
  const name = nodeName();
  const found = cluster.nodes.find((n) => n.name === name);
  const back = h("p", {}, h("a", { href: "#nodes" }, "All nodes"));
  if (!found) return [back, h("p", { class: "empty" }, `No node ${name} in the cluster.`)];
  const states = new Map(cluster.replicas.map((r) => [r.replica_id, r]));
  const resources = cluster.resources.filter((r) => r.node === name);
  const engines = found.engines.map((e) => [
    `${e.engine} ${e.version}`,
    badge(e.state),
    e.progress || e.detail,
    workflowLink(cluster, e.workflow_id),
  ]);
  const replicas = found.replicas.map((id) => {
    const r = states.get(id);
    return [id, r ? r.model : "–", badge(r ? r.state : "starting"), r ? r.nodes.join(", ") : "–", workflowLink(cluster, r?.workflow_id)];
  });
  const gpus = gpuRows(found).map((row, i) => [...row.slice(0, -1), gpuFabric(found.gpus[i]), row.at(-1)]);
  return [
    back,
    h(
      "article",
      { class: "node", "aria-labelledby": `node-${name}`, "data-node-page": name },
      h("h3", { id: `node-${name}`, tabindex: "-1" }, name, " ", nodeState(found)),
      nodeActions(found, act),
      hardware(found, cluster),
      found.hardware.problems.length
        ? h("div", { class: "why" }, h("p", {}, "Discovery could not read:"), h("ul", {}, found.hardware.problems.map((p) => h("li", {}, p))))
        : null,
      found.why_not_placeable.length
        ? h("div", { class: "why" }, h("p", {}, "Not placeable because:"), h("ul", {}, found.why_not_placeable.map((w) => h("li", {}, w))))
        : null,
      fabric(found),
      found.telemetry_problem ? h("p", { class: "warn" }, `No GPU figures: ${found.telemetry_problem}`) : null,
      found.gpus.length
        ? table(`GPUs of ${name}`, ["GPU", "Class", "MIG", "Memory", "Utilisation", "Temperature", "Power", "Replica", "NVLink fabric", "Warnings"], gpus, "none", "node-gpus")
        : null,
      table(`Engines on ${name}`, ["Engine", "State", "Progress or detail", "Temporal"], engines, "none installed", "node-engines"),
      table(`Replicas on ${name}`, ["Replica", "Model", "State", "Node(s)", "Temporal"], replicas, "none", "node-replicas"),
      table(`Resources of the replicas on ${name}`, RESOURCE_HEADERS, resourceRows(resources), "none placed", "node-resources"),
    ),
  ];
}
