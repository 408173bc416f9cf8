// The viewer of a run's tree: live from the server's events (forkv run --ui), or from the
// tree inlined in the page (forkv show). Every node is a row of the tree view (tree.js); the
// selected one is shown in full beside it. Text goes in with textContent only.

import {renderTree, statsLine} from "./tree.js";

const view = {nodes: [], byId: new Map(), selected: null, folded: new Set(), follow: true};

function byIdOf(id) {
  return document.getElementById(id);
}

function label(n) {
  const first = (n.text || "").trim().split("\n")[0];
  return n.kind + ": " + (first.slice(0, 60) || (n.status === "done" ? "(empty)" : "…"));
}

function draw(data) {
  view.nodes = data.nodes;
  view.byId = new Map(data.nodes.map((n) => [n.id, n]));
  byIdOf("run-title").textContent = data.title || "";
  byIdOf("run-model").textContent = data.model || "";
  const done = data.nodes.filter((n) => n.status === "done").length;
  byIdOf("run-status").textContent = (data.done ? "finished" : "running") + " · "
    + done + "/" + data.nodes.length + " nodes done";
  document.body.dataset.done = data.done ? "1" : "0";
  if (view.follow || !view.byId.has(view.selected)) {
    const last = [...data.nodes].reverse().find((n) => n.status === "done");
    view.selected = last ? last.id : (data.nodes[0] || {}).id;
  }
  const path = new Set();
  for (let n = view.byId.get(view.selected); n; n = view.byId.get(n.parent)) path.add(n.id);
  const items = data.nodes.map((n) => ({
    id: n.id, parent: n.parent, label: label(n), stats: statsLine(n.stats),
    cls: "k-" + n.kind + (n.status === "done" ? "" : " incomplete"),
  }));
  renderTree(byIdOf("tree"), items, {
    active: path, folded: view.folded, current: view.selected,
    onPick: (id) => { view.selected = id; view.follow = false; draw(data); },
    onFold: (id) => {
      view.folded.has(id) ? view.folded.delete(id) : view.folded.add(id);
      draw(data);
    },
  });
  detail(view.byId.get(view.selected));
}

function detail(n) {
  const box = byIdOf("detail");
  box.replaceChildren();
  if (!n) return;
  const head = box.appendChild(document.createElement("div"));
  head.className = "mhead";
  head.textContent = [n.kind, n.id, n.status, n.finish ? "finish: " + n.finish : "",
    n.copied_from ? "copy of " + n.copied_from : ""].filter(Boolean).join(" · ");
  if (n.stats) {
    const line = box.appendChild(document.createElement("div"));
    line.className = "mstats";
    line.textContent = statsLine(n.stats);
  }
  const facts = [n.gen, n.span ? "tokens " + n.span[0] + "–" + n.span[1] : "",
    n.blocks && n.blocks.length ? "blocks " + n.blocks.join(", ") : "",
    ...(n.images || []).map((i) => "image " + i)].filter(Boolean);
  if (facts.length) {
    const line = box.appendChild(document.createElement("div"));
    line.className = "mstats facts";
    line.textContent = facts.join(" · ");
  }
  if (n.error) {
    const err = box.appendChild(document.createElement("div"));
    err.className = "note";
    err.textContent = n.error;
  }
  const text = box.appendChild(document.createElement("div"));
  text.className = "msg text plain node-text";
  text.textContent = n.text;
}

function start() {
  const inlined = document.getElementById("forkv-tree");
  if (inlined) {
    draw(JSON.parse(inlined.textContent));
    return;
  }
  const events = new EventSource(location.pathname + "events");
  events.addEventListener("tree", (e) => draw(JSON.parse(e.data)));
  events.addEventListener("done", () => events.close());
}

start();
