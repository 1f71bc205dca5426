// The inbox: every run waiting on a question or an approval, oldest
// first, answerable in place, with the parked tool call's arguments.

import { call, query } from "./api.js";
import { ago, fill, h, sayError, when } from "./dom.js";
import { answerForm } from "./run.js";

const REFRESH_MS = 3000;

export function render(main, _params, { refreshBadge }) {
  const list = h("ol", { class: "inbox", id: "inbox", "aria-label": "Waiting runs, oldest first" });
  const summary = h("p", { class: "muted", "aria-live": "polite" });
  const more = h("button", { type: "button", hidden: true }, "Load more");
  let after = null;
  // Cards being answered are left alone by the refresh.
  const shown = new Map();

  let inFlight = 0;
  async function load(reset) {
    inFlight += 1;
    try {
      if (reset) after = null;
      const page = await call("/runs" + query({
        state: "waiting", kind: "question,approval", order: "oldest", limit: 50, after,
      }));
      summary.textContent = page.total === 0
        ? "Nothing waits for an answer."
        : `${page.total.toLocaleString()} waiting, oldest first.`;
      const keep = new Set(page.runs.map((run) => run.id));
      if (reset) {
        for (const [id, card] of shown) {
          if (!keep.has(id) && !card.contains(document.activeElement)) {
            card.remove();
            shown.delete(id);
          }
        }
      }
      for (const run of page.runs) {
        if (shown.has(run.id)) continue;
        const card = item(run, async () => {
          card.remove();
          shown.delete(run.id);
          refreshBadge();
          await load(true);
        });
        shown.set(run.id, card);
        list.append(card);
      }
      more.hidden = !page.next;
      if (page.next) after = page.next;
    } catch (error) {
      sayError(error);
    } finally {
      inFlight -= 1;
    }
  }
  more.addEventListener("click", () => load(false));

  fill(main, h("section", { class: "head" }, h("h1", {}, "Inbox")), summary, list, more);
  load(true);
  const timer = setInterval(() => { if (inFlight === 0) load(true); }, REFRESH_MS);
  return () => clearInterval(timer);
}

function item(run, done) {
  const href = `#/run/${encodeURIComponent(run.id)}`;
  return h("li", { class: "card", dataset: { run: run.id } },
    h("div", { class: "card-head" },
      h("a", { href }, run.title || run.id),
      h("span", { class: "muted", title: when(run.updated) }, `waiting since ${ago(run.updated)}`)),
    run.suspend ? answerForm({ id: run.id, suspend: run.suspend, call: run.call }, done) : null);
}
