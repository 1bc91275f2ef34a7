// The mirror page: what the control plane's content-addressed mirror holds (each name, its
// artifact's size and files, the models using it, the nodes holding it or fetching it), the
// imports from Ollama started here with their progress, and the weight fetches running. The
// import form itself is in index.html (wired in console.js).

import { badge, bytes, h, num, table, workflowLink } from "./dom.js";

function progress(label, done, total, words) {
  if (!total) return words || "–";
  return h(
    "span",
    { class: "with-meter" },
    h("progress", { max: total, value: done, "aria-label": label }),
    h("span", {}, words),
  );
}

function importRows(imports) {
  return imports.map((i) => {
    const share = i.total ? Math.floor((100 * i.done) / i.total) : 0;
    const words = `${bytes(i.done)} of ${bytes(i.total)} (${share}%)${i.file ? `, ${i.file}` : ""}`;
    return [
      i.reference,
      i.model,
      badge(i.state),
      progress(`Import of ${i.reference}`, i.done, i.total, words),
      i.mirror ? "models directory and mirror" : "models directory",
      i.detail,
    ];
  });
}

function artifactRows(artifacts) {
  return artifacts.map((a) => [
    a.name,
    h("code", { title: a.digest }, a.digest.slice(0, "sha256:".length + 16)),
    a.problem ? h("span", { class: "warn" }, a.problem) : bytes(a.size),
    a.files.length > 3 ? `${a.files.slice(0, 3).join(", ")} and ${a.files.length - 3} more` : a.files.join(", "),
    a.source,
    a.models.join(", ") || h("span", { class: "muted" }, "no model"),
    a.held_on.join(", ") || h("span", { class: "muted" }, "no node yet"),
    a.fetching_on.join(", ") || "–",
  ]);
}

function fetchRows(cluster) {
  return cluster.fetches.map((f) => [
    f.node,
    f.model,
    f.artifact,
    badge(f.state),
    progress(`Fetch of ${f.model} on ${f.node}`, f.done, f.total, f.progress),
    f.detail,
    workflowLink(cluster, f.workflow_id),
  ]);
}

export function mirror(data) {
  const cluster = data.cluster;
  if (!cluster) return [h("p", { class: "empty" }, "No view of the cluster.")];
  const held = cluster.mirror;
  const out = [];
  out.push(
    table("Imports from Ollama", ["Ollama model", "llmgw model", "State", "Progress", "Into", "Detail"], importRows(cluster.imports), "none started here", "imports"),
  );
  if (!held.here) {
    out.push(
      h("p", { class: "empty", "data-table": "mirror" }, "The mirror is not on this gateway's machine: it is read from the state dir where `llmgw mirror serve` runs."),
    );
  } else {
    out.push(
      table(
        `The mirror: ${num(held.artifacts.length)} name(s), ${bytes(held.stored)} stored`,
        ["Name", "Artifact", "Size", "Files", "Source", "Used by", "Held on", "Fetching on"],
        artifactRows(held.artifacts),
        "empty (llmgw mirror add SOURCE, or import from Ollama above)",
        "mirror",
      ),
    );
  }
  out.push(
    table("Weight fetches running", ["Node", "Model", "Artifact", "State", "Progress", "Detail", "Temporal"], fetchRows(cluster), "none running", "fetches"),
  );
  return out;
}
