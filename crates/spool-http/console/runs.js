// The run list: state, title, address, last update, turns, tokens, cost
// and failure code; filtered by state and a search; paged by the API's
// cursor; refreshed live while it is shown. Starting a run is here too.

import { call, query } from "./api.js";
import { ago, cost, fill, h, sayError, stateBadge, tokens, when } from "./dom.js";

const STATES = ["pending", "running", "waiting", "completed", "failed", "cancelled", "retired"];
const PAGE = 50;
const REFRESH_MS = 2000;

export function render(main, _params, { refreshBadge }) {
  // The filter lives in the page's own query (`#/runs?state=…&q=…`), so
  // a reload or a shared link keeps it.
  const saved = new URLSearchParams(location.hash.split("?")[1] || "");
  const filter = { state: saved.get("state") || "", q: saved.get("q") || "" };
  const pages = [null];
  let page = 0;
  // A load answers only if no newer one started since: a filter changed
  // while the refresh was on its way wins.
  let generation = 0;
  let inFlight = 0;

  const state = h("select", { id: "filter-state", name: "state" },
    h("option", { value: "" }, "Any state"),
    STATES.map((s) => h("option", { value: s, selected: s === filter.state }, s)));
  const search = h("input", {
    id: "filter-q", type: "search", name: "q", value: filter.q,
    placeholder: "Title, address or run id", autocomplete: "off",
  });
  const body = h("tbody");
  const summary = h("p", { class: "muted", id: "runs-total", "aria-live": "polite" });
  const older = h("button", { type: "button", disabled: true }, "Older →");
  const newer = h("button", { type: "button", disabled: true }, "← Newer");

  async function load() {
    const mine = ++generation;
    inFlight += 1;
    try {
      const reply = await call("/runs" + query({
        limit: PAGE, after: pages[page], state: filter.state, q: filter.q,
      }));
      if (mine !== generation) return;
      pages[page + 1] = reply.next || null;
      older.disabled = !reply.next;
      newer.disabled = page === 0;
      const first = page * PAGE + (reply.runs.length ? 1 : 0);
      const noun = reply.total === 1 ? "run" : "runs";
      summary.textContent = `${first.toLocaleString()}–${(page * PAGE + reply.runs.length).toLocaleString()} of ${reply.total.toLocaleString()} ${noun}`;
      fill(body, reply.runs.length ? reply.runs.map(row) :
        h("tr", {}, h("td", { colspan: 8, class: "empty" }, "No runs match.")));
      // For the browser's own timings (`cargo xtask console-timings`).
      performance.mark("spool:runs-rendered");
    } catch (error) {
      if (mine === generation) sayError(error);
    } finally {
      inFlight -= 1;
    }
  }

  function refilter() {
    performance.mark("spool:filter");
    filter.state = state.value;
    filter.q = search.value.trim();
    const params = new URLSearchParams();
    if (filter.state) params.set("state", filter.state);
    if (filter.q) params.set("q", filter.q);
    const hash = "#/runs" + (params.toString() ? `?${params}` : "");
    history.replaceState(null, "", hash);
    pages.length = 1;
    page = 0;
    load();
  }

  let typing;
  state.addEventListener("change", refilter);
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(refilter, 200);
  });
  older.addEventListener("click", () => { page += 1; load(); });
  newer.addEventListener("click", () => { page = Math.max(0, page - 1); load(); });

  fill(main,
    h("section", { class: "head" },
      h("h1", {}, "Runs"),
      startForm(refreshBadge)),
    h("form", { class: "filters", role: "search", onsubmit: (e) => { e.preventDefault(); refilter(); } },
      h("label", { for: "filter-state" }, "State"), state,
      h("label", { for: "filter-q" }, "Search"), search),
    summary,
    h("div", { class: "scroll" },
      h("table", { class: "runs" },
        h("caption", { class: "visually-hidden" }, "Runs, most recently updated first"),
        h("thead", {}, h("tr", {},
          ["Run", "State", "Address", "Updated", "Turns", "Tokens", "Cost", "Failure"]
            .map((name) => h("th", { scope: "col" }, name)))),
        body)),
    h("nav", { class: "pager", "aria-label": "Pages" }, newer, older));

  load();
  // Live: the page shown is read again every two seconds.
  const timer = setInterval(() => { if (inFlight === 0) load(); }, REFRESH_MS);
  return () => clearInterval(timer);
}

function row(run) {
  const href = `#/run/${encodeURIComponent(run.id)}`;
  return h("tr", { dataset: { run: run.id } },
    h("td", {}, h("a", { href }, run.title || run.id),
      run.title ? h("div", { class: "muted mono" }, run.id) : null),
    h("td", {}, stateBadge(run.state, run.suspend && run.suspend.kind)),
    h("td", { class: "mono" }, run.address || ""),
    h("td", { title: when(run.updated) }, ago(run.updated)),
    h("td", { class: "num" }, run.turns),
    h("td", { class: "num" }, tokens(run.usage)),
    h("td", { class: "num" }, cost(run.cost_usd)),
    h("td", { class: "mono" }, run.failure ? run.failure.code : ""));
}

/** "New run": its first message, with an optional title and address. */
function startForm(refreshBadge) {
  const text = h("textarea", { id: "start-text", name: "text", rows: 2, required: true, placeholder: "What should the agent do?" });
  const title = h("input", { id: "start-title", name: "title", placeholder: "Optional" });
  const address = h("input", { id: "start-address", name: "address", placeholder: "Optional" });
  return h("details", { class: "start" },
    h("summary", {}, "New run"),
    h("form", {
      onsubmit: async (event) => {
        event.preventDefault();
        try {
          const reply = await call("/runs", {
            method: "POST",
            prefer: "respond-async",
            body: {
              text: text.value,
              title: title.value.trim() || null,
              address: address.value.trim() || null,
            },
          });
          refreshBadge();
          location.hash = `#/run/${encodeURIComponent(reply.run_id)}`;
        } catch (error) {
          sayError(error);
        }
      },
    },
    h("label", { for: "start-text" }, "Message"), text,
    h("div", { class: "row" },
      h("span", {}, h("label", { for: "start-title" }, "Title"), title),
      h("span", {}, h("label", { for: "start-address" }, "Address"), address)),
    h("div", { class: "row" }, h("button", { type: "submit", class: "primary" }, "Start run"))));
}
