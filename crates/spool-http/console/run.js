// One run: its transcript (from the snapshot, then its stream, live as
// the model writes), what it waits on, its journal as a timeline, and
// the actions on it (message, cancel, reset, delete).

import { call, follow, query } from "./api.js";
import { cost, fill, h, json, say, sayError, stateBadge, tokens, when } from "./dom.js";

export function render(main, [id, tab], { refreshBadge }) {
  if (!id) {
    location.hash = "#/runs";
    return;
  }
  const path = `/runs/${encodeURIComponent(id)}`;
  const header = h("section", { class: "head run-head" });
  const facts = h("dl", { class: "facts" });
  const waiting = h("section", { class: "waiting", "aria-label": "What the run waits for", hidden: true });
  const transcript = h("ol", { class: "transcript", id: "transcript", "aria-label": "Transcript", "aria-live": "polite" });
  const live = h("span", { class: "live muted", id: "stream-status" });
  const timeline = h("section", { class: "timeline", id: "timeline" });
  const tabs = h("nav", { class: "tabs", "aria-label": "Views of the run" },
    h("a", { href: `#/run/${encodeURIComponent(id)}`, "aria-current": tab ? null : "page" }, "Transcript"),
    h("a", { href: `#/run/${encodeURIComponent(id)}/journal`, "aria-current": tab === "journal" ? "page" : null }, "Journal"));

  let view = null;
  let stopStream = () => {};
  let pending = null; // the assistant's answer as it streams in

  function showView(reply) {
    view = reply;
    fill(header,
      h("h1", {}, reply.title || id),
      stateBadge(reply.state, reply.suspend && reply.suspend.kind),
      actions());
    showWaiting();
  }

  async function refreshFacts() {
    try {
      // The run's row carries the totals (turns, tokens, cost, failure).
      const row = await call(`${path}/summary`);
      view = { ...view, title: row.title, state: row.state, suspend: row.suspend, call: row.call };
      fill(facts,
        fact("Run", h("span", { class: "mono" }, row.id)),
        row.address ? fact("Address", h("span", { class: "mono" }, row.address)) : null,
        fact("Turns", row.turns),
        fact("Tokens", tokens(row.usage) || "0"),
        row.cost_usd !== undefined ? fact("Cost", cost(row.cost_usd)) : null,
        fact("Created", when(row.created)),
        fact("Updated", when(row.updated)),
        row.failure ? fact("Failure", h("span", { class: "mono" }, `${row.failure.code}: ${row.failure.message}`)) : null,
        row.forked_from ? fact("Forked from", [
          h("a", { href: `#/run/${encodeURIComponent(row.forked_from.run_id)}`, class: "mono" }, row.forked_from.run_id),
          ` ${row.forked_from.cut} turn `, h("span", { class: "mono" }, row.forked_from.turn_id)]) : null);
      showView(view);
    } catch (error) {
      sayError(error);
    }
  }

  function actions() {
    const active = view && (view.state === "running" || view.state === "waiting");
    return h("div", { class: "actions" },
      h("button", {
        type: "button", id: "cancel", disabled: !active,
        onclick: async () => {
          try {
            await call(`${path}/cancel`, { method: "POST", body: { turn_id: view.turn_id || null } });
            say("Cancel requested.");
          } catch (error) { sayError(error); }
        },
      }, "Cancel turn"),
      h("button", {
        type: "button", id: "reset", class: "danger", disabled: view && view.state === "retired",
        onclick: async () => {
          if (!confirm("Reset retires this run for good and frees its address. Go on?")) return;
          try {
            await call(`${path}/reset`, { method: "POST", body: {} });
            say("The run was reset.");
            refreshFacts();
          } catch (error) { sayError(error); }
        },
      }, "Reset"),
      h("button", {
        type: "button", id: "delete", class: "danger",
        onclick: async () => {
          const turn = active ? " Its turn in progress is cancelled first." : "";
          if (!confirm(`Delete removes this run and its whole history for good; only a tombstone stays.${turn} Go on?`)) return;
          try {
            await call(`${path}${active ? "?force=true" : ""}`, { method: "DELETE" });
            say("The run was deleted.");
            location.hash = "#/runs";
          } catch (error) { sayError(error); }
        },
      }, "Delete"));
  }

  let shownSuspension = null;
  function showWaiting() {
    const suspend = view && view.state === "waiting" ? view.suspend : null;
    waiting.hidden = !suspend;
    const key = suspend ? `${suspend.turn_id}/${suspend.tool_call_id}/${Boolean(view.call)}` : null;
    // The same suspension keeps its form, and what is being typed in it.
    if (key === shownSuspension) return;
    shownSuspension = key;
    if (!suspend) return fill(waiting);
    fill(waiting, answerForm({ id, suspend, call: view.call }, async () => {
      refreshBadge();
      await refreshFacts();
    }));
  }

  // The transcript: settled messages from the snapshot, then what the
  // stream adds after the snapshot's cursor.
  function add(entry) {
    transcript.append(entry);
    entry.scrollIntoView({ block: "nearest" });
  }

  function settlePending(text) {
    if (pending) {
      if (text !== undefined) pending.querySelector(".text").textContent = text;
      pending.classList.remove("streaming");
      pending.removeAttribute("aria-busy");
      pending = null;
    } else if (text) {
      add(message("assistant", text));
    }
  }

  function onLine(line) {
    switch (line.type) {
      case "run_turn":
      case "run_input":
        settlePending();
        add(message("user", line.text || ""));
        break;
      case "text_delta":
        if (!pending) {
          pending = message("assistant", "");
          pending.classList.add("streaming");
          pending.setAttribute("aria-busy", "true");
          add(pending);
        }
        pending.querySelector(".text").textContent += line.text || "";
        break;
      case "tool_call":
        // The model's message before its calls is complete by now.
        settlePending();
        add(toolCall(line.data.name, line.data.input, line.data.call_id));
        break;
      case "tool_result":
        add(toolResult(line.text, Boolean(line.data && line.data.error), line.data && line.data.call_id));
        break;
      case "tool_progress":
        say(`${line.text || ""}`);
        break;
      case "run_suspend":
        settlePending();
        add(h("li", { class: "msg system" }, h("span", { class: "who" }, "waiting"),
          h("p", { class: "text" }, line.text || "")));
        refreshFacts();
        refreshBadge();
        break;
      case "run_resume":
        add(h("li", { class: "msg user answer" }, h("span", { class: "who" }, "answer"),
          h("p", { class: "text" }, answersText(line.data && line.data.answers))));
        refreshBadge();
        break;
      case "run_response":
        settlePending(line.text || "");
        break;
      case "run_state":
        if (line.state === "failed" && line.data) {
          settlePending();
          add(h("li", { class: "msg failure" }, h("span", { class: "who" }, "failed"),
            h("p", { class: "text" }, `${line.data.code}: ${line.data.message || line.text || ""}`)));
        }
        if (line.state === "cancelled") {
          settlePending();
          add(h("li", { class: "msg system" }, h("span", { class: "who" }, "cancelled"),
            h("p", { class: "text" }, "The turn was cancelled.")));
        }
        if (view) showView({ ...view, state: line.state, suspend: line.state === "waiting" ? view.suspend : null });
        refreshFacts();
        break;
      default:
        break;
    }
  }

  async function openTranscript() {
    try {
      const snapshot = await call(`${path}/snapshot`);
      showView(snapshot);
      fill(transcript, snapshot.messages.flatMap(render_message));
      performance.mark("spool:transcript-rendered");
      refreshFacts();
      stopStream = follow(id, snapshot.cursor ?? null, onLine, (status, error) => {
        live.textContent = status === "live" ? "● live" : status === "reconnecting" ? "reconnecting…" : "";
        if (error) sayError(error);
      });
    } catch (error) {
      sayError(error);
    }
  }

  const composer = messageForm(path, refreshFacts);
  if (tab === "journal") {
    fill(main, header, facts, tabs, timeline);
    call(path).then(showView).then(refreshFacts).catch(sayError);
    journal(path, timeline);
  } else {
    fill(main, header, facts, tabs, waiting,
      h("div", { class: "transcript-head" }, h("h2", {}, "Transcript"), live),
      transcript, composer);
    openTranscript();
  }
  return () => stopStream();
}

function fact(name, value) {
  return [h("dt", {}, name), h("dd", {}, value)];
}

function message(role, text) {
  return h("li", { class: `msg ${role}` }, h("span", { class: "who" }, role), h("p", { class: "text" }, text));
}

function toolCall(name, input, callId) {
  return h("li", { class: "msg tool", dataset: { call: callId || "" } },
    h("span", { class: "who" }, "tool call"),
    h("details", {}, h("summary", {}, h("code", {}, name)), json(input)));
}

function toolResult(text, isError, callId) {
  return h("li", { class: `msg tool-result${isError ? " error" : ""}`, dataset: { call: callId || "" } },
    h("span", { class: "who" }, isError ? "tool error" : "tool result"),
    h("pre", { class: "text" }, text || ""));
}

function answersText(answers) {
  if (!answers || !answers.length) return "";
  return answers.map((a) => {
    if (a.approved === true) return a.text ? `approved: ${a.text}` : "approved";
    if (a.approved === false) return a.text ? `rejected: ${a.text}` : "rejected";
    return a.text || "";
  }).join("\n");
}

/** A snapshot message as transcript entries. */
function render_message(msg) {
  const out = [];
  const parts = Array.isArray(msg.content) ? msg.content : [];
  if (msg.answers) {
    out.push(h("li", { class: "msg user answer" }, h("span", { class: "who" }, "answer"),
      h("p", { class: "text" }, answersText(msg.answers))));
    return out;
  }
  const text = parts.filter((p) => p.type === "text").map((p) => p.text).join("");
  if (text) out.push(message(msg.role, text));
  for (const part of parts) {
    if (part.type === "tool_call") out.push(toolCall(part.name, part.arguments, part.id));
    if (part.type === "tool_result") {
      const shown = typeof part.content === "string" ? part.content : JSON.stringify(part.content);
      out.push(toolResult(shown, Boolean(part.is_error), part.tool_call_id));
    }
  }
  return out;
}

/** Sending a message: steered into the running turn, or queued after it. */
function messageForm(path, after) {
  const text = h("textarea", { id: "message-text", name: "text", rows: 2, required: true, placeholder: "Message the run" });
  const policy = h("select", { id: "message-policy", name: "policy" },
    h("option", { value: "steer" }, "Steer into the running turn"),
    h("option", { value: "queue" }, "Queue after it"));
  return h("form", {
    class: "composer",
    onsubmit: async (event) => {
      event.preventDefault();
      try {
        // Answered at once: the stream shows the turn.
        await call(path, { method: "POST", body: { text: text.value, turn_policy: policy.value }, prefer: "respond-async" });
        text.value = "";
        after();
      } catch (error) {
        sayError(error);
      }
    },
  },
  h("label", { for: "message-text", class: "visually-hidden" }, "Message"), text,
  h("div", { class: "row" },
    h("label", { for: "message-policy", class: "visually-hidden" }, "When a turn is running"), policy,
    h("button", { type: "submit", class: "primary" }, "Send")));
}

/**
 * The answer to a suspension: approve or reject an approval, pick an
 * option or write text for a question. Shared with the inbox.
 */
export function answerForm({ id, suspend, call: parked }, done) {
  const path = `/runs/${encodeURIComponent(id)}/respond`;
  const note = h("input", { id: `answer-${id}`, name: "text", autocomplete: "off",
    placeholder: suspend.kind === "approval" ? "Optional note" : "Your answer" });
  async function send(answer) {
    try {
      await call(path, { method: "POST", body: { responses: [{ turn_id: suspend.turn_id, ...answer }] }, prefer: "respond-async" });
      say("Answered.");
      await done();
    } catch (error) {
      sayError(error);
    }
  }
  const buttons = [];
  if (suspend.kind === "approval") {
    buttons.push(
      h("button", { type: "button", class: "primary", onclick: () => send({ approved: true, text: note.value }) }, "Approve"),
      h("button", { type: "button", class: "danger", onclick: () => send({ approved: false, text: note.value }) }, "Reject"));
  } else {
    for (const option of suspend.options || []) {
      buttons.push(h("button", { type: "button", onclick: () => send({ text: option }) }, option));
    }
    buttons.push(h("button", { type: "submit", class: "primary" }, "Send answer"));
  }
  return h("form", {
    class: "answer",
    onsubmit: (event) => {
      event.preventDefault();
      if (suspend.kind !== "approval") send({ text: note.value });
    },
  },
  h("p", { class: "prompt" }, h("strong", {}, suspend.kind === "approval" ? "Approval: " : "Question: "), suspend.prompt),
  parked ? h("details", { open: true }, h("summary", {}, "Call ", h("code", {}, parked.name)), json(parked.arguments)) : null,
  suspend.kind === "question" || suspend.kind === "approval" || suspend.kind === "custom"
    ? [h("label", { for: `answer-${id}` }, suspend.kind === "approval" ? "Note" : "Answer"), note,
       h("div", { class: "row" }, buttons)]
    : h("p", { class: "muted" }, `This run waits on ${suspend.kind}; it is answered elsewhere.`));
}

/** The journal: every recorded event with its time, turn, duration,
 *  tokens and cost, paged by the API's cursor; each event's JSON on
 *  demand, and the page's raw events. */
function journal(path, section) {
  const body = h("tbody");
  const more = h("button", { type: "button", id: "journal-more", hidden: true }, "Load more");
  const raw = h("pre", { class: "json", id: "journal-raw", hidden: true });
  const events = [];
  let after = null;
  async function load() {
    try {
      const page = await call(`${path}/events` + query({ after, limit: 500 }));
      events.push(...page.events);
      for (const event of page.events) body.append(eventRow(event, path));
      after = page.next ?? null;
      more.hidden = page.next === undefined || page.next === null;
      if (!raw.hidden) raw.textContent = JSON.stringify(events, null, 2);
    } catch (error) {
      sayError(error);
    }
  }
  more.addEventListener("click", load);
  const toggle = h("button", {
    type: "button", id: "journal-raw-toggle",
    onclick: () => {
      raw.hidden = !raw.hidden;
      raw.textContent = raw.hidden ? "" : JSON.stringify(events, null, 2);
    },
  }, "Raw events (JSON)");
  fill(section,
    h("div", { class: "row" }, h("h2", {}, "Journal"), toggle),
    h("div", { class: "scroll" },
      h("table", { class: "events" },
        h("thead", {}, h("tr", {},
          ["#", "Time", "Event", "Turn", "Took", "Tokens", "Cost", ""].map((n) => h("th", { scope: "col" }, n)))),
        body)),
    more, raw);
  load();
}

const ENDS = new Set(["turn_completed", "turn_failed", "turn_cancelled"]);

/** A fork of the run cut at this event's turn: before it starts, or
 *  through its end. */
function forkButton(path, event) {
  const cut = event.kind === "turn_started" ? "before" : ENDS.has(event.kind) ? "after" : null;
  if (!cut || !event.turn_id) return null;
  return h("button", {
    type: "button", class: "quiet",
    onclick: async () => {
      try {
        const fork = await call(`${path}/fork`, { method: "POST", body: { [cut]: event.turn_id } });
        // The fork's page says where it came from.
        location.hash = `#/run/${encodeURIComponent(fork.run_id)}`;
      } catch (error) {
        sayError(error);
      }
    },
  }, cut === "before" ? "Fork before" : "Fork after");
}

function eventRow(event, path) {
  const detail = h("details", {}, h("summary", {}, "data"), json(event.data));
  return h("tr", { class: `event event-${event.kind}` },
    h("td", { class: "num" }, event.seq),
    h("td", { title: event.time }, new Date(event.time).toLocaleTimeString()),
    h("td", { class: "mono" }, event.kind),
    h("td", { class: "mono muted" }, event.turn_id || ""),
    h("td", { class: "num" }, event.duration_ms !== undefined ? `${event.duration_ms} ms` : ""),
    h("td", { class: "num" }, event.usage ? tokens(event.usage) : ""),
    h("td", { class: "num" }, cost(event.cost_usd)),
    h("td", {}, detail, forkButton(path, event)));
}
