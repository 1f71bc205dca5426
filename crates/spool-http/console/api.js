// The console's one way to the server: the public API under /spool/v1,
// with the tab's token as a bearer header. Nothing here is private API.

const BASE = "/spool/v1";
const TOKEN = "spool.token";

/** An error reply: its stable code, message and status. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const listeners = new Set();

/** Calls `listener()` when the server asks for credentials. */
export function onUnauthenticated(listener) {
  listeners.add(listener);
}

export function token() {
  return sessionStorage.getItem(TOKEN);
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN, value);
  else sessionStorage.removeItem(TOKEN);
}

function headers(body) {
  const out = { Accept: "application/json" };
  const bearer = token();
  if (bearer) out.Authorization = `Bearer ${bearer}`;
  if (body !== undefined) out["Content-Type"] = "application/json";
  return out;
}

async function failure(response) {
  let code = "http_" + response.status;
  let message = response.statusText;
  try {
    const body = await response.json();
    code = body.code || code;
    message = body.error || message;
  } catch {
    // Not the channel's error body: the status says enough.
  }
  if (response.status === 401) listeners.forEach((listener) => listener());
  return new ApiError(response.status, code, message);
}

/** `method path` with a JSON body; the reply's JSON. */
export async function call(path, { method = "GET", body, signal, prefer } = {}) {
  const sent = headers(body);
  // `respond-async`: answered once recorded, not at the turn's end; the
  // run's stream shows the turn.
  if (prefer) sent.Prefer = prefer;
  const response = await fetch(BASE + path, {
    method,
    headers: sent,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    credentials: "omit",
  });
  if (!response.ok) throw await failure(response);
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

/** A query string from the entries whose values are set. */
export function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(key, value);
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

/**
 * Follows a run's NDJSON stream from `cursor`, calling `onLine(line)` for
 * each line. When the connection drops it reconnects from the last
 * journal position seen, so no durable line is missed or repeated; live
 * deltas are not replayed (the server never does), the turn's answer
 * arrives whole in `run_response`. Returns a function that stops it.
 */
export function follow(run, cursor, onLine, onStatus = () => {}) {
  let stopped = false;
  let controller = null;
  let last = cursor;
  let delay = 500;
  (async () => {
    while (!stopped) {
      controller = new AbortController();
      try {
        const at = last === null || last === undefined ? "" : `?cursor=${last}`;
        const response = await fetch(`${BASE}/runs/${encodeURIComponent(run)}/stream${at}`, {
          headers: headers(),
          signal: controller.signal,
          credentials: "omit",
        });
        if (!response.ok) throw await failure(response);
        onStatus("live");
        delay = 500;
        const reader = response.body.getReader();
        const decoder = new TextDecoder();
        let buffered = "";
        let lagged = false;
        while (!lagged) {
          const { value, done } = await reader.read();
          if (done) break;
          buffered += decoder.decode(value, { stream: true });
          let end;
          while (!lagged && (end = buffered.indexOf("\n")) >= 0) {
            const text = buffered.slice(0, end);
            buffered = buffered.slice(end + 1);
            if (!text.trim()) continue;
            const line = JSON.parse(text);
            // Every line carries the last journal position before or at
            // it: what to resume after.
            if (typeof line.seq === "number") last = line.seq;
            if (line.type === "lagged") {
              // The server ends the stream here; read again from `seq`.
              lagged = true;
              controller.abort();
              break;
            }
            onLine(line);
          }
        }
      } catch (error) {
        if (stopped) return;
        if (error instanceof SyntaxError) onStatus("error", error);
        if (error instanceof ApiError && error.status < 500) {
          onStatus("closed", error);
          return;
        }
      }
      if (stopped) return;
      onStatus("reconnecting");
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 8000);
    }
  })();
  return () => {
    stopped = true;
    if (controller) controller.abort();
  };
}
