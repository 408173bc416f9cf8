// The server's API as the page uses it: JSON calls and the Responses stream.
// The API key (when the server asks for one) lives in this module's memory only: never in
// localStorage, sessionStorage, IndexedDB or cookies, so a reload asks for it again.

let apiKey = "";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function setApiKey(key) {
  apiKey = key;
}

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  if (apiKey) h.Authorization = "Bearer " + apiKey;
  return h;
}

async function failure(r) {
  let message = r.status + " " + r.statusText;
  try {
    const body = await r.json();
    if (body && body.error && body.error.message) message = body.error.message;
  } catch (e) {
    // not JSON: keep the status line
  }
  return new ApiError(r.status, message);
}

export async function call(method, path, body) {
  const r = await fetch(path, {
    method, headers: headers(body !== undefined), cache: "no-store",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!r.ok) throw await failure(r);
  return r.json();
}

// POST /v1/responses with stream: true; onEvent(type, data) for each server-sent event.
// Aborting `signal` closes the connection, which cancels the request on the server.
export async function streamResponse(body, signal, onEvent) {
  const r = await fetch("/v1/responses", {
    method: "POST", headers: headers(true), cache: "no-store", signal,
    body: JSON.stringify({...body, stream: true}),
  });
  if (!r.ok) throw await failure(r);
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, {stream: true});
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = frame.split("\n").filter((l) => l.startsWith("data: "))
        .map((l) => l.slice(6)).join("\n");
      if (data) {
        const event = JSON.parse(data);
        onEvent(event.type, event);
      }
    }
  }
}
