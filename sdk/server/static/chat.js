// The chat view: the active path's turns as messages. A turn is one response: the user's
// message and the model's reply (its reasoning folded). Every message has sibling arrows
// (‹ 2/3 › over the turns that share its parent) and its actions; the reply shows what the
// engine restored and computed for it. User text is shown as plain text, model text through
// the markdown renderer: both only ever as text nodes.

import {copyText, renderMarkdown} from "./markdown.js";
import {statsLine} from "./tree.js";

// Images a user attached, as the server returns them: raster data URLs only.
const SAFE_IMAGE = /^data:image\/(png|jpeg|gif|bmp|webp);base64,[A-Za-z0-9+/=]+$/;

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function button(label, title, onClick, cls) {
  const b = el("button", cls || "act", label);
  b.type = "button";
  b.title = title;
  b.setAttribute("aria-label", title);
  b.addEventListener("click", onClick);
  return b;
}

// A turn's figures, from the engine's per-node stats (the API's usage where they are missing).
export function turnStats(turn) {
  const nodes = (turn.nodes || []).filter((n) => n.tokens_generated !== undefined);
  if (!nodes.length) return null;
  const first = nodes[0];
  const generated = nodes.reduce((sum, n) => sum + n.tokens_generated, 0);
  let tokens = 0, weighted = 0;
  for (const n of nodes) {
    if (n.decode_tps > 0) {
      tokens += n.tokens_generated;
      weighted += n.decode_tps * n.tokens_generated;
    }
  }
  return {restored: first.tokens_restored, computed: first.tokens_computed, generated,
    ttft_s: first.ttft_s, tps: tokens ? weighted / tokens : 0};
}

function arrows(turn, ctx) {
  const sibs = ctx.siblings(turn);
  const box = el("span", "sibs");
  if (sibs.length < 2) return box;
  const at = sibs.indexOf(turn.id);
  const prev = button("‹", "previous version", () => ctx.onAction("show", sibs[at - 1]), "nav");
  const next = button("›", "next version", () => ctx.onAction("show", sibs[at + 1]), "nav");
  prev.disabled = at <= 0;
  next.disabled = at >= sibs.length - 1;
  box.append(prev, el("span", "count", (at + 1) + "/" + sibs.length), next);
  return box;
}

function userMessage(turn, ctx) {
  const msg = el("div", "msg user");
  msg.dataset.turn = turn.id;
  const head = msg.appendChild(el("div", "mhead"));
  head.append(el("span", "who", "you"), arrows(turn, ctx));
  const images = (turn.images || []).filter((url) => SAFE_IMAGE.test(url));
  if (images.length) {
    const row = msg.appendChild(el("div", "images"));
    for (const url of images) {
      const img = row.appendChild(el("img"));
      img.src = url;
      img.alt = "attached image";
    }
  }
  const body = msg.appendChild(el("div", "text plain", turn.input));
  if (turn.pending) return msg;
  const acts = head.appendChild(el("span", "acts"));
  acts.append(
    button("edit", "edit (makes a sibling)", () => editBox(msg, body, turn, ctx)),
    button("branch", "branch from here: the next message forks before this one",
      () => ctx.onAction("branch", turn.previous)),
    button("delete", "delete this turn and everything under it",
      () => ctx.onAction("delete", turn.id)));
  return msg;
}

function editBox(msg, body, turn, ctx) {
  if (msg.querySelector("textarea")) return;
  const area = el("textarea", "edit");
  area.value = turn.input;
  area.rows = Math.min(12, turn.input.split("\n").length + 1);
  const save = button("save & send", "send the edited message as a sibling", () => {
    ctx.onAction("edit", turn.id, area.value);
  }, "primary");
  const cancel = button("cancel", "keep the message as it is", () => {
    area.remove(); save.remove(); cancel.remove(); body.hidden = false;
  });
  area.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); save.click(); }
    if (e.key === "Escape") { e.preventDefault(); cancel.click(); }
  });
  body.hidden = true;
  msg.append(area, save, cancel);
  area.focus();
}

function replyMessage(turn, ctx) {
  const msg = el("div", "msg model");
  msg.dataset.turn = turn.id;
  const head = msg.appendChild(el("div", "mhead"));
  head.append(el("span", "who", turn.model || "model"), arrows(turn, ctx));
  if (turn.reasoning !== null && turn.reasoning !== undefined) {
    const fold = msg.appendChild(el("details", "reasoning"));
    fold.append(el("summary", null, turn.pending ? "thinking…" : "reasoning"));
    fold.append(el("div", "text plain", turn.reasoning));
  }
  const body = msg.appendChild(el("div", "text md"));
  body.append(renderMarkdown(turn.output || ""));
  if (turn.pending) {
    msg.classList.add("streaming");
    return msg;
  }
  if (turn.status && turn.status !== "completed") msg.append(el("div", "note", turn.status));
  const st = turnStats(turn);
  if (st) {
    const line = msg.appendChild(el("div", "mstats", statsLine(st)));
    line.title = "tokens restored from checkpoints (↺), computed (+) and generated (→), time "
      + "to first token, decode speed";
  }
  const acts = head.appendChild(el("span", "acts"));
  acts.append(
    button("regenerate", "regenerate (makes a sibling)",
      () => ctx.onAction("regenerate", turn.id)),
    button("branch", "branch from here: the next message continues this reply as a new branch",
      () => ctx.onAction("branch", turn.id)),
    button("copy", "copy the reply", () => copyText(turn.output || "")),
    button("delete", "delete this turn and everything under it",
      () => ctx.onAction("delete", turn.id)));
  return msg;
}

// Draw `path` (turns, root first, the last one maybe pending) into `container`.
// ctx: {siblings(turn) -> ids, onAction(action, id, extra)}.
export function renderChat(container, path, ctx, system) {
  const frag = document.createDocumentFragment();
  if (system) {
    const msg = frag.appendChild(el("div", "msg system"));
    msg.append(el("div", "mhead", "system"), el("div", "text plain", system));
  }
  for (const turn of path) frag.append(userMessage(turn, ctx), replyMessage(turn, ctx));
  container.replaceChildren(frag);
}
