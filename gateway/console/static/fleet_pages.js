// The fleet's pages: models (replicas, states, what each reserved against what it uses, why,
// rolling updates, scale) and the engines' installs with their progress. The weights' fetches
// are on the mirror page (mirror_page.js).

import { badge, h, table, workflowLink } from "./dom.js";
import { RESOURCE_HEADERS, resourceRows } from "./node_page.js";

export function models(data, act) {
  const cluster = data.cluster;
  if (!cluster) return [h("p", { class: "empty" }, "No view of the cluster.")];
  if (!cluster.models.length) return [h("p", { class: "empty" }, "No model is defined yet.")];
  const byId = new Map(cluster.replicas.map((r) => [r.replica_id, r]));
  return cluster.models.map((model) => {
    const id = `model-${model.name}`;
    const inputId = `scale-${model.name}`;
    const rolling = model.stale.length || model.retiring.length;
    const resources = cluster.resources.filter((r) => r.model === model.name);
    const over = resources.filter((r) => r.over.length);
    return h(
      "article",
      { class: "model", "aria-labelledby": id, "data-model": model.name },
      h("h3", { id }, model.name, " ", model.removing ? badge("removing") : null),
      h(
        "p",
        { class: "model-line" },
        `${model.ready} of ${model.wanted} replica(s) ready · `,
        model.profiles.join("; "),
        " · ",
        workflowLink(cluster, model.workflow_id),
      ),
      rolling
        ? h(
            "div",
            { class: "rolling", role: "group", "aria-label": `Rolling update of ${model.name}` },
            h("progress", {
              max: Math.max(model.replicas.length, 1),
              value: model.replicas.length - model.stale.length,
              "aria-label": `Replicas on the current profile of ${model.name}`,
            }),
            ` rolling update: ${model.replicas.length - model.stale.length} of ${model.replicas.length} replica(s) on the current profile`,
            model.retiring.length ? `; kept until their successor serves: ${model.retiring.join(", ")}` : "",
          )
        : null,
      table(
        `Replicas of ${model.name}`,
        ["Replica", "State", "Node(s)", "Detail", "Temporal"],
        model.replicas.map((rid) => {
          const r = byId.get(rid);
          return [rid, badge(r ? r.state : "starting"), r ? r.nodes.join(", ") : "–", r ? r.detail : "", workflowLink(cluster, r?.workflow_id)];
        }),
        "none running",
      ),
      over.length
        ? h(
            "p",
            { class: "over", role: "note", "data-over-model": model.name },
            `Uses more than placement reserved: ${over.map((r) => `${r.replica} on ${r.node}: ${r.over.join("; ")}`).join(" · ")}. Raise the model's memory (or its GPU class) so placement counts what it holds.`,
          )
        : null,
      resources.length
        ? table(`Resources of ${model.name}`, RESOURCE_HEADERS, resourceRows(resources), "none placed", `resources-${model.name}`)
        : null,
      h(
        "details",
        { class: "why", "data-key": `why:${model.name}` },
        h("summary", { "data-key": `why-summary:${model.name}` }, `Why: where ${model.name} could be placed now`),
        h("ul", {}, model.why.map((line) => h("li", {}, line))),
      ),
      h(
        "form",
        {
          class: "scale",
          "aria-label": `Scale ${model.name}`,
          onsubmit: (event) => {
            event.preventDefault();
            act.scale(model.name, Number(event.target.elements.replicas.value));
          },
        },
        h("label", { for: inputId }, `Replicas of ${model.name}`),
        h("input", { id: inputId, name: "replicas", type: "number", min: 0, max: 10000, value: model.wanted, required: true, "data-key": inputId }),
        h("button", { type: "submit", "data-key": `scale:${model.name}` }, "Scale"),
      ),
    );
  });
}

export function installs(data) {
  const cluster = data.cluster;
  if (!cluster) return [h("p", { class: "empty" }, "No view of the cluster.")];
  const engineRows = cluster.nodes.flatMap((node) =>
    node.engines.map((e) => [
      node.name,
      `${e.engine} ${e.version}`,
      badge(e.state),
      e.progress || e.detail,
      workflowLink(cluster, e.workflow_id),
    ]),
  );
  return [
    table("Engine installs", ["Node", "Engine", "State", "Progress or detail", "Temporal"], engineRows, "no engine yet"),
    h("p", { class: "muted" }, "The weights' fetches are on the mirror page."),
  ];
}
