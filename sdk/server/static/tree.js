// The tree view: a whole conversation (or a run's tree) as an outline. A chain of single
// children stays at one depth; only a fork indents, so a 2,000-turn chain stays narrow. Rows on
// the active path are highlighted, a folded row hides what is under it, and each row shows the
// engine's stats for that node. Builds DOM with textContent only.

// items: [{id, parent, label, stats, cls}] (parent null or unknown: a root), in sibling order.
// opts: {active: Set of ids to highlight, folded: Set of ids, current: id, onPick(id),
// onFold(id), onCompare(id) (a "beside" button on each row)}. Returns the number of rows drawn.
export function renderTree(container, items, opts) {
  const kids = new Map();
  const known = new Set(items.map((it) => it.id));
  for (const it of items) {
    const parent = known.has(it.parent) ? it.parent : null;
    if (!kids.has(parent)) kids.set(parent, []);
    kids.get(parent).push(it);
  }
  const active = opts.active || new Set();
  const folded = opts.folded || new Set();
  const frag = document.createDocumentFragment();
  let rows = 0;
  // Depth-first, iteratively (a chain may be thousands deep): [item, depth, fork index].
  const stack = (kids.get(null) || []).map((it, k, all) => [it, all.length > 1 ? 1 : 0, k])
    .reverse();
  while (stack.length) {
    const [it, depth, index] = stack.pop();
    const below = kids.get(it.id) || [];
    frag.append(row(it, depth, index, below.length, active, folded, opts));
    rows++;
    if (folded.has(it.id)) continue;
    const next = below.length > 1 ? depth + 1 : depth;
    for (let k = below.length - 1; k >= 0; k--) {
      stack.push([below[k], next, below.length > 1 ? k : -1]);
    }
  }
  container.replaceChildren(frag);
  return rows;
}

function row(it, depth, index, numKids, active, folded, opts) {
  const line = document.createElement("div");
  line.className = "trow" + (active.has(it.id) ? " on" : "") + (it.cls ? " " + it.cls : "")
    + (it.id === opts.current ? " current" : "");
  line.dataset.id = it.id;
  line.style.setProperty("--depth", Math.min(depth, 24));
  const fold = line.appendChild(document.createElement("button"));
  fold.type = "button";
  fold.className = "fold";
  if (numKids) {
    const isFolded = folded.has(it.id);
    fold.textContent = isFolded ? "▸" : "▾";
    fold.title = isFolded ? "unfold" : "fold";
    fold.setAttribute("aria-expanded", String(!isFolded));
    fold.addEventListener("click", () => opts.onFold && opts.onFold(it.id));
  } else {
    fold.disabled = true;
    fold.textContent = "·";
  }
  const pick = line.appendChild(document.createElement("button"));
  pick.type = "button";
  pick.className = "pick";
  if (index >= 0 && depth > 0) pick.append(span("fork", "↳" + (index + 1)));
  pick.append(span("label", it.label || "(empty)"));
  if (it.stats) pick.append(span("stats", it.stats));
  pick.addEventListener("click", () => opts.onPick && opts.onPick(it.id));
  if (folded.has(it.id) && numKids) line.append(span("hidden", "+" + numKids));
  if (opts.onCompare) {
    const beside = line.appendChild(document.createElement("button"));
    beside.type = "button";
    beside.className = "beside";
    beside.textContent = "⇆";
    beside.title = "show this branch beside the one on screen";
    beside.addEventListener("click", () => opts.onCompare(it.id));
  }
  return line;
}

function span(cls, text) {
  const s = document.createElement("span");
  s.className = cls;
  s.textContent = text;
  return s;
}

// One node's engine stats in a line: restored / computed tokens, time to first token, tok/s.
export function statsLine(s) {
  if (!s) return "";
  const parts = [];
  if (s.restored !== undefined) parts.push("↺" + s.restored + " +" + s.computed);
  if (s.generated !== undefined) parts.push("→" + s.generated);
  if (s.ttft_s) parts.push(Math.round(s.ttft_s * 1000) + " ms");
  if (s.tps) parts.push(s.tps.toFixed(s.tps < 10 ? 1 : 0) + " tok/s");
  return parts.join(" · ");
}
