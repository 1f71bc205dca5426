// The console's DOM helpers: elements built from data, never from HTML
// strings, so nothing a run holds can become markup.

/** An element: `h("a", {href}, "text", child)`. `on*` attributes are
 *  listeners; `null`, `undefined` and `false` children are skipped. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "class") {
      el.className = value;
    } else if (key === "dataset") {
      Object.assign(el.dataset, value);
    } else if (value === true) {
      el.setAttribute(key, "");
    } else {
      el.setAttribute(key, String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replaces `el`'s children. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** A time as the reader's locale writes it, and how long ago. */
export function when(iso) {
  if (!iso) return "";
  const at = new Date(iso);
  return at.toLocaleString();
}

export function ago(iso) {
  if (!iso) return "";
  const seconds = Math.round((Date.now() - new Date(iso).getTime()) / 1000);
  if (seconds < 5) return "just now";
  if (seconds < 60) return `${seconds} s ago`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  return `${Math.floor(seconds / 86400)} d ago`;
}

export function tokens(usage) {
  if (!usage) return "";
  const total = (usage.input_tokens || 0) + (usage.output_tokens || 0);
  return total.toLocaleString();
}

export function cost(usd) {
  if (usd === undefined || usd === null) return "";
  return usd < 0.01 ? `$${usd.toFixed(4)}` : `$${usd.toFixed(2)}`;
}

/** A run's state as a labelled badge. */
export function stateBadge(state, kind) {
  const text = state === "waiting" && kind ? `waiting · ${kind}` : state;
  return h("span", { class: `state state-${state}` }, text);
}

/** JSON, indented, in a <pre>. */
export function json(value) {
  return h("pre", { class: "json" }, JSON.stringify(value, null, 2));
}

/** A short message at the top of the page, replaced by the next. */
export function say(text, kind = "info") {
  fill(
    document.getElementById("notice"),
    text ? h("p", { class: `notice notice-${kind}` }, text) : null,
  );
}

/** An error as the notice says it: its code and message. */
export function sayError(error) {
  say(error.code ? `${error.code}: ${error.message}` : String(error), "error");
}
