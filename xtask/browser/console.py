"""The web console in a real browser: Debian's Chromium driven by
Playwright for Python (given the system browser's path; nothing is
downloaded), against `spool serve` started here with scripted agents.

Usage: console.py CHROMIUM SPOOL WORK_DIR [SCREENSHOT_DIR]

Each scenario opens the console as a user would, acts through its
controls, and waits on what the page shows (Playwright's `expect`, whose
timeout fails the check); nothing sleeps. Every console error and failed
request the browser reports is collected and must be none, except where
a scenario expects one (a refused token's 401) and says so.
"""

import json
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request

from playwright.sync_api import expect, sync_playwright

CHROMIUM, SPOOL, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
SHOTS = sys.argv[4] if len(sys.argv) > 4 else None
WAIT = 20000  # ms: every wait below fails after this long

WORDS = " ".join(f"word{n}" for n in range(1, 41)) + "."
STREAM = [{"text": WORDS, "delay_ms": 50, "usage": {"input_tokens": 120, "output_tokens": 40}}]
LONG = [{"text": " ".join(f"slow{n}" for n in range(400)), "delay_ms": 100}]
QUESTION = [
    {"text": "Let me ask.", "tool_calls": [{"id": "call_q", "name": "ask_human",
                                             "arguments": {"prompt": "Which colour?", "options": ["red", "blue"]}}]},
    {"text": "Blue it is."},
]
PRICING = "[pricing]\ninput_per_million = 3.0\noutput_per_million = 15.0\n"


class Server:
    """`spool serve` on a free loopback port with a scripted agent."""

    def __init__(self, name, script=None, agent=None, tools=(), args=(), extra="", triggers=()):
        self.dir = os.path.join(WORK, name)
        os.makedirs(self.dir, exist_ok=True)
        if agent is None:
            with open(os.path.join(self.dir, "script.jsonl"), "w") as f:
                f.write("".join(json.dumps(line) + "\n" for line in script))
            agent = os.path.join(self.dir, "spool.toml")
            with open(agent, "w") as f:
                f.write(f'[agent]\nname = "{name}"\nengine = "scripted:script.jsonl"\n')
                f.write(f"builtin_tools = {json.dumps(list(tools))}\n{PRICING}{extra}")
        self.tokens = {}
        args = list(args)
        if "--token-file" in args:
            path = args[args.index("--token-file") + 1]
            for who in ("alice", "bob"):
                scope = ["--trigger"] if who in triggers else []
                out = subprocess.run([SPOOL, "token", "new", who, "--token-file", path, *scope],
                                     check=True, capture_output=True, text=True)
                self.tokens[who] = out.stdout.strip()
        self.proc = subprocess.Popen(
            [SPOOL, "serve", "--addr", "127.0.0.1:0", "--journal", os.path.join(self.dir, "journal"),
             "--agent", agent, *args],
            stderr=subprocess.PIPE, text=True, cwd=self.dir)
        for line in self.proc.stderr:
            found = re.search(r"listening on (\S+)", line)
            if found:
                self.url = f"http://{found.group(1)}"
                break
        else:
            raise SystemExit(f"spool serve ({name}) ended before listening")
        # Whatever it says later is read, so its pipe never fills.
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def api(self, method, path, body=None, token=None, prefer_async=True):
        """The API as curl would call it (no Origin)."""
        request = urllib.request.Request(f"{self.url}/spool/v1{path}", method=method,
                                         data=None if body is None else json.dumps(body).encode())
        request.add_header("Content-Type", "application/json")
        if prefer_async:
            request.add_header("Prefer", "respond-async")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=20) as reply:
            return json.load(reply)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


class Checks:
    def __init__(self):
        self.failures = []

    def __call__(self, claim, ok, detail=""):
        print(("ok   " if ok else "FAIL ") + claim + ("" if ok else f": {detail}"), flush=True)
        if not ok:
            self.failures.append(claim)

    def step(self, claim, action):
        """Runs `action` (Playwright waits that raise on timeout) as a check."""
        try:
            action()
            self(claim, True)
        except Exception as error:  # noqa: BLE001 - the failure is the report
            self(claim, False, str(error).splitlines()[0] if str(error) else repr(error))


class Watched:
    """A page whose console errors and failed requests are kept."""

    def __init__(self, browser):
        self.context = browser.new_context(viewport={"width": 1280, "height": 860})
        self.page = self.context.new_page()
        self.errors = []
        self.page.on("console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on("requestfailed", self._failed)

    def _failed(self, request):
        # A request the page itself gave up is reported as a failure with
        # ERR_ABORTED: a run's stream it closes on leaving the run, and
        # whatever was in flight when a test reloads it. The server's own
        # failures come with other errors (a reset or empty reply, a
        # broken chunk) or a status, and are kept.
        if "ERR_ABORTED" in (request.failure or ""):
            return
        self.errors.append(f"request failed: {request.url} {request.failure}")

    def close(self):
        self.context.close()


def shot(page, name):
    if SHOTS:
        os.makedirs(SHOTS, exist_ok=True)
        page.screenshot(path=os.path.join(SHOTS, f"{name}.png"))


def start_from_console(page, url, text, title):
    page.goto(url + "/#/runs")
    page.get_by_text("New run").click()
    page.get_by_label("Message").fill(text)
    page.get_by_label("Title").fill(title)
    page.get_by_role("button", name="Start run").click()
    expect(page.locator(".run-head h1")).to_have_text(title, timeout=WAIT)


def streaming(check, browser):
    server = Server("stream", STREAM)
    slow = Server("slow", LONG)
    watched = Watched(browser)
    page = watched.page
    try:
        def starts_and_streams():
            start_from_console(page, server.url, "hello there", "Streamed")
            # The answer is seen part-written, then whole.
            expect(page.locator(".msg.assistant.streaming .text")).to_contain_text("word1", timeout=WAIT)
            expect(page.locator(".msg.assistant.streaming")).to_have_count(0, timeout=WAIT)
            expect(page.locator(".msg.assistant .text")).to_have_text([WORDS], timeout=WAIT)
            expect(page.locator(".msg.user .text")).to_have_text(["hello there"])
        check.step("a run started from the console streams its answer in", starts_and_streams)
        shot(page, "run")

        def journal_timeline():
            page.get_by_role("link", name="Journal").click()
            row = page.locator("tr.event-model_call_completed")
            expect(row).to_have_count(1, timeout=WAIT)
            expect(row.locator("td").nth(4)).to_contain_text("ms")
            expect(row.locator("td").nth(5)).to_have_text("160")
            expect(row.locator("td").nth(6)).to_have_text("$0.0010")
            page.get_by_role("button", name="Raw events (JSON)").click()
            expect(page.locator("#journal-raw")).to_contain_text('"kind": "turn_completed"')
        check.step("the journal shows each event with a call's duration, tokens and cost", journal_timeline)

        def fork_from_the_journal():
            source = page.url
            page.locator("tr.event-turn_completed").get_by_role("button", name="Fork after").click()
            expect(page.locator(".facts")).to_contain_text("Forked from", timeout=WAIT)
            expect(page.locator(".msg.assistant .text")).to_have_text([WORDS], timeout=WAIT)
            expect(page.locator(".msg.user .text")).to_have_text(["hello there"])
            assert page.url != source and "/run/" in page.url, page.url
        check.step("a turn is forked from the journal and the fork holds its history", fork_from_the_journal)

        def reload_mid_stream():
            start_from_console(page, server.url, "again", "Reloaded")
            expect(page.locator(".msg.assistant.streaming .text")).to_contain_text("word3", timeout=WAIT)
            page.reload()
            expect(page.locator(".run-head h1")).to_have_text("Reloaded", timeout=WAIT)
            expect(page.locator(".msg.assistant.streaming")).to_have_count(0, timeout=WAIT)
            expect(page.locator(".run-head .state")).to_have_text("completed", timeout=WAIT)
            # No gap and no duplicate: one question, one whole answer.
            expect(page.locator(".msg.user .text")).to_have_text(["again"])
            expect(page.locator(".msg.assistant .text")).to_have_text([WORDS])
        check.step("a reload mid-stream continues the transcript without a gap or a duplicate", reload_mid_stream)

        def cancel():
            start_from_console(page, slow.url, "take your time", "To cancel")
            expect(page.locator(".msg.assistant.streaming .text")).to_contain_text("slow1", timeout=WAIT)
            page.get_by_role("button", name="Cancel turn").click()
            expect(page.locator(".run-head .state")).to_have_text("cancelled", timeout=WAIT)
            expect(page.locator(".msg.system .text")).to_have_text(["The turn was cancelled."], timeout=WAIT)
        check.step("cancel stops a running turn", cancel)

        def filters():
            page.goto(server.url + "/#/runs")
            rows = page.locator("table.runs tbody tr[data-run]")
            expect(rows).to_have_count(3, timeout=WAIT)
            page.get_by_label("Search").fill("reload")
            expect(rows).to_have_count(1, timeout=WAIT)
            expect(rows.first).to_contain_text("Reloaded")
            page.get_by_label("Search").fill("")
            page.get_by_label("State").select_option("failed")
            expect(page.locator("td.empty")).to_have_text("No runs match.", timeout=WAIT)
            page.get_by_label("State").select_option("completed")
            expect(rows).to_have_count(3, timeout=WAIT)
            expect(page.locator("#runs-total")).to_have_text("1–3 of 3 runs")
        check.step("the list filters by state and by a search", filters)

        def live_list():
            page.get_by_label("State").select_option("")
            started = server.api("POST", "/runs", {"text": "from outside", "title": "Arrived live"})
            expect(page.locator(f'tr[data-run="{started["run_id"]}"]')).to_contain_text("Arrived live", timeout=WAIT)
            expect(page.locator(f'tr[data-run="{started["run_id"]}"] td').nth(5)).to_have_text("160", timeout=WAIT)
        check.step("the list shows a run started elsewhere without a reload, with its tokens", live_list)
        shot(page, "runs")

        def phone_and_dark():
            phone = browser.new_context(viewport={"width": 390, "height": 844}, color_scheme="dark",
                                        is_mobile=True, has_touch=True)
            try:
                small = phone.new_page()
                small.on("console", lambda m: watched.errors.append(f"console: {m.text}") if m.type == "error" else None)
                for route in ("/#/runs", "/#/inbox", "/#/schedules"):
                    small.goto(server.url + route)
                    expect(small.locator("main h1")).to_be_visible(timeout=WAIT)
                    # Nothing but a table's own scroller is wider than the screen.
                    wide = small.evaluate("document.documentElement.scrollWidth")
                    assert wide <= 390, f"{route} is {wide} px wide at 390"
                background = small.evaluate("getComputedStyle(document.body).backgroundColor")
                assert background == "rgb(18, 20, 24)", f"the dark scheme's background, not {background}"
                small.locator("#theme").click()
                expect(small.locator("body")).to_have_css("background-color", "rgb(247, 247, 248)")
            finally:
                phone.close()
        check.step("every page fits a phone's width, in the dark scheme and the light one", phone_and_dark)

        def delete():
            page.goto(server.url + "/#/runs")
            row = page.locator("table.runs tbody tr[data-run]").filter(has_text="Arrived live")
            expect(row).to_have_count(1, timeout=WAIT)
            run = row.get_attribute("data-run")
            page.goto(server.url + f"/#/run/{run}")
            expect(page.locator(".run-head h1")).to_have_text("Arrived live", timeout=WAIT)
            page.once("dialog", lambda dialog: dialog.accept())
            page.get_by_role("button", name="Delete").click()
            expect(page.locator(f'tr[data-run="{run}"]')).to_have_count(0, timeout=WAIT)
            expect(page.locator("table.runs tbody tr[data-run]")).to_have_count(3, timeout=WAIT)
            try:
                server.api("GET", f"/runs/{run}", prefer_async=False)
                raise AssertionError("the deleted run is still served")
            except urllib.error.HTTPError as gone:
                assert gone.code == 410 and json.load(gone)["code"] == "run_deleted", gone.code
        check.step("a run deleted from its page leaves the list and answers 410 run_deleted", delete)
        check("no console error or failed request (streams)", not watched.errors, watched.errors)
    finally:
        watched.close()
        server.stop()
        slow.stop()


def approval(check, browser):
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "approval", "spool.toml")
    server = Server("approval", agent=os.path.abspath(example))
    watched = Watched(browser)
    page = watched.page
    try:
        started = server.api("POST", "/runs", {"text": "ship it", "title": "Deploy"}, prefer_async=False)
        check("the approval example's run waits for approval", started["state"] == "waiting", started)

        def answered_in_the_inbox():
            page.goto(server.url + "/")
            expect(page.locator("#inbox-count")).to_have_text("1", timeout=WAIT)
            page.get_by_role("link", name=re.compile("^Inbox")).click()
            card = page.locator(f'.card[data-run="{started["run_id"]}"]')
            expect(card).to_contain_text("Deploy the plan to staging?", timeout=WAIT)
            expect(card.locator("pre.json")).to_contain_text('"prompt": "Deploy the plan to staging?"')
            shot(page, "inbox")
            card.get_by_role("button", name="Approve").click()
            expect(card).to_have_count(0, timeout=WAIT)
            expect(page.locator("#inbox-count")).to_be_hidden(timeout=WAIT)
            page.goto(f"{server.url}/#/run/{started['run_id']}")
            expect(page.locator(".msg.assistant .text").last).to_have_text(
                "Approved, so the plan is deployed to staging.", timeout=WAIT)
            expect(page.locator(".run-head .state")).to_have_text("completed", timeout=WAIT)
        check.step("an approval is answered from the inbox and the run completes", answered_in_the_inbox)
        check("no console error or failed request (approval)", not watched.errors, watched.errors)
    finally:
        watched.close()
        server.stop()


def question(check, browser):
    server = Server("question", QUESTION, tools=["ask_human"])
    watched = Watched(browser)
    page = watched.page
    try:
        def answered_with_text():
            start_from_console(page, server.url, "paint it", "Colour")
            form = page.locator(".waiting form.answer")
            expect(form).to_contain_text("Which colour?", timeout=WAIT)
            form.get_by_label("Answer").fill("blue")
            form.get_by_role("button", name="Send answer").click()
            expect(page.locator(".msg.assistant .text").last).to_have_text("Blue it is.", timeout=WAIT)
            expect(page.locator(".msg.answer .text")).to_have_text(["blue"], timeout=WAIT)
            expect(page.locator(".waiting")).to_be_hidden(timeout=WAIT)
        check.step("a question is answered with text on the run's page", answered_with_text)
        check("no console error or failed request (question)", not watched.errors, watched.errors)
    finally:
        watched.close()
        server.stop()


def tokens(check, browser):
    nightly = '\n[[schedule]]\nname = "nightly"\ncron = "0 3 * * *"\ntext = "Tidy up."\n'
    server = Server("tokens", STREAM, args=["--token-file", os.path.join(WORK, "tokens.tok")],
                    extra=nightly, triggers=("alice",))
    owner = Server("owner", STREAM, args=["--token-file", os.path.join(WORK, "owner.tok"),
                                          "--run-access", "owner"])
    watched = Watched(browser)
    page = watched.page
    # Alice's tab on the owner server holds her token from the start, as
    # after a sign-in.
    alice = Watched(browser)
    alice.context.add_init_script(
        f"sessionStorage.setItem('spool.token', {json.dumps(owner.tokens['alice'])})")
    try:
        def signs_in():
            page.goto(server.url + "/")
            dialog = page.get_by_role("dialog", name="Sign in")
            expect(dialog).to_be_visible(timeout=WAIT)
            dialog.get_by_label("Token").fill("not-a-token")
            dialog.get_by_role("button", name="Sign in").click()
            expect(dialog.locator("#sign-in-error")).to_have_text("The token was refused.", timeout=WAIT)
            dialog.get_by_label("Token").fill(server.tokens["alice"])
            dialog.get_by_role("button", name="Sign in").click()
            expect(dialog).to_be_hidden(timeout=WAIT)
            # The list is read with the token (the schedule's record run
            # is in it).
            expect(page.locator("#runs-total")).to_have_text(re.compile(r" of \d+ runs?$"), timeout=WAIT)
            # The token stays in the tab, never in a URL.
            assert server.tokens["alice"] not in page.url
        check.step("without a token the console asks for one, refuses a wrong one and takes a right one", signs_in)

        def schedules():
            page.get_by_role("link", name="Schedules").click()
            card = page.locator('.card[data-schedule="nightly"]')
            expect(card).to_contain_text("0 3 * * * (UTC)", timeout=WAIT)
            expect(card).to_contain_text("Not fired yet.")
            card.get_by_role("button", name="Trigger now").click()
            expect(page.locator(".notice")).to_contain_text("Fired: started", timeout=WAIT)
            expect(card.locator("tbody tr")).to_have_count(1, timeout=WAIT)
            expect(card.locator("tbody tr td").nth(1)).to_have_text("manual")
            # Bob's token may not trigger: no button is offered to him.
            page.get_by_role("button", name="Sign out").click()
            dialog = page.get_by_role("dialog", name="Sign in")
            expect(dialog).to_be_visible(timeout=WAIT)
            dialog.get_by_label("Token").fill(server.tokens["bob"])
            dialog.get_by_role("button", name="Sign in").click()
            expect(dialog).to_be_hidden(timeout=WAIT)
            page.get_by_role("link", name="Schedules").click()
            expect(card).to_contain_text("manual", timeout=WAIT)
            expect(card.get_by_role("button", name="Trigger now")).to_have_count(0)
        check.step("schedules show their next firing and history, with a trigger for whoever may", schedules)
        refused = [e for e in watched.errors if "401" in e]
        check("the refusals the browser saw were the server's 401s, and nothing else failed",
              refused and len(refused) == len(watched.errors), watched.errors)
        page = alice.page

        def owner_sees_own():
            theirs = owner.api("POST", "/runs", {"text": "mine", "title": "Bob's run"}, token=owner.tokens["bob"])
            mine = owner.api("POST", "/runs", {"text": "mine", "title": "Alice's run"}, token=owner.tokens["alice"])
            page.goto(owner.url + "/")
            rows = page.locator("table.runs tbody tr[data-run]")
            expect(page.locator(f'tr[data-run="{mine["run_id"]}"]')).to_be_visible(timeout=WAIT)
            expect(rows).to_have_count(1)
            expect(page.locator(f'tr[data-run="{theirs["run_id"]}"]')).to_have_count(0)
            page.goto(f"{owner.url}/#/run/{theirs['run_id']}")
            expect(page.locator(".notice-error")).to_contain_text("run_not_found", timeout=WAIT)
        check.step("under --run-access owner another principal's run is absent", owner_sees_own)
        not_found = [e for e in alice.errors if "404" in e]
        check("the other principal's run answered 404 and nothing else failed",
              not_found and len(not_found) == len(alice.errors), alice.errors)
    finally:
        alice.close()
        watched.close()
        server.stop()
        owner.stop()


def main():
    check = Checks()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        for scenario in (streaming, approval, question, tokens):
            scenario(check, browser)
        browser.close()
    if check.failures:
        print(f"{len(check.failures)} console check(s) failed", flush=True)
        sys.exit(1)
    print("every console check passed", flush=True)


if __name__ == "__main__":
    main()
