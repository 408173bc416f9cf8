// A small markdown renderer that builds DOM nodes: text goes in with textContent only, so
// model output can never run as HTML or script. Links are kept only for http(s) URLs; code
// blocks get a copy button. Supports fences, headings, lists, quotes, rules, paragraphs, and
// inline code, bold, italic and links: what chat models write.

const INLINE = new RegExp([
  /(`+)([\s\S]*?[^`])\1(?!`)/.source, // code
  /\*\*([^*]+)\*\*|__([^_]+)__/.source, // bold
  /\*([^*\s][^*]*)\*/.source, // italic
  /\[([^\]]+)\]\(([^)\s]+)\)/.source, // [text](url)
  /(https?:\/\/[^\s<>()]+[^\s<>().,;:!?'"])/.source, // a bare URL
].join("|"), "g");

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

// The URL itself if it is an absolute http(s) URL, else null (javascript:, data:, relative...).
export function safeUrl(href) {
  try {
    const url = new URL(href);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch (e) {
    return null;
  }
}

function link(text, href) {
  const url = safeUrl(href);
  if (url === null) return document.createTextNode(text);
  const a = el("a", null, text);
  a.href = url;
  a.target = "_blank";
  a.rel = "noopener noreferrer nofollow";
  return a;
}

function inline(parent, text) {
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    if (m.index > last) parent.append(text.slice(last, m.index));
    if (m[1]) parent.append(el("code", null, m[2]));
    else if (m[3] || m[4]) inline(parent.appendChild(el("strong")), m[3] || m[4]);
    else if (m[5]) inline(parent.appendChild(el("em")), m[5]);
    else if (m[6]) parent.append(link(m[6], m[7]));
    else parent.append(link(m[8], m[8]));
    last = m.index + m[0].length;
  }
  if (last < text.length) parent.append(text.slice(last));
}

function lines(parent, text) {
  text.split("\n").forEach((line, i) => {
    if (i) parent.append(el("br"));
    inline(parent, line);
  });
}

export function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
  const area = el("textarea");
  area.value = text;
  document.body.append(area);
  area.select();
  document.execCommand("copy");
  area.remove();
  return Promise.resolve();
}

export function codeBlock(code, lang) {
  const box = el("div", "code");
  const bar = box.appendChild(el("div", "codebar"));
  bar.append(el("span", "lang", lang || "code"));
  const copy = bar.appendChild(el("button", "copy", "copy"));
  copy.type = "button";
  copy.addEventListener("click", () => copyText(code).then(() => {
    copy.textContent = "copied";
    setTimeout(() => { copy.textContent = "copy"; }, 1200);
  }));
  box.appendChild(el("pre")).appendChild(el("code", null, code));
  return box;
}

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*)$/;
const ITEM = /^ {0,3}([-*+]|\d{1,9}[.)])\s+(.*)$/;
const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;

// A DocumentFragment of `text` rendered as markdown (an unclosed fence runs to the end, as
// it does while a reply streams).
export function renderMarkdown(text) {
  const out = document.createDocumentFragment();
  const rows = String(text).replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < rows.length) {
    const row = rows[i];
    const fence = row.match(FENCE);
    if (fence) {
      const body = [];
      for (i++; i < rows.length && !rows[i].trim().startsWith(fence[1]); i++) body.push(rows[i]);
      i++;
      out.append(codeBlock(body.join("\n"), fence[2]));
      continue;
    }
    if (!row.trim()) { i++; continue; }
    const heading = row.match(HEADING);
    if (heading) {
      inline(out.appendChild(el("h" + Math.min(6, heading[1].length + 2))), heading[2]);
      i++;
      continue;
    }
    if (RULE.test(row)) { out.append(el("hr")); i++; continue; }
    if (row.match(ITEM)) {
      const ordered = /\d/.test(row.match(ITEM)[1]);
      const list = out.appendChild(el(ordered ? "ol" : "ul"));
      while (i < rows.length && rows[i].match(ITEM)) {
        inline(list.appendChild(el("li")), rows[i].match(ITEM)[2]);
        i++;
      }
      continue;
    }
    if (/^ {0,3}>/.test(row)) {
      const quote = [];
      for (; i < rows.length && /^ {0,3}>/.test(rows[i]); i++) {
        quote.push(rows[i].replace(/^ {0,3}> ?/, ""));
      }
      out.appendChild(el("blockquote")).append(renderMarkdown(quote.join("\n")));
      continue;
    }
    const para = [];
    for (; i < rows.length && rows[i].trim() && !FENCE.test(rows[i]) && !HEADING.test(rows[i])
      && !ITEM.test(rows[i]) && !/^ {0,3}>/.test(rows[i]); i++) para.push(rows[i]);
    lines(out.appendChild(el("p")), para.join("\n"));
  }
  return out;
}
