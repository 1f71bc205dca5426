// The console's shell: the hash router, sign-in, the inbox badge and the
// theme. Each page is a module with `render(main, params)` that returns a
// function to stop what it started (streams, timers).

import { call, onUnauthenticated, setToken, token, ApiError } from "./api.js";
import { fill, say } from "./dom.js";
import * as runs from "./runs.js";
import * as run from "./run.js";
import * as inbox from "./inbox.js";
import * as schedules from "./schedules.js";

const main = document.getElementById("main");
const badge = document.getElementById("inbox-count");
const dialog = document.getElementById("sign-in");
let stop = () => {};

function route() {
  stop();
  stop = () => {};
  say("");
  const hash = location.hash.replace(/^#\/?/, "").split("?")[0] || "runs";
  const [page, ...rest] = hash.split("/");
  document.querySelectorAll("[data-nav]").forEach((link) => {
    if (link.dataset.nav === page) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  });
  const pages = { runs, run, inbox, schedules };
  const chosen = pages[page] || runs;
  const params = rest.map(decodeURIComponent);
  fill(main);
  stop = chosen.render(main, params, { refreshBadge }) || (() => {});
}

/** The count of runs waiting on a question or an approval. */
export async function refreshBadge() {
  try {
    const page = await call("/runs?state=waiting&kind=question,approval&limit=1");
    badge.textContent = String(page.total);
    badge.hidden = page.total === 0;
  } catch (error) {
    if (!(error instanceof ApiError)) throw error;
    badge.hidden = true;
  }
}

function askToken() {
  if (!dialog.open) {
    document.getElementById("sign-in-error").textContent = token()
      ? "The token was refused."
      : "";
    dialog.showModal();
    document.getElementById("token").focus();
  }
}

document.getElementById("sign-in-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const input = document.getElementById("token");
  setToken(input.value.trim());
  try {
    await call("/runs?limit=1");
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      document.getElementById("sign-in-error").textContent = "The token was refused.";
      return;
    }
  }
  input.value = "";
  dialog.close();
  document.getElementById("sign-out").hidden = false;
  route();
  refreshBadge();
});

dialog.addEventListener("cancel", (event) => event.preventDefault());

document.getElementById("sign-out").addEventListener("click", () => {
  setToken(null);
  document.getElementById("sign-out").hidden = true;
  badge.hidden = true;
  // The page read again without a token: the server asks for one.
  if (location.hash.startsWith("#/runs")) route();
  else location.hash = "#/runs";
});

const THEME = "spool.theme";
function applyTheme(theme) {
  if (theme) document.documentElement.dataset.theme = theme;
  else delete document.documentElement.dataset.theme;
}
applyTheme(localStorage.getItem(THEME));
document.getElementById("theme").addEventListener("click", () => {
  const dark = document.documentElement.dataset.theme
    ? document.documentElement.dataset.theme === "dark"
    : matchMedia("(prefers-color-scheme: dark)").matches;
  const next = dark ? "light" : "dark";
  localStorage.setItem(THEME, next);
  applyTheme(next);
});

onUnauthenticated(askToken);
document.getElementById("sign-out").hidden = !token();
window.addEventListener("hashchange", route);
route();
refreshBadge();
setInterval(refreshBadge, 5000);
