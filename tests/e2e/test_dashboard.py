"""The dashboard in a real browser (Debian's chromium driven by Playwright) against real
`opd api` and `opd worker` processes. Each test saves screenshots under
test-screenshots/<test name>/ for a person to look at."""

from __future__ import annotations

import re
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import ROOT, TINY, Service, deployment, tiny_spec

DEMO = ROOT / "examples" / "arith.yaml"

playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = ROOT / "test-screenshots"
WAIT_MS = 60_000

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium (apt-get install -y chromium)"
)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One API and one worker (two jobs at once) on SQLite for the module's tests."""
    home = tmp_path_factory.mktemp("dashboard")
    with deployment(home, f"sqlite:///{home / 'opd.db'}", worker_concurrency="2") as running:
        running.start_worker()
        yield running


@pytest.fixture(scope="module")
def other_key(service: Service) -> str:
    return service.opd("keys", "create", "--team", "someone-else").stdout.strip()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser profile; fails the test on a script error or anything the
    Content-Security-Policy blocks (both show as console errors). Pages that answer an
    HTTP error on purpose (401, 404, 422) log "Failed to load resource": those are fine."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    tab = context.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    tab.on(
        "console",
        lambda message: problems.append(message.text) if message.type == "error" else None,
    )
    tab.on("dialog", lambda dialog: dialog.accept())
    yield tab
    context.close()
    unexpected = [p for p in problems if not p.startswith("Failed to load resource")]
    assert not unexpected, unexpected


@pytest.fixture
def shots(request: pytest.FixtureRequest) -> Path:
    """test-screenshots/<test name>/, for a person to look at."""
    folder = SCREENSHOTS / request.node.name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def shot(page: Any, folder: Path, name: str) -> None:
    page.screenshot(path=str(folder / f"{name}.png"), full_page=True)


def sign_in(page: Any, service: Service, key: str) -> None:
    page.goto(f"{service.url}/ui/jobs")
    expect(page).to_have_url(re.compile(r"/ui/sign-in"))
    page.fill("#key", key)
    page.click("form[action='/ui/sign-in'] button[type=submit]")
    expect(page).to_have_url(re.compile(r"/ui/jobs$"))


def submit_as(service: Service, key: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Submit a job with another team's key."""
    mine = service.key
    service.key = key
    try:
        return service.submit(spec)
    finally:
        service.key = mine


def test_sign_in_and_the_table_lists_only_the_teams_jobs(page, service, shots, other_key):
    mine = service.submit(tiny_spec(steps=4) | {"name": "ours-table"})
    theirs = submit_as(service, other_key, tiny_spec(steps=4) | {"name": "theirs-table"})
    sign_in(page, service, service.key)
    cookies = {c["name"]: c for c in page.context.cookies()}
    assert cookies["opd_session"]["httpOnly"] and cookies["opd_session"]["sameSite"] == "Strict"
    assert cookies["opd_session"]["expires"] > 0, "an expiring cookie, not a browser session"
    assert "opd_session" not in page.evaluate("document.cookie"), "scripts cannot read it"
    assert service.key not in page.evaluate("JSON.stringify(localStorage)")
    table = page.locator("#jobs-table")
    expect(table.locator(f"tr[data-job-id='{mine['id']}']")).to_contain_text("ours-table")
    expect(table.locator(f"tr[data-job-id='{theirs['id']}']")).to_have_count(0)
    expect(page.locator("body")).not_to_contain_text("theirs-table")
    shot(page, shots, "jobs-table")


def test_compare_two_jobs(page, service, shots):
    first = service.submit(tiny_spec(steps=6) | {"name": "compare-a"})
    second = service.submit(tiny_spec(steps=8) | {"name": "compare-b"})
    for job in (first, second):
        service.wait(job["id"])
    sign_in(page, service, service.key)
    for job in (first, second):
        page.check(f"tr[data-job-id='{job['id']}'] input[type=checkbox]")
    page.click("#compare-form button[type=submit]")
    expect(page).to_have_url(re.compile(r"/ui/compare\?"))
    expect(page.locator("#spec-diff tr[data-field='loop.steps']")).to_contain_text("6")
    expect(page.locator("#spec-diff tr[data-field='name']")).to_contain_text("compare-b")
    chart = page.locator("#chart-compare")
    expect(chart).to_have_attribute("data-points", re.compile(r"^[1-9]\d*$"), timeout=WAIT_MS)
    expect(chart.locator(".u-legend")).to_contain_text("compare-a")
    shot(page, shots, "compare")


def test_the_teachers_baseline_is_a_line_on_the_students_eval_chart(page, service, shots):
    spec = yaml.safe_load(TINY.read_text())
    spec["loop"] |= {"steps": 4}
    spec["eval"] |= {"every": 2, "teacher_baseline": True, "samples_per_prompt": 1}
    job = service.submit(spec)
    assert service.wait(job["id"])["status"] == "succeeded"
    sign_in(page, service, service.key)
    page.goto(f"{service.url}/ui/jobs/{job['id']}")
    chart = page.locator("#chart-eval-accuracy")
    expect(chart).to_have_attribute("data-points", "3", timeout=WAIT_MS)
    expect(chart.locator(".u-legend")).to_contain_text("eval/teacher_accuracy")
    assert page.locator("[id^='chart-eval-teacher']").count() == 0
    assert chart.get_attribute("data-style") == "points"  # evals at 3 steps: no trend line
    assert page.locator("#chart-reverse-kl").get_attribute("data-style") == "lines"
    values = chart.locator(".u-legend .u-value").all_inner_texts()  # the latest, unhovered
    assert values and all(v.strip() not in ("", "--") for v in values[1:]), values
    shot(page, shots, "baseline")


def test_an_invalid_spec_shows_the_fields_error_then_a_valid_one_is_submitted(page, service, shots):
    sign_in(page, service, service.key)
    page.goto(f"{service.url}/ui/new")
    text = DEMO.read_text()
    assert page.locator("#spec").input_value() == text, "prefilled from examples/arith.yaml"
    page.fill("#spec", text.replace("steps: 200", "steps: 0"))
    page.click("#submit-job")
    error = page.locator(".field-error[data-field='loop.steps']")
    expect(error).to_contain_text("greater than or equal to 1")
    expect(page.locator(".inline-error[data-field='loop.steps']")).to_be_visible()
    shot(page, shots, "invalid-spec")
    spec = yaml.safe_load(text) | {"name": "from-the-form"}
    spec["loop"]["steps"] = 3
    page.fill("#spec", yaml.safe_dump(spec))
    page.click("#submit-job")
    expect(page).to_have_url(re.compile(r"/ui/jobs/\d+$"))
    expect(page.locator("h1")).to_contain_text("from-the-form")
    job_id = int(page.url.rsplit("/", 1)[1])
    assert service.client().jobs.get(job_id).name == "from-the-form"
    shot(page, shots, "submitted")


def test_another_teams_job_is_a_404_page(page, service, shots, other_key):
    theirs = submit_as(service, other_key, tiny_spec(steps=3) | {"name": "not-for-you"})
    sign_in(page, service, service.key)
    response = page.goto(f"{service.url}/ui/jobs/{theirs['id']}")
    assert response.status == 404
    expect(page.locator(".error-page")).to_contain_text("No such job")
    expect(page.locator("body")).not_to_contain_text("not-for-you")
    shot(page, shots, "other-team-404")


def test_sign_out(page, service, shots):
    sign_in(page, service, service.key)
    page.click("form.sign-out button")
    expect(page).to_have_url(re.compile(r"/ui/sign-in"))
    assert "opd_session" not in {c["name"] for c in page.context.cookies()}
    page.goto(f"{service.url}/ui/jobs")
    expect(page).to_have_url(re.compile(r"/ui/sign-in\?next="))
    shot(page, shots, "signed-out")


def test_try_a_checkpoint_from_the_jobs_page(page, service, shots):
    job = service.submit(tiny_spec(steps=4) | {"name": "try-me"})
    assert service.wait(job["id"])["status"] == "succeeded"
    sign_in(page, service, service.key)
    page.goto(f"{service.url}/ui/jobs/{job['id']}")

    page.fill("#try-form textarea[name=prompt]", "What is 2 + 3?")
    page.check("#try-form input[name=compare_base]")
    page.click("#try-form button[type=submit]")

    outputs = page.locator("#try-result .try-output")
    expect(outputs).to_have_count(3, timeout=WAIT_MS)
    expect(outputs.nth(0).locator("header")).to_contain_text("reverse KL mean")
    expect(outputs.nth(1).locator("header")).to_contain_text("Teacher")
    expect(outputs.nth(2).locator("header")).to_contain_text("Untrained student")
    assert outputs.nth(0).locator(".tok").count() > 0
    shot(page, shots, "try-it")

    final = page.locator("table.checkpoints tr", has_text="final")
    export = final.locator("button.export")
    expect(export).to_have_attribute(
        "data-copy", f"opd export {job['id']} job-{job['id']}-final --checkpoint final"
    )
    with page.expect_download() as downloading:
        final.locator("a.download").click()
    archive = downloading.value
    assert archive.suggested_filename.startswith(f"job-{job['id']}-final-")
    with tarfile.open(archive.path()) as unpacked:
        assert any(name.endswith("adapter_config.json") for name in unpacked.getnames())


def test_a_sweep_started_from_a_jobs_page(page, service, shots, other_key):
    job = service.submit(tiny_spec(steps=4, batch_size=1, group_size=2) | {"name": "sweep-base"})
    service.wait(job["id"])
    sign_in(page, service, service.key)
    expect(page.locator("header .who")).to_have_text("team e2e")
    page.goto(f"{service.url}/ui/jobs/{job['id']}")
    page.click("#sweep-from-job")
    expect(page).to_have_url(re.compile(rf"/ui/sweeps/new\?base_job={job['id']}$"))
    prefilled = yaml.safe_load(page.locator("#definition").input_value())
    assert prefilled["base_job"] == job["id"]
    definition = prefilled | {
        "name": "from-the-page",
        "method": "grid",
        "parameters": {
            "optim.learning_rate": {"values": [1.0e-3, 3.0e-3]},
            "loop.loss_fn": {"values": ["importance_sampling", "ppo"]},
        },
        "metric": {"name": "opd/reverse_kl_mean", "goal": "minimize"},
        "max_trials": 4,
        "parallel": 2,
        "early_stop": None,
    }
    page.fill("#definition", yaml.safe_dump(definition))
    page.click("#submit-sweep")
    expect(page).to_have_url(re.compile(r"/ui/sweeps/\d+$"))
    sweep_id = int(page.url.rsplit("/", 1)[1])
    deadline = time.monotonic() + 180
    with service.client() as client:
        while (sweep := client.sweeps.get(sweep_id)).status == "running":
            assert time.monotonic() < deadline, service.logs()
            time.sleep(0.5)
    best = sweep.best
    assert sweep.status == "completed" and best is not None

    page.reload()
    expect(page.locator("#best-trial")).to_contain_text(f"Trial {best.number}")
    expect(page.locator("#best-spec")).to_contain_text("name: from-the-page-")
    rows = page.locator("#trials-table tbody tr")
    expect(rows).to_have_count(4)
    expect(rows.nth(0).locator("a")).to_have_attribute("href", f"/ui/jobs/{sweep.trials[0].job_id}")
    page.click("#metric-column")  # ascending: the best (lowest reverse KL) first
    expect(rows.nth(0)).to_have_attribute("data-trial", str(best.number))
    page.click("#metric-column")  # descending: the worst first
    worst = max(sweep.trials, key=lambda trial: trial.metric or 0.0)
    expect(rows.nth(0).locator("td.metric")).to_have_attribute("data-value", str(worst.metric))
    for index in range(2):
        scatter = page.locator(f"#scatter-{index}")
        expect(scatter.locator("canvas")).to_have_count(1)
        expect(scatter).to_have_attribute("data-points", "4")
    expect(page.locator("#chart-best")).to_have_attribute("data-series", "3", timeout=WAIT_MS)
    expect(page.locator("#chart-best .u-legend")).to_contain_text(f"trial {best.number}")
    shot(page, shots, "sweep")

    page.goto(f"{service.url}/ui/jobs/{best.job_id}")
    expect(page.locator("body")).to_contain_text(f"sweep {sweep_id}, trial {best.number}")
    elsewhere = page.context.browser.new_context()  # another team's own session
    theirs = elsewhere.new_page()
    sign_in(theirs, service, other_key)
    assert theirs.goto(f"{service.url}/ui/sweeps/{sweep_id}").status == 404
    expect(theirs.locator(".error-page")).to_contain_text("No such sweep")
    elsewhere.close()


@pytest.fixture(scope="module")
def long_job(service: Service) -> dict[str, Any]:
    """A job that runs long enough to watch, pause and resume (saves state every 10). Its
    tests come last: it holds one of the worker's two slots, and a core, until the module
    ends."""
    job = service.submit(tiny_spec(steps=600, save_every=10) | {"name": "watch-me"})
    service.wait(job["id"], until=lambda j: j["status"] == "running" and j["steps_done"] > 2)
    return job


def test_a_running_jobs_chart_gains_points_without_reloading(page, service, shots, long_job):
    sign_in(page, service, service.key)
    page.goto(f"{service.url}/ui/jobs/{long_job['id']}")
    chart = page.locator("#chart-reverse-kl")
    expect(chart.locator("canvas")).to_have_count(1)
    expect(chart).to_have_attribute("data-points", re.compile(r"^[1-9]\d*$"), timeout=WAIT_MS)
    page.evaluate("window.stillTheSamePage = true")
    first = int(chart.get_attribute("data-points"))
    deadline = time.monotonic() + WAIT_MS / 1000
    while int(chart.get_attribute("data-points")) < first + 5:
        assert time.monotonic() < deadline, "the chart stopped gaining points"
        page.wait_for_timeout(250)
    assert page.evaluate("window.stillTheSamePage === true"), "the page was not reloaded"
    steps = page.locator("#job-steps").inner_text()
    assert int(steps.split("/")[0]) > first
    shot(page, shots, "live-chart")


def test_pause_and_resume_from_the_page(page, service, shots, long_job):
    sign_in(page, service, service.key)
    page.goto(f"{service.url}/ui/jobs/{long_job['id']}")
    page.click("button.action-pause")  # the confirmation dialog is accepted
    expect(page.locator("#job-status")).to_have_text("paused", timeout=WAIT_MS)
    shot(page, shots, "paused")
    assert service.client().jobs.get(long_job["id"]).status == "paused"
    page.click("button.action-resume")
    expect(page.locator("#job-status")).to_have_text(re.compile("queued|running"))
    service.wait(long_job["id"], until=lambda job: job["status"] == "running")
    expect(page.locator("#job-status")).to_have_text("running", timeout=WAIT_MS)
    expect(page.locator("button.action-pause")).to_be_visible()
    shot(page, shots, "resumed")
