// Schedules: each with its cron, next firing and recent firings, and a
// button that fires it now, shown to a caller the server lets trigger.

import { call } from "./api.js";
import { fill, h, say, sayError, when } from "./dom.js";

export function render(main) {
  const list = h("div", { id: "schedules" });
  async function load() {
    try {
      const reply = await call("/schedules");
      fill(list, reply.schedules.length
        ? reply.schedules.map((schedule) => card(schedule, load, reply.can_trigger))
        : h("p", { class: "muted" }, "No schedules are configured ([[schedule]] in spool.toml)."));
    } catch (error) {
      sayError(error);
    }
  }
  fill(main, h("section", { class: "head" }, h("h1", {}, "Schedules")), list);
  load();
  const timer = setInterval(load, 10000);
  return () => clearInterval(timer);
}

function card(schedule, reload, canTrigger) {
  const history = schedule.history.slice().reverse();
  return h("section", { class: "card", dataset: { schedule: schedule.name } },
    h("div", { class: "card-head" },
      h("h2", {}, schedule.name),
      // Offered only to a caller the server lets trigger.
      canTrigger && h("button", {
        type: "button",
        onclick: async () => {
          try {
            const firing = await call(`/schedules/${encodeURIComponent(schedule.name)}/trigger`, { method: "POST", body: {} });
            say(`Fired: ${firing.status}${firing.run_id ? ` (run ${firing.run_id})` : ""}.`);
            reload();
          } catch (error) {
            sayError(error);
          }
        },
      }, "Trigger now")),
    h("dl", { class: "facts" },
      h("dt", {}, "Cron"), h("dd", { class: "mono" }, `${schedule.cron} (${schedule.time_zone})`),
      h("dt", {}, "Next"), h("dd", {}, schedule.next_fire_at ? when(schedule.next_fire_at) : "—"),
      h("dt", {}, "Sends"), h("dd", {}, schedule.text),
      schedule.address ? [h("dt", {}, "To"), h("dd", { class: "mono" }, schedule.address)] : null,
      h("dt", {}, "Overlap"), h("dd", {}, `${schedule.overlap}, catch-up ${schedule.catch_up}`)),
    history.length
      ? h("div", { class: "scroll" }, h("table", {},
          h("caption", {}, "Recent firings, newest first"),
          h("thead", {}, h("tr", {}, ["Fired", "Kind", "Status", "Run"].map((n) => h("th", { scope: "col" }, n)))),
          h("tbody", {}, history.map((firing) => h("tr", {},
            h("td", {}, when(firing.fired_at)),
            h("td", {}, firing.kind),
            h("td", {}, firing.status, firing.reason ? ` (${firing.reason})` : ""),
            h("td", { class: "mono" }, firing.run_id
              ? h("a", { href: `#/run/${encodeURIComponent(firing.run_id)}` }, firing.run_id) : ""))))))
      : h("p", { class: "muted" }, "Not fired yet."));
}
