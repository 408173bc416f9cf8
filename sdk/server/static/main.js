// The app: state, the server calls, and wiring of the views (chat.js, tree.js).
// A conversation is the server's tree of responses; the page keeps only which branch is on
// screen. Nothing of a conversation is written to browser storage.

import {ApiError, call, setApiKey, streamResponse} from "./api.js";
import {Branches} from "./branches.js";
import {renderChat, turnStats} from "./chat.js";
import {renderMarkdown} from "./markdown.js";
import {renderTree, statsLine} from "./tree.js";

const $ = (id) => document.getElementById(id);
const B = new Branches(); // the conversation on screen
const S = {
  model: "", cid: null, folded: new Set(), streaming: null,
  beside: null, // a turn whose branch is shown beside the one on screen
  images: [], // data URLs of the images attached to the next message
};

function notice(text) {
  $("notice").textContent = text || "";
}

const siblings = (turn) => B.siblings(turn);

function system() {
  const roots = B.path();
  return roots.length ? roots[0].instructions : null;
}

function render() {
  const turns = B.path();
  const shown = S.streaming ? [...turns, S.streaming.turn] : turns;
  if (S.beside && !B.byId.has(S.beside)) S.beside = null;
  const box = $("messages");
  box.classList.toggle("split", Boolean(S.beside));
  if (S.beside) {
    const [left, right] = [document.createElement("div"), document.createElement("div")];
    left.className = right.className = "column";
    renderChat(left, shown, {siblings, onAction: act}, system());
    const other = B.branchThrough(S.beside);
    renderChat(right, other, {siblings, onAction: act},
      other.length ? other[0].instructions : null);
    const close = document.createElement("button");
    close.type = "button";
    close.className = "close-beside";
    close.textContent = "close the side-by-side view";
    close.addEventListener("click", () => { S.beside = null; render(); });
    right.prepend(close);
    box.replaceChildren(left, right);
  } else {
    renderChat(box, shown, {siblings, onAction: act}, system());
  }
  $("model").disabled = Boolean(B.conv);
  document.body.dataset.conversation = S.cid || "";
  const at = B.branchAt;
  $("branching").hidden = at === undefined;
  if (at !== undefined) {
    const t = at && B.byId.get(at);
    $("branch-label").textContent = t ? "The next message starts a branch after: "
      + (t.input.split("\n")[0].slice(0, 60) || "(empty)")
      : "The next message starts a new first turn.";
  }
  renderTreePanel(turns);
  box.scrollTop = box.scrollHeight;
}

function renderTreePanel(turns) {
  const items = B.turns.map((t) => ({
    id: t.id, parent: t.previous, label: t.input.split("\n")[0].slice(0, 48),
    stats: statsLine(turnStats(t)), cls: t.status === "completed" ? "" : "incomplete",
  }));
  renderTree($("tree"), items, {
    active: new Set(turns.map((t) => t.id)), folded: S.folded,
    current: turns.length ? turns[turns.length - 1].id : null,
    onPick: (id) => { B.branchAt = undefined; B.show(id); render(); scrollTo(id); },
    onFold: (id) => { S.folded.has(id) ? S.folded.delete(id) : S.folded.add(id); render(); },
    onCompare: (id) => { S.beside = id; render(); },
  });
}

function scrollTo(id) {
  const msg = document.querySelector(`.msg[data-turn="${CSS.escape(id)}"]`);
  if (msg) msg.scrollIntoView({block: "nearest"});
}

// -- server calls --------------------------------------------------------------------------
async function loadModels() {
  const list = await call("GET", "/v1/models");
  const select = $("model");
  select.replaceChildren();
  for (const m of list.data) {
    const opt = document.createElement("option");
    opt.value = m.id;
    opt.textContent = m.id + (m.status && m.status !== "loaded" ? " (" + m.status + ")" : "");
    select.append(opt);
  }
  S.model = select.value;
}

async function loadConversations() {
  const list = await call("GET", "/v1/forkv/conversations");
  const ul = $("conv-list");
  ul.replaceChildren();
  for (const c of list.data) {
    const li = ul.appendChild(document.createElement("li"));
    const b = li.appendChild(document.createElement("button"));
    b.type = "button";
    b.textContent = c.title || "(untitled)";
    b.title = c.model + " · " + c.turns + " turns";
    if (c.id === S.cid) b.className = "on";
    b.addEventListener("click", () => openConversation(c.id));
  }
}

async function openConversation(cid) {
  if (S.streaming) return;
  S.cid = cid;
  B.choice = new Map();
  B.branchAt = undefined;
  S.folded = new Set();
  S.beside = null;
  await reload();
}

async function reload() {
  if (S.cid) {
    try {
      B.load(await call("GET", "/v1/forkv/conversations/" + encodeURIComponent(S.cid)));
      S.model = B.conv.model;
      $("model").value = S.model;
    } catch (e) {
      if (!(e instanceof ApiError && e.status === 404)) throw e;
      S.cid = null;
      B.load(null);
    }
  } else {
    B.load(null);
  }
  render();
  await loadConversations();
}

function newConversation() {
  if (S.streaming) return;
  S.cid = null;
  B.branchAt = undefined;
  S.beside = null;
  B.load(null);
  $("model").disabled = false;
  render();
  loadConversations();
  $("input").focus();
}

// Send `text` (and `images`, data URLs) as a new turn under `previous` (null: a first turn);
// the reply streams in.
async function send(text, previous, instructions, images = []) {
  if (S.streaming || !S.model) return;
  if (!S.cid) S.cid = "conv_" + crypto.randomUUID().replaceAll("-", "");
  const controller = new AbortController();
  const turn = {id: "pending", pending: true, input: text, output: "", reasoning: null,
    previous, model: S.model, images};
  S.streaming = {controller, turn};
  setBusy(true);
  notice("");
  render();
  const input = images.length ? [{role: "user", content: [{type: "input_text", text},
    ...images.map((url) => ({type: "input_image", image_url: url}))]}] : text;
  const body = {model: S.model, input, metadata: {conversation: S.cid},
    max_output_tokens: Number($("max-tokens").value) || undefined,
    temperature: Number($("temperature").value)};
  if (previous) body.previous_response_id = previous;
  else if (instructions) body.instructions = instructions;
  let id = null, frame = 0;
  const paint = () => {
    frame = 0;
    const msg = document.querySelector(".msg.model.streaming");
    if (!msg) return;
    msg.querySelector(".text.md").replaceChildren(renderMarkdown(turn.output));
    const think = msg.querySelector(".reasoning .text");
    if (think) think.textContent = turn.reasoning;
    const box = $("messages");
    box.scrollTop = box.scrollHeight;
  };
  try {
    await streamResponse(body, controller.signal, (type, ev) => {
      if (type === "response.created") id = ev.response.id;
      else if (type === "response.reasoning_text.delta") {
        if (turn.reasoning === null) { turn.reasoning = ""; render(); }
        turn.reasoning += ev.delta;
      } else if (type === "response.output_item.added" && ev.item.type === "reasoning") {
        if (turn.reasoning === null) { turn.reasoning = ""; render(); }
      } else if (type === "response.output_text.delta") turn.output += ev.delta;
      else if (type === "response.failed") notice("failed: " + ev.response.error.message);
      if (!frame) frame = requestAnimationFrame(paint);
    });
  } catch (e) {
    if (controller.signal.aborted || !id) {  // the message goes back, to send again
      $("input").value = text;
      S.images = images;
      showAttachments();
    }
    notice(controller.signal.aborted ? "Stopped: the partial reply was not kept." : e.message);
  } finally {
    S.streaming = null;
    setBusy(false);
  }
  if (id) { B.branchAt = undefined; }
  // a stopped first turn was not kept: the server has no conversation to ask for (asking
  // would log a 404 on the console)
  if (controller.signal.aborted && !previous && !B.conv) S.cid = null;
  await reload();
  if (id && B.byId.has(id)) { B.show(id); render(); }
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  document.body.classList.toggle("busy", busy);
}

function stop() {
  if (S.streaming) S.streaming.controller.abort();
}

async function act(action, id, extra) {
  const t = id ? B.byId.get(id) : null;
  if (action === "show") { B.branchAt = undefined; B.show(id); render(); return; }
  if (action === "branch") { B.branchAt = id; render(); $("input").focus(); return; }
  if (S.streaming) return;
  if (action === "regenerate" || action === "edit") {
    const text = action === "edit" ? extra : t.input;
    await send(text, t.previous, t.previous ? undefined : t.instructions, t.images || []);
  } else if (action === "delete") {
    let said;
    try {
      const r = await call("DELETE", "/v1/responses/" + encodeURIComponent(id));
      said = `Deleted ${r.deleted_responses.length} turn(s); released ${r.released_records} `
        + "checkpoint record(s).";
    } catch (e) {
      said = e.message;
    }
    if (B.branchAt === id) B.branchAt = undefined;
    await reload();
    notice(said); // once the page shows what is left
  }
}

// -- wiring --------------------------------------------------------------------------------
function submit() {
  const input = $("input");
  const text = input.value;
  if ((!text.trim() && !S.images.length) || S.streaming) return;
  input.value = "";
  const images = S.images;
  S.images = [];
  showAttachments();
  const turns = B.path();
  let previous = turns.length ? turns[turns.length - 1].id : null;
  if (B.branchAt !== undefined) previous = B.branchAt;
  const root = previous === null;
  send(text, previous, root ? ($("system").value.trim() || system() || undefined) : undefined,
    images);
}

// Read picked image files into data URLs (kept in memory only) for the next message.
async function attach(files) {
  for (const file of files) {
    const url = await new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    });
    S.images.push(url);
  }
  showAttachments();
}

function showAttachments() {
  const box = $("attachments");
  box.replaceChildren();
  S.images.forEach((url, i) => {
    const thumb = box.appendChild(document.createElement("span"));
    thumb.className = "thumb";
    const img = thumb.appendChild(document.createElement("img"));
    img.src = url;
    img.alt = "image to send";
    const drop = thumb.appendChild(document.createElement("button"));
    drop.type = "button";
    drop.textContent = "×";
    drop.title = "remove this image";
    drop.addEventListener("click", () => { S.images.splice(i, 1); showAttachments(); });
  });
}

function wire() {
  $("composer").addEventListener("submit", (e) => { e.preventDefault(); submit(); });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); submit(); }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && S.streaming) { e.preventDefault(); stop(); }
  });
  $("stop").addEventListener("click", stop);
  $("attach-button").addEventListener("click", () => $("attach").click());
  $("attach").addEventListener("change", async () => {
    await attach([...$("attach").files]);
    $("attach").value = "";
  });
  $("new").addEventListener("click", newConversation);
  $("model").addEventListener("change", () => { S.model = $("model").value; });
  $("branch-cancel").addEventListener("click", () => { B.branchAt = undefined; render(); });
  $("toggle-tree").addEventListener("click", () => {
    const hidden = document.body.classList.toggle("no-tree");
    $("toggle-tree").setAttribute("aria-pressed", String(!hidden));
  });
  $("key-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    setApiKey($("key").value);
    $("key").value = "";
    await start();
  });
}

async function start() {
  try {
    await loadModels();
    $("key-box").hidden = true;
    await reload();
    document.body.dataset.ready = "1";
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      $("key-box").hidden = false;
      $("key-error").textContent = $("key-box").dataset.tried ? e.message : "";
      $("key-box").dataset.tried = "1";
      $("key").focus();
    } else {
      notice(e.message);
    }
  }
}

wire();
start();
