"""Check the Airflow UI's "MLflow run" link in headless Chromium, and take the docs' screenshots.

Run by scripts/screenshots.sh against a running local stack (infra/local/services.sh). It seeds
a demo deployment from the committed CPU measurement and registers a second version, then
triggers the weekly DAG with its engine pool at 0 slots (no engine starts: ``measure_acceptance``
waits for a slot), stops that run as an operator would (its waiting task marked failed) and waits
until the DAG's failure callback has closed the run's MLflow run as FAILED.

Then, in headless Chromium driven through its DevTools protocol, it does what an operator does:
signs in to the Airflow UI with the login the local stack created, opens the ``start_run`` task
of that DAG run (Details tab), finds its "MLflow run" extra link and clicks it, and checks that
the tab it opens is the MLflow page of that very run, closed (not "Running"), with the whole
ending on top of its description; then it follows the description's link back to the DAG run's
page in Airflow and checks that the DAG run is there. Last, it opens the demo model's registry
pages and checks that the model's description names the serving version with its table and its
moves, and that the promoted version's description starts with its table and the gate's verdict.
Every check that fails ends the script with exit status 1 and a line saying what was not seen; the screenshots
are copied into ``--out`` (default docs/) only when every check passed.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from urllib.parse import quote
from dataclasses import replace
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

REPO = Path(__file__).resolve().parents[1]
# The local stack's Airflow REST client (infra/local), not a test helper.
sys.path[:0] = [str(REPO / "infra" / "local"), str(REPO / "plugins")]

from local_airflow import AirflowApi  # noqa: E402

from tabletune.adapters.mlflow_registry import MlflowRegistry  # noqa: E402
from tabletune.adapters.s3_prompts import make_s3_client  # noqa: E402
from tabletune.core.contracts import load_json  # noqa: E402
from tabletune.pipeline import candidate_flow, registry_admin, run_lifecycle  # noqa: E402
from tabletune.pipeline.gate import GateSettings  # noqa: E402

DAG_ID = "tabletune_acceptance_weekly"
LINK_NAME = "MLflow run"  # plugins/tabletune_airflow.py: MlflowRunLink.name
# How the DAG's failure callback closes the run when an operator marks the waiting task failed.
ENDING = "DAG run failed at task measure_acceptance"
WIDTH, HEIGHT = 1280, 800


class CheckFailed(Exception):
    """Something the operator should see in the browser was not there."""


# -------------------------------------------------------------------------------------------
# A small client of Chromium's DevTools protocol (JSON over the websockets library)


class Tab:
    """One browser tab, driven over its DevTools websocket."""

    def __init__(self, ws_url: str) -> None:
        self.ws = connect(ws_url, max_size=None, open_timeout=30)
        self.last_id = 0
        self.send("Page.enable")
        self.send("Page.bringToFront")  # typed text goes to the focused tab
        self.send("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT,
                  deviceScaleFactor=1, mobile=False)

    def send(self, method: str, **params: Any) -> dict:
        self.last_id += 1
        self.ws.send(json.dumps({"id": self.last_id, "method": method, "params": params}))
        while True:  # events (no id) arrive in between; only the reply matters here
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == self.last_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def wait_for(self, expression: str, what: str, timeout_s: float = 90) -> Any:
        """Poll ``expression`` until it is truthy (single-page apps render after load); a DOM
        node comes back as ``{}``, so test for one with ``!!``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError:  # the page navigated away mid-evaluation
                value = None
            if value:
                return value
            time.sleep(0.5)
        where = self.evaluate("location.href")
        text = " ".join((self.evaluate("document.body ? document.body.innerText : ''")
                         or "").split())[:400]
        raise CheckFailed(f"{what}: not seen within {timeout_s:.0f}s at {where} "
                          f"(page text: {text!r})")

    def wait_for_text(self, text: str, what: str, timeout_s: float = 90) -> None:
        self.wait_for(f"document.body && document.body.innerText.includes({json.dumps(text)})",
                      what, timeout_s)

    def type_into(self, selector: str, text: str) -> None:
        """Focus the field and type, as a keyboard would (React sees real input events)."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        self.send("Input.insertText", text=text)

    def click(self, element_js: str, what: str) -> None:
        """A real mouse click at the centre of the element ``element_js`` evaluates to (of its
        first line: a link that wraps has nothing of its own at its bounding box's centre)."""
        box = self.evaluate(f"(() => {{ const e = {element_js}; if (!e) return null; "
                            f"e.scrollIntoView({{block: 'center'}}); "
                            f"const r = e.getClientRects()[0] || e.getBoundingClientRect(); "
                            f"return [r.x + r.width / 2, r.y + r.height / 2]; }})()")
        if box is None:
            raise CheckFailed(f"{what}: not on the page at {self.evaluate('location.href')}")
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1],
                      button="left", clickCount=1)

    def screenshot(self, path: Path) -> None:
        time.sleep(1.5)  # let late requests and transitions settle
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        print(f"screenshot {path.name}: {self.evaluate('location.href')}")

    def close(self) -> None:
        self.ws.close()


class Chromium:
    """Headless Chromium (Debian package ``chromium``) with a throw-away profile."""

    def __init__(self) -> None:
        self.profile = Path(tempfile.mkdtemp(prefix="tabletune-chromium-"))
        self.log = (self.profile / "chromium.log").open("wb")
        self.proc = subprocess.Popen(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--no-first-run", "--no-default-browser-check", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", f"--window-size={WIDTH},{HEIGHT}",
             "about:blank"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise CheckFailed("chromium: did not open its DevTools port (see its log)")
            time.sleep(0.2)
        self.port = int(port_file.read_text().split()[0])

    def pages(self) -> list[dict]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list",
                                    timeout=30) as response:
            return [t for t in json.load(response) if t["type"] == "page"]

    def first_tab(self) -> Tab:
        return Tab(self.pages()[0]["webSocketDebuggerUrl"])

    def wait_for_new_tab(self, known: set[str], url_prefix: str, link: str,
                         timeout_s: float = 30) -> Tab:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for page in self.pages():
                if page["id"] not in known and page["url"].startswith(url_prefix):
                    return Tab(page["webSocketDebuggerUrl"])
            time.sleep(0.3)
        raise CheckFailed(f"{link}: no tab at {url_prefix} opened within "
                          f"{timeout_s:.0f}s of the click (tabs: "
                          f"{[p['url'] for p in self.pages()]})")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: chromium's helpers too
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


# -------------------------------------------------------------------------------------------
# The demo deployment and a weekly DAG run closed by its callback


def seed_demo(registry: MlflowRegistry, key: str) -> dict[str, str]:
    """A seeded version and a second one built from lower acceptance (as if traffic changed),
    promoted: a run page with plots and two runs to compare."""
    model = f"tabletune-{key}"
    profile = load_json(REPO / "benchmarks/results/cpu/profile.json", "profile")
    acceptance = load_json(REPO / "benchmarks/results/cpu/acceptance.json", "acceptance")
    seeded = registry_admin.seed_registry(registry, model_name=model, profile=profile,
                                          acceptance=acceptance)
    lower = replace(acceptance, rates=tuple(r * 0.8 for r in acceptance.rates))
    run_name = f"screenshot__{key}"
    info = run_lifecycle.start_run(registry, run_name=run_name, model_name=model, kind="acceptance",
                                   settings={"demo": True})
    built = candidate_flow.rebuild(registry, mlflow_run_id=info["mlflow_run_id"], run_name=run_name,
                                   model_name=model, production_version="1",
                                   acceptance=lower.to_dict())
    report = candidate_flow.validate(registry, mlflow_run_id=info["mlflow_run_id"],
                                     model_name=model, production_version="1",
                                     candidate=built["table"],
                                     settings=GateSettings(compare_edges=False))
    version = candidate_flow.register(registry, mlflow_run_id=info["mlflow_run_id"],
                                      run_name=run_name, model_name=model, candidate=built["table"],
                                      report=report)
    candidate_flow.gate_and_promote(registry, mlflow_run_id=info["mlflow_run_id"],
                                    run_name=run_name, model_name=model, version=version,
                                    report=report, production_version="1", promote=True)
    return {"seed_run": seeded["mlflow_run_id"], "run": info["mlflow_run_id"],
            "run_name": run_name, "model": model, "version": version,
            "table": json.dumps(built["table"]["num_speculative_tokens_per_batch_size"])}


def weekly_run_stopped_by_operator(api: AirflowApi, registry: MlflowRegistry,
                                   key: str) -> tuple[str, Any]:
    """Trigger the weekly DAG (no engine slot), stop it by marking its waiting task failed and
    wait for the failure callback to close the MLflow run: (DAG run id, closed MLflow run)."""
    env = os.environ
    prefix = f"screenshots/{key}/"
    today = dt.datetime.now(dt.timezone.utc).date()
    make_s3_client(endpoint_url=env["TABLETUNE_S3_ENDPOINT_URL"], region="us-east-1",
                   access_key_id=env["AWS_ACCESS_KEY_ID"],
                   secret_access_key=env["AWS_SECRET_ACCESS_KEY"]).put_object(
        Bucket=env["TABLETUNE_PROMPTS_BUCKET"], Key=f"{prefix}dt={today:%Y-%m-%d}/part-0.jsonl",
        Body=b"".join(b'{"prompt": "p%d"}\n' % i for i in range(8)))
    api.wait_for_dag(DAG_ID)
    pool = api.call("GET", "/pools/gpu")
    api.call("PATCH", "/pools/gpu", params={"update_mask": "slots"},
             json={"name": "gpu", "slots": 0, "include_deferred": pool["include_deferred"]})
    api.call("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})
    try:
        dag_run = api.trigger(DAG_ID, {"deployment_key": key, "prefix": prefix,
                                       "window_end": today.isoformat(), "n_prompts": 4,
                                       "min_prompts": 1})
        api.wait_for_state(DAG_ID, dag_run, "measure_acceptance", {"scheduled", "queued"},
                           timeout_s=240)
        api.call("PATCH", f"/dags/{DAG_ID}/dagRuns/{dag_run}/taskInstances/measure_acceptance",
                 json={"new_state": "failed"})
        state = api.wait(DAG_ID, dag_run, timeout_s=120)
    finally:
        api.call("PATCH", f"/dags/{DAG_ID}", json={"is_paused": True})
        api.call("PATCH", "/pools/gpu", params={"update_mask": "slots"},
                 json={"name": "gpu", "slots": pool["slots"],
                       "include_deferred": pool["include_deferred"]})
    if state != "failed":
        raise CheckFailed(f"DAG run {dag_run}: {state}, expected failed after the stop")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        runs = registry.find_runs(run_name=dag_run)
        if runs and runs[0].info.status != "RUNNING":
            return dag_run, runs[0]
        time.sleep(2)
    raise CheckFailed(f"MLflow run of {dag_run}: still open 120s after the DAG run failed "
                      f"(the failure callback did not close it)")


# -------------------------------------------------------------------------------------------
# The operator's clicks


def close_mlflow_assistant(tab: Tab) -> None:
    """MLflow 3.17 opens its "MLflow Assistant" side panel over a third of the page."""
    tab.evaluate("(() => { if (!document.body.innerText.includes('MLflow Assistant')) return;"
                 " const b = document.querySelector('button[aria-label=\"Close\"]');"
                 " if (b) b.click(); })()")


def airflow_link_to_mlflow(browser: Chromium, shots: Path, dag_run: str, mlflow_run: Any,
                           tracking_uri: str) -> None:
    env = os.environ
    airflow = env["AIRFLOW_API_URL"].rstrip("/")
    # Airflow 3.3 lists a task's extra links under "Extra Links" on its Details tab.
    task_page = f"{airflow}/dags/{DAG_ID}/runs/{dag_run}/tasks/start_run/details"
    tab = browser.first_tab()
    tab.goto(task_page)
    # Not signed in: the UI sends the browser to the simple auth manager's login form.
    tab.wait_for("!!document.querySelector('input[name=password]')", "the Airflow sign-in form")
    tab.type_into("input[name=username]", env["TABLETUNE_AIRFLOW_USER"])
    tab.type_into("input[name=password]", env["TABLETUNE_AIRFLOW_PASSWORD"])
    tab.wait_for("!document.querySelector('button[type=submit]').disabled",
                 "the sign-in button enabled once the form is filled in", 10)
    tab.click("document.querySelector('button[type=submit]')", "the sign-in button")
    tab.wait_for("!location.pathname.startsWith('/auth/')",
                 f"signed in as {env['TABLETUNE_AIRFLOW_USER']} (left the login page)", 60)
    if not tab.evaluate(f"location.href.startsWith({json.dumps(task_page)})"):
        tab.goto(task_page)
    anchor = ("[...document.querySelectorAll('a')].find(a => a.innerText.trim() === "
              f"{json.dumps(LINK_NAME)})")
    href = tab.wait_for(f"(() => {{ const a = {anchor}; return a && a.href; }})()",
                        f"the task's '{LINK_NAME}' link on {task_page}")
    run_id = mlflow_run.info.run_id
    if not (href.startswith(tracking_uri) and f"/runs/{run_id}" in href
            and "workflowType=machine_learning" in href):
        raise CheckFailed(f"the '{LINK_NAME}' link: {href}, expected the training view of "
                          f"MLflow run {run_id} at {tracking_uri}")
    tab.evaluate(f"{anchor}.scrollIntoView({{block: 'center'}})")
    tab.screenshot(shots / "airflow-task-mlflow-link.png")

    known = {page["id"] for page in browser.pages()}
    tab.click(anchor, f"the '{LINK_NAME}' link")  # target=_blank: MLflow opens in a new tab
    mlflow_tab = browser.wait_for_new_tab(known, tracking_uri, f"the '{LINK_NAME}' link")
    mlflow_tab.wait_for_text(dag_run, f"MLflow run page of {dag_run} (its name)")
    status = mlflow_run.info.status.capitalize()  # the UI writes "Failed", "Finished"
    mlflow_tab.wait_for_text(status, f"MLflow run status {status!r} on the run page")
    if mlflow_tab.evaluate("document.body.innerText.includes('Running')"):
        raise CheckFailed(f"MLflow run page of {dag_run}: says Running, the run was closed")
    # The ending, whole, on top of the description (the tags show it cut to one line; a tag's
    # text is "FAILED: ...", the description's "Failed: ...").
    mlflow_tab.wait_for_text(f"{status}: {ENDING}", "the run's ending at the top of its "
                             "description")
    close_mlflow_assistant(mlflow_tab)
    mlflow_tab.screenshot(shots / "mlflow-run-from-airflow-link.png")
    print(f"ok: the '{LINK_NAME}' link of {DAG_ID} {dag_run}/start_run opened MLflow run "
          f"{run_id} ({status}: {ENDING} ...)")
    mlflow_link_to_airflow(browser, mlflow_tab, shots, dag_run, airflow)
    mlflow_tab.close()
    tab.close()


def unfold_description(tab: Tab) -> None:
    """Click the run description's "Show more": it opens folded past a few lines."""
    more = "document.querySelector('button[data-testid=show-comment-toggle]')"
    if tab.evaluate(f"(() => {{ const b = {more}; return !!b && b.innerText.trim() === "
                    "'Show more'; })()"):
        tab.click(more, "the description's 'Show more'")
        tab.wait_for_text("Show less", "the description unfolded", 10)


def mlflow_link_to_airflow(browser: Chromium, mlflow_tab: Tab, shots: Path, dag_run: str,
                           airflow: str) -> None:
    """Back from the MLflow run's description to its DAG run's page in Airflow."""
    expected = f"{airflow}/dags/{DAG_ID}/runs/{quote(dag_run)}"
    unfold_description(mlflow_tab)
    back = ("[...document.querySelectorAll('a')].find(a => a.href.startsWith("
            f"{json.dumps(airflow + '/dags/')}))")
    what = "the description's link to the DAG run"
    href = mlflow_tab.wait_for(f"(() => {{ const a = {back}; return a && a.href; }})()", what)
    if href != expected:
        raise CheckFailed(f"{what}: {href}, expected {expected}")
    known = {page["id"] for page in browser.pages()}
    mlflow_tab.click(back, what)  # Markdown links open in a new tab
    airflow_tab = browser.wait_for_new_tab(known, expected, what)
    airflow_tab.wait_for_text(dag_run, f"Airflow's page of DAG run {dag_run}")
    airflow_tab.wait_for_text("measure_acceptance", f"the tasks of DAG run {dag_run}")
    airflow_tab.screenshot(shots / "airflow-run-from-mlflow-link.png")
    airflow_tab.close()
    print(f"ok: the MLflow run's description links back to {DAG_ID} {dag_run} in Airflow")


def mlflow_pages(browser: Chromium, shots: Path, registry: MlflowRegistry,
                 demo: dict[str, str], tracking_uri: str) -> None:
    tab = browser.first_tab()
    tab.goto(registry.run_url(demo["run"]))
    tab.wait_for_text(demo["run_name"], "the demo run's page")
    tab.wait_for_text("table_worst_loss", "the demo run's metrics")
    close_mlflow_assistant(tab)
    unfold_description(tab)
    tab.wait_for_text("Passed: all checks passed", "the gate's verdict in the description")
    tab.evaluate("window.scrollTo(0, 0)")
    tab.screenshot(shots / "mlflow-run.png")
    runs = json.dumps([demo["seed_run"], demo["run"]])
    experiments = json.dumps([registry.experiment_id()])
    tab.goto(f"{tracking_uri}/#/compare-runs?runs={runs}&experiments={experiments}"
             "&workflowType=machine_learning")
    tab.wait_for_text(demo["run_name"], "the compare view of the two runs")
    tab.wait_for_text("table_worst_loss", "the compare view's metrics")
    close_mlflow_assistant(tab)
    # Fold the parallel-coordinates plot away: the parameter and metric tables are the point.
    tab.click("[...document.querySelectorAll('[role=button][aria-expanded=true]')].find("
              "e => e.innerText.trim() === 'Visualizations')", "the compare view's plots header")
    tab.wait_for("!document.body.innerText.includes('Parallel Coordinates Plot')",
                 "the compare view's plots folded away", 10)
    tab.screenshot(shots / "mlflow-compare.png")
    tab.close()


def mlflow_registry_pages(browser: Chromium, shots: Path, demo: dict[str, str],
                          tracking_uri: str) -> None:
    """The demo model's page (which version serves, the moves of production, the versions with
    their tables) and the promoted version's page (its table and how to serve it)."""
    model, version, table = demo["model"], demo["version"], demo["table"]
    tab = browser.first_tab()
    tab.goto(f"{tracking_uri}/#/models/{model}")
    tab.wait_for_text(f"Serving: version {version} (alias production): {table}",
                      "the model's description: the serving version and its table")
    tab.wait_for_text(f"promote\t1 → {version}", "the promotion in the description's moves")
    tab.wait_for_text("seed\tnone → 1", "the seed in the description's moves")
    close_mlflow_assistant(tab)
    tab.screenshot(shots / "mlflow-registered-model.png")
    tab.goto(f"{tracking_uri}/#/models/{model}/versions/{version}")
    tab.wait_for_text(f"{table} · gate passed", f"version {version}'s first description line")
    tab.wait_for_text("--speculative-config", f"how to serve version {version}")
    close_mlflow_assistant(tab)
    tab.screenshot(shots / "mlflow-model-version.png")
    tab.close()
    print(f"ok: MLflow's page of {model} says version {version} serves {table}, with its moves")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs",
                        help="where the screenshots go (default: docs/)")
    args = parser.parse_args(argv)
    env = os.environ
    tracking_uri = env["MLFLOW_TRACKING_URI"].rstrip("/")
    registry = MlflowRegistry(tracking_uri)
    key = f"demo-{uuid.uuid4().hex[:6]}"
    demo = seed_demo(registry, key)
    api = AirflowApi(env["AIRFLOW_API_URL"], env["TABLETUNE_AIRFLOW_USER"],
                     env["TABLETUNE_AIRFLOW_PASSWORD"])
    with tempfile.TemporaryDirectory(prefix="tabletune-shots-") as tmp:
        shots = Path(tmp)
        try:
            dag_run, mlflow_run = weekly_run_stopped_by_operator(api, registry, key)
            browser = Chromium()
            try:
                airflow_link_to_mlflow(browser, shots, dag_run, mlflow_run, tracking_uri)
                mlflow_pages(browser, shots, registry, demo, tracking_uri)
                mlflow_registry_pages(browser, shots, demo, tracking_uri)
            finally:
                browser.close()
        # AirflowApi's waits assert; RuntimeError: a DevTools call the page refused
        except (CheckFailed, AssertionError, RuntimeError) as exc:
            print(f"screenshots: FAILED: {exc}", file=sys.stderr)
            return 1
        args.out.mkdir(parents=True, exist_ok=True)
        for shot in sorted(shots.glob("*.png")):
            shutil.copy2(shot, args.out / shot.name)
            print(f"wrote {args.out / shot.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
