"""The console's speed as a browser sees it: the run list with many runs
in the journal (first paint, and the answer to a filter and a search) and
the page of a run with many turns, each from the browser's own timings
(`performance` marks the console sets when it has drawn), the median of
several loads.

Usage: console_timings.py CHROMIUM SPOOL WORK_DIR RUNS TURNS

Seeds a journal through `spool serve`'s API (RUNS runs, one of them with
TURNS turns), then loads the console in Debian's Chromium under
Playwright. Prints what it measured; it asserts nothing about time.
"""

import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

from playwright.sync_api import expect, sync_playwright

CHROMIUM, SPOOL, WORK, RUNS, TURNS = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
LOADS = 5


def start():
    proc = subprocess.Popen(
        [SPOOL, "serve", "--addr", "127.0.0.1:0", "--journal", os.path.join(WORK, "journal")],
        stderr=subprocess.PIPE, text=True, cwd=WORK)
    for line in proc.stderr:
        found = re.search(r"listening on (\S+)", line)
        if found:
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, found.group(1)
    raise SystemExit("spool serve ended before listening")


def post(conn, path, body):
    conn.request("POST", "/spool/v1" + path, json.dumps(body), {"Content-Type": "application/json"})
    reply = conn.getresponse()
    data = reply.read()
    if reply.status != 200:
        raise SystemExit(f"POST {path}: {reply.status} {data[:200]!r}")
    return json.loads(data)


def seed(addr):
    host, port = addr.rsplit(":", 1)
    began = time.monotonic()
    long_run = None
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    long_run = post(conn, "/runs", {"text": "turn 0", "title": "A long conversation"})["run_id"]
    for n in range(1, TURNS):
        post(conn, f"/runs/{long_run}", {"text": f"turn {n}"})
    print(f"seeded a run of {TURNS} turns in {time.monotonic() - began:.1f} s", flush=True)
    began = time.monotonic()
    counter = iter(range(RUNS - 1))
    lock = threading.Lock()

    def worker():
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        while True:
            with lock:
                n = next(counter, None)
            if n is None:
                return
            post(conn, "/runs", {"text": f"hello {n}", "title": f"run {n}"})

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"seeded {RUNS - 1} more runs in {time.monotonic() - began:.1f} s", flush=True)
    return long_run


def mark(page, name, first=False):
    """The latest (or first) mark `name`, in ms since the page's
    navigation began. The page's policy forbids `eval`, so the page is
    waited on through what it shows (Playwright's `expect`), and the
    marks read once it shows it."""
    at = 0 if first else -1
    return page.evaluate(f"performance.getEntriesByName({json.dumps(name)}).at({at}).startTime")


def measure(browser, url, long_run):
    first, state_filter, search, run_page = [], [], [], []
    for _ in range(LOADS):
        context = browser.new_context(viewport={"width": 1280, "height": 860})
        page = context.new_page()
        page.goto(url + "/#/runs")
        expect(page.locator("tr[data-run]")).to_have_count(50, timeout=60000)
        first.append(mark(page, "spool:runs-rendered", first=True))
        # A state no run is in: the whole journal is filtered to nothing.
        page.evaluate("performance.clearMarks()")
        page.get_by_label("State").select_option("failed")
        expect(page.locator("td.empty")).to_be_visible(timeout=60000)
        state_filter.append(mark(page, "spool:runs-rendered", first=True) - mark(page, "spool:filter"))
        page.get_by_label("State").select_option("")
        expect(page.locator("tr[data-run]")).to_have_count(50, timeout=60000)
        # "run 4242" and "run 42420" to "run 42429": eleven runs.
        page.get_by_label("Search").fill("run 4242")
        page.evaluate("performance.clearMarks()")
        page.get_by_label("Search").press("Enter")
        expect(page.locator("#runs-total")).to_have_text("1–11 of 11 runs", timeout=60000)
        search.append(mark(page, "spool:runs-rendered", first=True) - mark(page, "spool:filter", first=True))
        page.close()
        page = context.new_page()
        page.goto(f"{url}/#/run/{long_run}")
        expect(page.locator(".msg").first).to_be_visible(timeout=60000)
        run_page.append(mark(page, "spool:transcript-rendered", first=True))
        messages = page.locator(".msg").count()
        context.close()
    return first, state_filter, search, run_page, messages


def main():
    os.makedirs(WORK, exist_ok=True)
    proc, addr = start()
    try:
        long_run = seed(addr)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"])
            first, state_filter, search, run_page, messages = measure(browser, f"http://{addr}", long_run)
            browser.close()
    finally:
        proc.kill()
        proc.wait()
    report = {
        "runs": RUNS,
        "turns": TURNS,
        "list_first_paint_ms": statistics.median(first),
        "state_filter_ms": statistics.median(state_filter),
        "search_ms": statistics.median(search),
        "run_page_ms": statistics.median(run_page),
        "run_page_messages": messages,
        "samples": {"list": first, "state_filter": state_filter, "search": search, "run_page": run_page},
    }
    print(json.dumps(report, indent=2), flush=True)


if __name__ == "__main__":
    main()
