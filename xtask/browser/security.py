"""A real browser against `spool serve`: a page on another origin tries
to start a run with a form, with `fetch` in both modes and with a
WebSocket, and the run count stays 0; the same attempts from an allowed
origin start runs and read their replies.

Usage: security.py CHROMIUM SPOOL_ADDR ALLOWED_PORT FOREIGN_PORT

Driven by Playwright for Python with the system's Chromium (nothing is
downloaded). The pages are served by this script on localhost at the two
ports: `http://localhost:ALLOWED_PORT` is the origin `spool serve` was
given with --allow-origin, `http://localhost:FOREIGN_PORT` is any other
site the user happens to open.
"""

import http.server
import json
import sys
import threading
import urllib.request

from playwright.sync_api import sync_playwright

CHROMIUM, SPOOL, ALLOWED, FOREIGN = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
API = f"http://{SPOOL}/spool/v1"

# Every way a page can send a run to a local server, each settling into
# `window.outcomes[name]` (what the page could see of the answer).
PAGE = """<!doctype html>
<meta charset="utf-8">
<title>a page</title>
<iframe name="sink"></iframe>
<form id="form" method="POST" enctype="text/plain" target="sink" action="API/runs">
  <input name='{"text": "from a form", "x": "' value='"}'>
</form>
<script>
window.outcomes = {};
const settle = (name, value) => { window.outcomes[name] = value; };
document.querySelector("iframe").addEventListener("load", () => settle("form", "sent"));
document.getElementById("form").submit();
fetch("API/runs", {method: "POST", mode: "no-cors", body: '{"text": "no-cors"}',
                   headers: {"Content-Type": "text/plain"}})
  .then(r => settle("no-cors", "opaque " + r.type), e => settle("no-cors", "error " + e));
fetch("API/runs", {method: "POST", body: '{"text": "cors"}',
                   headers: {"Content-Type": "application/json"}})
  .then(r => r.json()).then(j => settle("cors", j.response || JSON.stringify(j)),
                            e => settle("cors", "error " + e));
try {
  const ws = new WebSocket("ws://SPOOL/ws", ["spool.v1"]);
  ws.onopen = () => ws.send(JSON.stringify({jsonrpc: "2.0", id: 1, method: "submit.run",
                                            params: {text: "over a websocket"}}));
  ws.onmessage = (m) => { const j = JSON.parse(m.data);
                          if (j.id === 1) { settle("websocket", j.result ? j.result.response : "refused"); ws.close(); } };
  ws.onerror = () => settle("websocket", "error");
} catch (e) { settle("websocket", "error " + e); }
</script>
""".replace("API", API).replace("SPOOL", SPOOL)


class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = PAGE.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def serve_page(port):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def runs():
    """The runs the server holds, asked as curl would (no Origin)."""
    with urllib.request.urlopen(f"{API}/runs", timeout=10) as reply:
        return json.load(reply)["runs"]


def visit(browser, port, settled):
    page = browser.new_page()
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(f"http://localhost:{port}/")
    # Waits on the page's own outcomes, with a deadline that fails.
    page.wait_for_function(
        f"() => {json.dumps(settled)}.every(n => n in window.outcomes)", timeout=20000
    )
    outcomes = page.evaluate("window.outcomes")
    page.close()
    return outcomes, errors


def main():
    failures, checked = [], []

    def check(claim, ok, detail):
        print(("ok   " if ok else "FAIL ") + claim + ("" if ok else f": {detail}"))
        checked.append(claim)
        if not ok:
            failures.append(claim)

    serve_page(ALLOWED)
    serve_page(FOREIGN)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        outcomes, errors = visit(browser, FOREIGN, ["form", "no-cors", "cors", "websocket"])
        print("foreign origin:", outcomes)
        check("a page on another origin starts no run (form, fetch both modes, WebSocket)",
              runs() == [], runs())
        check("its cors fetch cannot read an answer", outcomes["cors"].startswith("error"), outcomes)
        check("its WebSocket is refused before it opens", outcomes["websocket"] == "error", outcomes)
        check("the browser saw the refusals", any("403" in e or "CORS" in e or "WebSocket" in e for e in errors), errors)

        outcomes, _ = visit(browser, ALLOWED, ["cors", "websocket"])
        print("allowed origin:", outcomes)
        check("a page on an allowed origin starts a run and reads its reply",
              outcomes["cors"] == "echo: cors", outcomes)
        check("and drives a run over a WebSocket", outcomes["websocket"] == "echo: over a websocket", outcomes)
        # The allowed page's form and no-cors fetch are still refused on
        # their content type: only JSON is taken, from any origin.
        check("only the allowed page's JSON requests made runs", len(runs()) == 2, runs())
        browser.close()
    print(f"{len(checked) - len(failures)} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)


main()
