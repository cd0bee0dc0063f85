"""The Checkpoint tab and the Resumable jobs page in a real browser, against a real Airflow.

Headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by Selenium; nothing is
downloaded) logs in to an ``airflow standalone`` through its login form and walks the README's
tour ("Try it in the Airflow UI"): opens a running task instance, clicks its Checkpoint tab (the
one click from the task instance to its progress), watches the progress bar advance without
reloading; presses Pause (the task defers, the tab says paused) and Resume (it continues, in the
same try, to done, with an ETA that holds); finds the slot on the jobs page and clicks through to
its task instance; marks a running task instance failed and clears it, and the open tab follows
both without a reload.

The screens never mislead: primary actions stay visible at 1280 px; the skipped items' counts
count what the table lists, and a note of a retry goes once the retry ran; a failed partition's
error is in the partitions list; a job of one slot is not described in partitions (the buttons the
rules table offers, who pressed Cancel and the jobs page's filters: test_truthful_screens.py).

The deployment and the browser are the folder's (conftest.py): one ``airflow standalone`` for both
modules, as for one.

Screenshots go to ``$RESUMABLE_SCREENSHOTS`` (``make screenshots`` sets ``docs/screenshots``),
else to a temporary folder. The refresh latency (from a checkpoint's commit to the tab showing
it) and the time from each step's click to what it shows are measured and printed (run with
``-s``), and written next to the screenshots.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from support.browser import (
    DAG_ID,
    JOB,
    MEASURED,
    REFRESH,
    TASK_ID,
    Env,
    assert_buttons_visible,
    attr,
    frame_text,
    login,
    open_tab,
    press,
    record,
    shown,
    until,
)
from support.standalone import wait_for

pytestmark = [pytest.mark.scheduler, pytest.mark.browser]


def test_the_readme_tour_the_tab_follows_a_run_live_pauses_resumes_and_the_jobs_page_opens_it(
    env: Env, browser: Any, shots: Path
) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    login(driver, env)
    # The Airflow UI's time zone (its user menu's choice, kept in this origin's storage)
    driver.execute_script("localStorage.setItem('timezone', JSON.stringify('Asia/Kolkata'))")
    # Given a running export
    run_id = f"ui_{uuid.uuid4().hex[:6]}"
    env.api.trigger(DAG_ID, run_id=run_id, conf={"items": 160, "delay": 0.25})
    wait_for(lambda: (r := env.row(run_id)) is not None and r.status == "running" and r.processed >= 2, timeout=180,
             interval=0.2, what="the export to make progress")

    # When a person opens the task instance and clicks its Checkpoint tab (one click)
    frame, tab_seconds = open_tab(driver, env, DAG_ID, run_id, TASK_ID)
    until(lambda: driver.find_element(By.ID, "figures"), timeout=30, what="the progress figures")
    # The tab's own address names map index -1 (Airflow leaves {MAP_INDEX} as it is here)
    assert "map_index=-1" in driver.execute_script("return location.search")

    # Then the progress bar advances without a reload, and every checkpoint shows within about one
    # refresh period. Measured: when this test first saw each value committed in the store, and
    # when the page first showed that value or a later one (its refresh latency).
    committed: dict[int, float] = {}
    timeline: list[tuple[float, int]] = []
    deadline = time.monotonic() + 60

    def observe() -> bool:
        processed = env.row(run_id).processed
        committed.setdefault(processed, time.monotonic())
        value = int(driver.find_element(By.ID, "figures").get_attribute("data-processed"))
        if not timeline or timeline[-1][1] != value:
            timeline.append((time.monotonic(), value))
        return True

    while len(timeline) < 5 and time.monotonic() < deadline:
        until(observe, timeout=10, what="a look at the store and the page")
        time.sleep(0.05)  # the sampling period of this measurement, not a wait for an outcome
    assert len(timeline) >= 5 and all(a[1] < b[1] for a, b in itertools.pairwise(timeline)), timeline
    latencies = [next(t for t, shown in timeline if shown >= v) - at for v, at in committed.items()
                 if timeline[0][0] <= at and v <= timeline[-1][1]]
    assert latencies and max(latencies) < 2 * REFRESH + 2, latencies  # generous: about REFRESH expected
    bar = driver.find_element(By.CSS_SELECTOR, "[role=progressbar]")
    assert 0 < float(bar.get_attribute("aria-valuenow")) < 100
    figures = frame_text(driver, "#figures")
    assert "items" in figures and "/s" in figures and "ETA 0s" not in figures
    assert "heartbeat" in frame_text(driver, "#lease")
    # The lease holder as host:pid (the whole id in the tooltip); the position as a number
    lease = driver.find_element(By.CSS_SELECTOR, "#lease span")
    assert "/try1@" in lease.get_attribute("title") and "/try" not in lease.text
    assert re.fullmatch(r"\d[\d,]*", frame_text(driver, "#position")), frame_text(driver, "#position")
    driver.switch_to.default_content()
    driver.save_screenshot(str(shots / "checkpoint-tab.png"))
    driver.switch_to.frame(frame)

    # When they press Pause and confirm
    press(driver, "action-pause", what="Pause enabled")
    press(driver, "confirm", what="the confirmation")
    clicked = time.monotonic()
    # Then the task defers, the tab says paused, and "pause requested" is gone once it took effect
    until(lambda: frame_text(driver, "#status").startswith("paused") or None, timeout=60, what="the tab to say paused")
    paused_after = time.monotonic() - clicked
    until(lambda: attr(driver, "#ti-state", "data-state") == "deferred" or None, timeout=60,
          what="the tab to show the task instance deferred")
    deferred_after = time.monotonic() - clicked
    assert env.api.task_instance(DAG_ID, run_id, TASK_ID)["state"] == "deferred"
    assert not driver.find_elements(By.ID, "pending"), frame_text(driver, "h2")
    at_pause = env.row(run_id).processed
    assert at_pause < 160 and driver.find_element(By.ID, "action-resume").is_enabled()
    assert not driver.find_element(By.ID, "action-pause").is_enabled()
    driver.switch_to.default_content()
    driver.save_screenshot(str(shots / "checkpoint-tab-paused.png"))
    driver.switch_to.frame(frame)

    # (Resumed at once: the trigger waits until Airflow has seen the deferred execution end, so the
    # same try does not run again while the old workload's end is on its way; resume_settle.)
    # When they press Resume and confirm: it continues in the same try, to the end
    press(driver, "action-resume", what="Resume enabled")
    press(driver, "confirm", what="the confirmation")
    clicked = time.monotonic()
    until(lambda: int(driver.find_element(By.ID, "figures").get_attribute("data-processed")) > at_pause or None,
          timeout=90, what="the tab to show progress after the resume")
    resumed_after = time.monotonic() - clicked
    # And once the tab shows an ETA, it is within 25 % of the time that was really left
    eta = float(until(lambda: attr(driver, "#figures", "data-eta") or None, timeout=60,
                      what="the tab to show an ETA after the resume"))
    eta_seen = time.monotonic()
    eta_text = frame_text(driver, "#figures")
    wait_for(lambda: env.row(run_id).status == "done", timeout=180, interval=0.1, what="the export to finish")
    remaining = time.monotonic() - eta_seen
    assert abs(eta - remaining) <= 0.25 * remaining, (eta, remaining, eta_text)
    until(lambda: frame_text(driver, "#status").startswith("done") or None, timeout=30, what="the tab to say done",
          on_timeout=lambda: f"row: {env.row(run_id)}\npage: {driver.find_element(By.TAG_NAME, 'body').text}\n"
                             f"{env.airflow.task_log(DAG_ID, run_id, TASK_ID, 1)[-3000:]}")
    # the tab's next refresh after the end says it now watches the task instance (for a new try or a Clear)
    until(lambda: "watching the task instance" in frame_text(driver, "#refreshed") or None, timeout=30,
          what="the tab to say it watches the task instance")
    history = frame_text(driver, "#history")
    assert "pause_requested" in history and "resume_requested" in history and "admin" in history
    # Times as Airflow shows them: 24 h, in the UI's chosen time zone
    first = driver.find_element(By.CSS_SELECTOR, "#history time")
    at = datetime.fromisoformat(first.get_attribute("datetime")).astimezone(ZoneInfo("Asia/Kolkata"))
    assert first.text == at.strftime("%Y-%m-%d %H:%M:%S"), (first.text, at)
    ti = env.api.task_instance(DAG_ID, run_id, TASK_ID)
    assert ti["try_number"] == 1
    wait_for(lambda: env.api.task_instance(DAG_ID, run_id, TASK_ID)["state"] == "success", timeout=60,
             interval=0.5, what="the task instance to succeed")

    # The same tab in the Airflow UI's dark theme (its colour-mode switch sets html.dark)
    driver.switch_to.default_content()
    driver.execute_script("document.documentElement.classList.remove('light');"
                          "document.documentElement.classList.add('dark');"
                          "document.documentElement.style.colorScheme = 'dark';")
    driver.switch_to.frame(frame)
    until(lambda: driver.execute_script("return document.documentElement.classList.contains('dark')") or None,
          timeout=10, what="the tab to follow the dark theme")
    driver.switch_to.default_content()
    driver.save_screenshot(str(shots / "checkpoint-tab-dark.png"))
    driver.execute_script("document.documentElement.classList.remove('dark');"
                          "document.documentElement.classList.add('light');"
                          "document.documentElement.style.colorScheme = 'light';")

    # And the jobs page lists the slot (found by part of its DAG's id), and a click on its link
    # opens the task instance's Checkpoint tab in the Airflow UI (a new run shows live)
    live_run = f"ui_{uuid.uuid4().hex[:6]}"
    env.api.trigger(DAG_ID, run_id=live_run, conf={"items": 400, "delay": 0.25})
    driver.get(f"{env.airflow.base_url}/plugin/resumable-jobs")
    jobs = until(lambda: driver.find_element(By.CSS_SELECTOR, "iframe[title='Resumable jobs']"), timeout=60,
                 what="the jobs page's frame")
    driver.switch_to.frame(jobs)
    field = until(lambda: driver.find_element(By.NAME, "dag_id"), timeout=30, what="the DAG filter")
    field.send_keys("UI_EXP")
    until(lambda: driver.find_element(By.CSS_SELECTOR, f"tr[data-job='{JOB}'][data-slot='{run_id}']"),
          timeout=30, what="the slot on the jobs page, found by part of its DAG id")
    until(lambda: "running" in driver.find_element(By.CSS_SELECTOR, f"tr[data-slot='{live_run}']").text or None,
          timeout=120, what="the new run to show as running on the jobs page (it refreshes itself)")
    # The status filter applies at once
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.NAME, "status")).select_by_visible_text("done")
    chosen = time.monotonic()
    until(lambda: not driver.find_elements(By.CSS_SELECTOR, f"tr[data-slot='{live_run}']") or None, timeout=10,
          what="the status filter to apply")
    status_filter_seconds = time.monotonic() - chosen
    assert status_filter_seconds < 2, status_filter_seconds
    # The filters are in the page's address: a reload (or the address shared) keeps them
    driver.switch_to.default_content()
    until(lambda: "dag_id=UI_EXP" in driver.current_url and "status=done" in driver.current_url or None, timeout=10,
          what="the filters in the address", on_timeout=lambda: driver.current_url)
    filtered_url = driver.current_url
    driver.refresh()
    reloaded = time.monotonic()
    jobs = until(lambda: driver.find_element(By.CSS_SELECTOR, "iframe[title='Resumable jobs']"), timeout=60,
                 what="the jobs page's frame after a reload")
    driver.switch_to.frame(jobs)
    until(lambda: driver.find_element(By.NAME, "dag_id").get_attribute("value") == "UI_EXP" and
          Select(driver.find_element(By.NAME, "status")).first_selected_option.text == "done" and
          driver.find_elements(By.CSS_SELECTOR, f"tr[data-slot='{run_id}']") and
          not driver.find_elements(By.CSS_SELECTOR, f"tr[data-slot='{live_run}']") or None, timeout=30,
          what="the filters and what they show, after the reload", on_timeout=lambda: shown(driver, "body"))
    reload_filters_seconds = time.monotonic() - reloaded
    Select(driver.find_element(By.NAME, "status")).select_by_visible_text("any")
    until(lambda: driver.find_elements(By.CSS_SELECTOR, f"tr[data-slot='{live_run}']") or None, timeout=10,
          what="every status again")
    # A job of one slot is not described in partitions: its line gives the slot's status
    standing = frame_text(driver, f"#summary tr[data-job='{JOB}'] td.standing")
    assert standing in ("running", "done"), standing
    driver.switch_to.default_content()
    driver.save_screenshot(str(shots / "jobs-page.png"))
    driver.switch_to.frame(jobs)
    row = driver.find_element(By.CSS_SELECTOR, f"tr[data-job='{JOB}'][data-slot='{run_id}']")
    link = row.find_element(By.CSS_SELECTOR, "a.ti-link")
    target = f"/dags/{DAG_ID}/runs/{run_id}/tasks/{TASK_ID}/plugin/checkpoint"
    assert link.get_attribute("href").endswith(target)
    link.click()
    clicked = time.monotonic()
    driver.switch_to.default_content()
    until(lambda: driver.execute_script("return location.pathname") == target or None, timeout=30,
          what="the Airflow UI to open the task instance", on_timeout=lambda: driver.current_url)
    frame = until(lambda: driver.find_element(By.CSS_SELECTOR, "iframe[title='Checkpoint']"), timeout=30,
                  what="the task instance's Checkpoint tab after the click")
    driver.switch_to.frame(frame)
    until(lambda: frame_text(driver, "#status").startswith("done") or None, timeout=30,
          what="the clicked slot's checkpoint in its tab")
    link_seconds = time.monotonic() - clicked
    driver.switch_to.default_content()
    assert run_id in driver.find_element(By.TAG_NAME, "body").text  # the host page shows that run
    env.api.set_task_state(DAG_ID, live_run, TASK_ID, "failed")  # not needed further: stop it

    record(shots,
           clicks_from_task_instance_to_progress=1,
           checkpoint_to_tab_seconds={"samples": len(latencies), "mean": round(statistics.mean(latencies), 2),
                                      "max": round(max(latencies), 2), "tab_refresh_period": REFRESH},
           click_to_visible_seconds={
               "checkpoint_tab_to_progress": round(tab_seconds, 2),
               "pause_to_tab_paused": round(paused_after, 2),
               "pause_to_tab_deferred": round(deferred_after, 2),
               "resume_to_tab_progress": round(resumed_after, 2),
               "jobs_status_filter": round(status_filter_seconds, 2),
               "jobs_reload_to_filters_applied": round(reload_filters_seconds, 2),
               "jobs_link_to_task_instance_tab": round(link_seconds, 2),
           },
           eta_after_resume={"shown_seconds": eta, "measured_remaining_seconds": round(remaining, 2),
                             "error_percent": round(100 * abs(eta - remaining) / remaining, 1)})
    print(f"\nmeasured in the browser: {json.dumps(MEASURED)}\nscreenshots: {shots}\nfiltered: {filtered_url}")


def test_the_open_tab_follows_a_mark_failed_and_a_clear_without_a_reload(env: Env, browser: Any, shots: Path) -> None:
    driver = browser
    login(driver, env)
    # Given a running export whose Checkpoint tab is open
    run_id = f"ui_{uuid.uuid4().hex[:6]}"
    env.api.trigger(DAG_ID, run_id=run_id, conf={"items": 100, "delay": 0.25})
    wait_for(lambda: (r := env.row(run_id)) is not None and r.status == "running" and r.processed >= 4, timeout=180,
             interval=0.2, what="the export to make progress")
    frame, _ = open_tab(driver, env, DAG_ID, run_id, TASK_ID)
    until(lambda: frame_text(driver, "#status").startswith("running") or None, timeout=90, what="the tab: running")
    marker = driver.execute_script("window.__not_reloaded = true; return true")

    # When the task instance is marked failed (the UI's "Mark as failed": the same REST call)
    env.api.set_task_state(DAG_ID, run_id, TASK_ID, "failed")
    marked = time.monotonic()
    # Then the tab says the try stopped, cancelled by the user, and that the task instance failed
    until(lambda: frame_text(driver, "#status").startswith("cancelled") or None, timeout=60,
          what="the tab to say cancelled", on_timeout=lambda: shown(driver, "body"))
    assert "user" in frame_text(driver, "#status")
    until(lambda: attr(driver, "#ti-state", "data-state") == "failed" or None, timeout=30, what="the TI failed")
    failed_after = time.monotonic() - marked
    until(lambda: attr(driver, "#refreshed", "data-live") == "false" or None, timeout=30, what="the slot ended")
    at_stop = env.row(run_id).processed

    # When they Clear it: try 2 resumes, and the open tab follows it to the end without a reload
    env.api.clear(DAG_ID, run_id, [TASK_ID])
    cleared = time.monotonic()
    until(lambda: attr(driver, "#ti-state", "data-try") == "2" or None, timeout=60,
          what="the tab to show try 2", on_timeout=lambda: shown(driver, "body"))
    try_after = time.monotonic() - cleared
    until(lambda: frame_text(driver, "#status").startswith("running") and
          int(attr(driver, "#figures", "data-processed") or 0) > at_stop or None, timeout=120,
          what="the tab to show try 2 running past where try 1 stopped", on_timeout=lambda: shown(driver, "body"))
    running_after = time.monotonic() - cleared
    assert "resum" not in frame_text(driver, "#status")
    driver.switch_to.default_content()
    driver.save_screenshot(str(shots / "checkpoint-tab-cleared.png"))
    driver.switch_to.frame(frame)
    until(lambda: frame_text(driver, "#status").startswith("done") or None, timeout=120, what="the tab to say done")
    assert driver.execute_script("return window.__not_reloaded === true") and marker
    history = frame_text(driver, "#history")
    assert "cancelled" in history and "done" in history
    record(shots, tab_follows_seconds={"mark_failed_to_tab_cancelled_and_ti_failed": round(failed_after, 2),
                                       "clear_to_tab_try_2": round(try_after, 2),
                                       "clear_to_tab_try_2_running_past_the_stop": round(running_after, 2)})


def skipped_states(driver: Any) -> list[str]:
    from selenium.webdriver.common.by import By

    return [r.get_attribute("data-state") for r in driver.find_elements(By.CSS_SELECTOR, "#skipped tr[data-state]")]


def retry_skipped(driver: Any) -> float:
    """Press "Retry skipped items" and confirm; returns when (monotonic) it was confirmed."""
    from selenium.webdriver.common.by import By

    button = until(lambda: driver.find_element(By.ID, "action-retry_skipped"), timeout=30, what="the retry button")
    until(lambda: driver.find_element(By.ID, "action-retry_skipped").is_enabled() or None, timeout=60,
          what="Retry skipped items enabled", on_timeout=lambda: str(button.get_attribute("title")))
    press(driver, "action-retry_skipped", what="Retry skipped items")
    press(driver, "confirm", what="the confirmation")
    return time.monotonic()


def test_the_tour_s_skipped_items_are_counted_as_listed_and_retried_until_replayed(
    env: Env, browser: Any, shots: Path
) -> None:
    """The UI tour's readings import (dags/readings_import.py) at full speed: its four readings in
    °F are skipped; a retry replays them and they are refused again; with the Variable set, the
    next retry imports them. The heading counts what the table lists, in each state, and the note
    of a pending retry goes once the retry ran."""
    from selenium.webdriver.common.by import By

    driver = browser
    login(driver, env)
    job = "readings_import.import_readings"
    # Given the tour's run, finished, with its four readings in °F skipped
    run_id = f"tour_{uuid.uuid4().hex[:6]}"
    env.api.trigger("readings_import", run_id=run_id, conf={"seconds_per_reading": 0})
    wait_for(lambda: (r := env.row(run_id, job=job)) is not None and r.status == "done", timeout=180,
             interval=0.3, what="the readings import to finish")
    wait_for(lambda: env.api.task_instance("readings_import", run_id, "import_readings")["state"] == "success",
             timeout=60, interval=0.5, what="its task instance to succeed")
    frame, _ = open_tab(driver, env, "readings_import", run_id, "import_readings")
    until(lambda: skipped_states(driver) == ["skipped"] * 4 or None, timeout=30, what="the four skipped readings",
          on_timeout=lambda: shown(driver, "body"))
    assert frame_text(driver, "#skipped-counts") == "4 skipped"
    assert "is in °F" in frame_text(driver, "#skipped") and "readings_import_fahrenheit" in frame_text(driver, "#skipped")
    assert "replays its 4 skipped item(s)" in attr(driver, "#action-retry_skipped", "title")

    # When a person retries them (°F still refused): they are replayed by the task's next try and refused again
    clicked = retry_skipped(driver)
    until(lambda: driver.find_elements(By.ID, "retry-pending") or None, timeout=10, what="the pending retry's note")
    pending_note = frame_text(driver, "#retry-pending")
    assert "Retry of 4 skipped item(s) requested by admin" in pending_note, pending_note
    assert frame_text(driver, "#skipped-counts") == "4 retry requested"
    # Then once the retry ran they are skipped again (try 2's error), the counts say so, and the note is gone
    until(lambda: skipped_states(driver) == ["skipped"] * 4 and not driver.find_elements(By.ID, "retry-pending")
          and env.api.task_instance("readings_import", run_id, "import_readings")["try_number"] == 2 or None,
          timeout=180, what="the retry to run and refuse them again", on_timeout=lambda: shown(driver, "body"))
    refused_again_after = time.monotonic() - clicked
    assert frame_text(driver, "#skipped-counts") == "4 skipped"
    until(lambda: not frame_text(driver, "#message") or None, timeout=15, what="the click's answer to go")

    # When the Variable allows °F and they retry again: imported, and counted as replayed
    env.api.request("POST", "/variables", json={"key": "readings_import_fahrenheit", "value": "true"}, expect=(201,))
    try:
        clicked = retry_skipped(driver)
        until(lambda: skipped_states(driver) == ["replayed"] * 4 or None, timeout=180, what="the readings replayed",
              on_timeout=lambda: shown(driver, "body"))
        replayed_after = time.monotonic() - clicked
        until(lambda: frame_text(driver, "#skipped-counts") == "4 replayed" or None, timeout=10,
              what="the heading to count them replayed", on_timeout=lambda: frame_text(driver, "#skipped-title"))
        assert not driver.find_elements(By.ID, "retry-pending")
        assert attr(driver, "#action-retry_skipped", "disabled") is not None  # nothing left to retry
        assert "no skipped item" in attr(driver, "#action-retry_skipped", "title")
        history = frame_text(driver, "#history")
        assert history.count("retry_skipped_requested") == 2 and "admin" in history
        until(lambda: not frame_text(driver, "#message") or None, timeout=15, what="the click's answer to go")
        driver.execute_script("document.getElementById('skipped-title').scrollIntoView()")
        driver.switch_to.default_content()
        driver.save_screenshot(str(shots / "checkpoint-tab-skipped.png"))
    finally:
        env.api.request("DELETE", "/variables/readings_import_fahrenheit", expect=(204, 404))
    record(shots, skipped_items_seconds={"retry_to_refused_again": round(refused_again_after, 2),
                                         "retry_to_replayed": round(replayed_after, 2)})


def test_a_partition_s_retry_skipped_items_button_says_which_run_carries_it_out_and_that_run_replays_them(
    env: Env, browser: Any
) -> None:
    """A partitioned job with a skip policy (``ui_partitioned``): partition 1 skipped a refused row.
    Its Checkpoint tab's "Retry skipped items" clears the partition's task instance, says so beside
    the pending retry (which run carries it out), and that run replays the row through the
    partition's own process."""
    import sqlite3

    from selenium.webdriver.common.by import By

    driver = browser
    login(driver, env)
    # Given 20 rows in two partitions (ids 1..10, 11..20), row 14 refused by the process
    with sqlite3.connect(env.store.path) as db:
        db.executescript("DROP TABLE IF EXISTS ui_pt_source; DROP TABLE IF EXISTS ui_pt_sink;"
                         "DROP TABLE IF EXISTS ui_pt_refused;"
                         "CREATE TABLE ui_pt_source (id INTEGER PRIMARY KEY); CREATE TABLE ui_pt_sink (id INTEGER PRIMARY KEY);"
                         "CREATE TABLE ui_pt_refused (id INTEGER PRIMARY KEY); INSERT INTO ui_pt_refused VALUES (14);")
        db.executemany("INSERT INTO ui_pt_source VALUES (?)", [(i,) for i in range(1, 21)])
    run_id = f"ui_pt_{uuid.uuid4().hex[:6]}"
    job = "ui_partitioned.export[1]"
    env.api.trigger("ui_partitioned", run_id=run_id, conf={})
    wait_for(lambda: env.api.dag_run("ui_partitioned", run_id)["state"] in ("success", "failed") or None,
             timeout=180, interval=0.5, what="the partitioned run to end", on_timeout=env.airflow.tail)
    assert env.api.dag_run("ui_partitioned", run_id)["state"] == "success"
    assert env.row(run_id, job=job).status == "done"
    # and the refused row allowed now
    with sqlite3.connect(env.store.path) as db:
        db.execute("DELETE FROM ui_pt_refused")

    # When a person opens partition 1's Checkpoint tab and presses "Retry skipped items"
    open_tab(driver, env, "ui_partitioned", run_id, "export.partition/mapped/1")
    until(lambda: skipped_states(driver) == ["skipped"] or None, timeout=30, what="the skipped row",
          on_timeout=lambda: shown(driver, "body"))
    assert "row 14 is refused" in frame_text(driver, "#skipped")
    retry_skipped(driver)

    # Then the tab says which run carries the retry out: the partition's task instance, cleared for it
    note = until(lambda: frame_text(driver, "#retry-next-run") or None, timeout=30, what="which run carries it out",
                 on_timeout=lambda: shown(driver, "body"))
    assert "ui_partitioned, task export.partition[1], run " + run_id in note, note
    assert "was cleared: its next run replays them first" in note, note
    assert "Retry of 1 skipped item(s) requested by admin" in frame_text(driver, "#retry-pending")
    # And that run replays the row through the partition's process: it is copied, marked replayed, the note gone
    until(lambda: skipped_states(driver) == ["replayed"] and not driver.find_elements(By.ID, "retry-pending") or None,
          timeout=180, what="the partition's next run to replay the row", on_timeout=lambda: shown(driver, "body"))
    assert env.api.get(f"/dags/ui_partitioned/dagRuns/{run_id}/taskInstances/export.partition/1")["try_number"] == 2
    with sqlite3.connect(env.store.path) as db:
        assert db.execute("SELECT count(*) FROM ui_pt_sink WHERE id = 14").fetchone() == (1,)
    assert not driver.find_elements(By.ID, "retry-next-run")


def test_the_rest_api_of_a_real_api_server_applies_airflow_auth(env: Env) -> None:
    import httpx

    base = env.airflow.base_url + "/resumable/api/v1"
    run_id = f"rest_{uuid.uuid4().hex[:6]}"
    env.api.trigger(DAG_ID, run_id=run_id, conf={"items": 4, "delay": 0.01})
    wait_for(lambda: (r := env.row(run_id)) is not None and r.status == "done", timeout=180, interval=0.3,
             what="a short export to finish")
    slot = {"job": JOB, "slot": run_id}
    passwords = json.loads((env.airflow.home / "simple_auth_manager_passwords.json.generated").read_text())

    def token(user: str) -> str:
        r = httpx.post(env.airflow.base_url + "/auth/token", json={"username": user, "password": passwords[user]})
        r.raise_for_status()
        return r.json()["access_token"]

    admin = {"Authorization": f"Bearer {token('admin')}"}
    viewer = {"Authorization": f"Bearer {token('viewer')}"}
    with httpx.Client(timeout=30) as http:
        assert http.get(f"{base}/checkpoints").status_code == 401
        listed = http.get(f"{base}/checkpoints", params={"dag_id": DAG_ID}, headers=viewer)
        assert listed.status_code == 200 and run_id in [r["slot"] for r in listed.json()["checkpoints"]]
        one = http.get(f"{base}/checkpoint", params=slot, headers=viewer).json()
        assert (one["status"], one["processed"], one["offers"]["restart"]) == ("done", 4, True)
        assert http.post(f"{base}/checkpoint/restart", params=slot, headers=viewer).status_code == 403
        assert http.get(f"{base}/checkpoint", params={**slot, "job": "nope"}, headers=admin).status_code == 404
        refused = http.post(f"{base}/checkpoint/pause", params=slot, headers=admin)
        assert refused.status_code == 409 and "finished" in refused.json()["message"]
        done = http.post(f"{base}/checkpoint/restart", params=slot, headers=admin)
        assert done.status_code == 200 and done.json()["history"][-1]["requested_by"] == "admin"


def test_the_jobs_page_counts_a_mapped_jobs_partitions_and_re_runs_the_failed_ones(
    env: Env, browser: Any, shots: Path
) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    login(driver, env)
    # Given a mapped run whose partition 1 failed and whose partitions 0 and 2 are done
    run_id = f"parts_{uuid.uuid4().hex[:6]}"
    env.api.trigger("ui_parts", run_id=run_id, conf={})
    wait_for(lambda: [getattr(env.row(run_id, job=f"ui_parts.part[{i}]"), "status", None) for i in range(3)]
             == ["done", "failed", "done"], timeout=180, interval=0.3, what="the partitions to end")
    # and Airflow has recorded partition 1's task instance as failed (the row says so first)
    wait_for(lambda: env.api.get(f"/dags/ui_parts/dagRuns/{run_id}/taskInstances/part/1")["state"] == "failed",
             timeout=120, interval=0.5, what="Airflow to record partition 1 as failed")
    # When a person opens the jobs page in a 1280 px window
    driver.switch_to.default_content()
    driver.set_window_size(1280, 900)
    driver.get(f"{env.airflow.base_url}/plugin/resumable-jobs")
    jobs = until(lambda: driver.find_element(By.CSS_SELECTOR, "iframe[title='Resumable jobs']"), timeout=60,
                 what="the jobs page's frame")
    driver.switch_to.frame(jobs)
    # Then one line for the job counts its partitions
    line = until(lambda: driver.find_element(By.CSS_SELECTOR, "#summary tr[data-job^='ui_parts.part']"), timeout=30,
                 what="the mapped job's line", on_timeout=lambda: shown(driver, "body"))
    assert "2 done" in line.text and "1 failed" in line.text and "of 3 partitions" in line.text, line.text
    assert "10 / 12" in line.text, line.text  # the job's progress: the sum of its partitions'
    # And every action of every job's line is wholly visible, the re-run first, each saying what it does
    until(lambda: line.find_element(By.CSS_SELECTOR, "button.rerun-failed"), timeout=10, what="the re-run button")
    texts = assert_buttons_visible(driver, jobs, "#summary tr:not([hidden]) button")
    assert "Re-run failed partitions" in texts, texts
    rerun_title = line.find_element(By.CSS_SELECTOR, "button.rerun-failed").get_attribute("title")
    assert f"Clears the 1 failed partition of run {run_id}" in rerun_title, rerun_title
    driver.switch_to.default_content()
    driver.save_screenshot(str(shots / "jobs-page.png"))
    # (and in a 900 px window, where the table scrolls sideways: the actions sit under the job's name)
    driver.set_window_size(900, 900)
    narrow = until(lambda: driver.find_element(By.CSS_SELECTOR, "iframe[title='Resumable jobs']"), timeout=30,
                   what="the jobs page's frame")
    driver.switch_to.frame(narrow)
    until(lambda: driver.find_elements(By.CSS_SELECTOR, "#summary tr button.rerun-failed") or None, timeout=30,
          what="the re-run button at 900 px")
    assert "Re-run failed partitions" in assert_buttons_visible(driver, narrow, "#summary tr:not([hidden]) button")
    driver.switch_to.default_content()
    driver.set_window_size(1280, 900)
    jobs = until(lambda: driver.find_element(By.CSS_SELECTOR, "iframe[title='Resumable jobs']"), timeout=30,
                 what="the jobs page's frame")
    driver.switch_to.frame(jobs)
    line = until(lambda: driver.find_element(By.CSS_SELECTOR, "#summary tr[data-job^='ui_parts.part']"), timeout=30,
                 what="the mapped job's line")
    # And its partitions open from the line, each a link into its own Checkpoint tab
    until(lambda: driver.find_element(By.CSS_SELECTOR, "#summary tr[data-job^='ui_parts.part'] button.show-partitions"),
          timeout=10, what="the Partitions button").click()
    links = until(lambda: [a.text for a in driver.find_elements(By.CSS_SELECTOR, "#partitions a.partition-link")] or None,
                  timeout=30, what="the job's partitions", on_timeout=lambda: shown(driver, "#job-partitions"))
    assert links == [f"Checkpoint of ui_parts.part[{i}]" for i in range(3)], links
    # And the failed partition's row says why it failed
    errors = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#partitions tr[data-partition] td.partition-error")]
    assert errors[0] == errors[2] == "" and "partition failed at 2 (on purpose)" in errors[1], errors
    driver.switch_to.default_content()
    driver.save_screenshot(str(shots / "jobs-page-partitions.png"))
    driver.switch_to.frame(jobs)
    line = until(lambda: driver.find_element(By.CSS_SELECTOR, "#summary tr[data-job^='ui_parts.part']"), timeout=30,
                 what="the mapped job's line")
    # When they press "Re-run failed partitions" and confirm
    line.find_element(By.CSS_SELECTOR, "button.rerun-failed").click()
    # (the confirmation names what the re-run clears, read from Airflow's states as the re-run reads them)
    asked = until(lambda: frame_text(driver, "#confirmation") or None, timeout=30, what="the confirmation")
    assert asked.startswith(f"Re-run failed partition 1 of ui_parts.part in run {run_id} (as Airflow has it now)?"), asked
    press(driver, "confirm", what="the confirmation")
    clicked = time.monotonic()
    # Then partition 1 alone is cleared (the answer is a sentence), and its next try resumes it to done
    answer = until(lambda: frame_text(driver, "#rerun-result") or None, timeout=90, what="the re-run's answer",
                   on_timeout=lambda: f"page: {driver.find_element(By.TAG_NAME, 'body').text}")
    rerun_seconds = time.monotonic() - clicked
    assert answer == (f"Cleared failed partition 1 of ui_parts.part in run {run_id}: Airflow runs it again from its "
                      "checkpoint."), answer
    wait_for(lambda: env.api.get(f"/dags/ui_parts/dagRuns/{run_id}/taskInstances/part/1")["try_number"] == 2,
             timeout=120, interval=0.5, what="partition 1's second try")
    assert env.api.get(f"/dags/ui_parts/dagRuns/{run_id}/taskInstances/part/0")["try_number"] == 1
    # And a partition's Checkpoint tab names the whole job and opens its partitions
    tab, _ = open_tab(driver, env, "ui_parts", run_id, "part/mapped/0")
    # (its buttons wholly visible at 1280 px too)
    until(lambda: driver.find_elements(By.CSS_SELECTOR, "#actions button") or None, timeout=30, what="the buttons")
    assert assert_buttons_visible(driver, tab, "#actions button") == ["Pause", "Resume", "Cancel", "Restart", "Release"]
    whole = until(lambda: driver.find_element(By.ID, "whole-job"), timeout=30, what="the link to the whole job")
    assert whole.text == "ui_parts.part (the whole job)", whole.text
    whole.click()
    parts = until(lambda: [r.get_attribute("data-partition") for r in driver.find_elements(
        By.CSS_SELECTOR, "#partitions tr[data-partition]")] or None, timeout=30, what="the whole job's partitions")
    assert parts == ["0", "1", "2"], parts
    driver.switch_to.default_content()
    driver.set_window_size(1440, 1000)
    record(shots, rerun_failed_to_answer_seconds=round(rerun_seconds, 2))


def test_the_tab_of_a_run_the_overlap_policy_skipped_names_the_run_it_yielded_to(
    env: Env, browser: Any, shots: Path
) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    login(driver, env)
    # Given a run of a shared job still running, and a second run that found it so (overlap="skip")
    first, second = f"ov_{uuid.uuid4().hex[:6]}", f"ov_{uuid.uuid4().hex[:6]}"
    env.api.trigger("ui_overlap", run_id=first, conf={"items": 60, "delay": 0.25})
    wait_for(lambda: (r := env.row(first, job="ui_overlap.shared")) is not None and r.status == "running",
             timeout=180, interval=0.2, what="the first run to hold the job")
    env.api.trigger("ui_overlap", run_id=second, conf={"items": 60, "delay": 0.25})
    wait_for(lambda: env.api.task_instance("ui_overlap", second, "export")["state"] == "skipped", timeout=180,
             interval=0.5, what="the second run to be skipped")
    # When a person opens the skipped task instance's Checkpoint tab
    frame, _ = open_tab(driver, env, "ui_overlap", second, "export")
    # Then it says the overlap policy skipped it, and which run it yielded to (a link to that run's tab)
    note = until(lambda: driver.find_element(By.ID, "overlap"), timeout=30, what="the overlap note",
                 on_timeout=lambda: shown(driver, "body"))
    assert "overlap policy (skip)" in note.text and first in note.text, note.text
    driver.switch_to.default_content()
    driver.save_screenshot(str(shots / "checkpoint-tab-overlap.png"))
    driver.switch_to.frame(frame)
    driver.find_element(By.ID, "yielded-to").click()
    driver.switch_to.default_content()
    until(lambda: driver.execute_script("return location.pathname")
          == f"/dags/ui_overlap/runs/{first}/tasks/export/plugin/checkpoint" or None, timeout=30,
          what="the run it yielded to, opened in the Airflow UI")
