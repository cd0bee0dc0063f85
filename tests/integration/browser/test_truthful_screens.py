"""The screens never mislead, in a real browser against a real Airflow: every request's button is
enabled exactly where the rules table offers it, in every status, pending request and lease, with a
tooltip saying what it would do now or why not; who pressed Cancel is named (a name with markup
stays text) and the Storage tab's link opens the tab inside the Airflow UI; the jobs page's filters
live in its address (odd values included).

The deployment and the browser are the folder's (conftest.py), shared with test_tour.py.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from support.browser import (
    DAG_ID,
    JOB,
    MARKUP_USER,
    TASK_ID,
    Env,
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


RULES_DAG, RULES_RUN, RULES_TASK = "ui_rules", "rules_run", "export"


#: A name with markup in it, as a request's author on the row: it must stay text.
MARKUP_NAME = '<img src=x onerror="window.__pwned=1">'


def test_every_request_button_is_enabled_exactly_where_the_rules_offer_it_and_says_what_it_would_do(
    env: Env, browser: Any
) -> None:
    """A slot in every status, with every pending request and every kind of lease (its row written by
    hand): the tab enables each button exactly where the rules table (core/model/request_rules.py) offers that
    request, and each button's tooltip is the table's sentence for this slot now (what it does, or
    why not). A requester's name with markup in it stays text in the tooltips."""
    from selenium.webdriver.common.by import By

    from airflow_resumable.core.control.requests import now_of
    from airflow_resumable.core.model import request_rules as rules
    from airflow_resumable.core.model.request_rules import Action, Lease, Slot
    from airflow_resumable.core.model.states import Status
    from airflow_resumable.core.view import liveness_of
    from support.rule_rows import JOB as RULES_JOB
    from support.rule_rows import REQUESTS, seed, set_row

    driver = browser
    login(driver, env)
    seed(env.store)
    with env.store.open() as s:
        s.execute("UPDATE resumable_checkpoints SET dag_id = %s, task_id = %s, run_id = %s, map_index = -1, "
                  "requested_by = %s WHERE job = %s", (RULES_DAG, RULES_TASK, RULES_RUN, MARKUP_NAME, RULES_JOB))
        s.commit()
    url = (f"{env.airflow.base_url}/resumable/ui/checkpoint?dag_id={RULES_DAG}&run_id={RULES_RUN}"
           f"&task_id={RULES_TASK}&map_index=-1")
    checked = 0
    for status, request, lease in itertools.product(Status, REQUESTS, Lease):
        row = set_row(env.store, Slot(status, request, lease), None)
        now = now_of(row)
        expected = rules.offers(rules.slot_of(row, now))
        # the badge shows the slot as the one rule does: a running row nobody holds is abandoned
        badge = liveness_of(row, now).shown
        driver.get(url)
        until(lambda badge=badge: frame_text(driver, "#status").startswith(badge) and
              driver.find_elements(By.CSS_SELECTOR, "#actions button") or None, timeout=30,
              what=f"the tab of a {status} slot shown {badge}", on_timeout=lambda: shown(driver, "body"))
        if badge == "abandoned":  # says so, and why, beside the badge
            assert "nobody runs this slot" in frame_text(driver, "#liveness"), f"{status}/{request}/{lease}"
        # every button's state and tooltip in one script (a refresh between two reads re-renders them)
        states = driver.execute_script(
            "return arguments[0].map(function (a) { var b = document.getElementById('action-' + a);"
            " return b ? [!b.disabled, b.title] : null; });", [a.value for a in Action])
        for action, (enabled, title) in zip(Action, states, strict=True):
            where = f"{action.value} of {status}/{request}/{lease}"
            assert enabled == expected[action.value], where
            assert title == rules.explain(action, row, now), where
        checked += 1
        # the name with markup stayed text: no element made of it, no script run
        assert not driver.find_elements(By.CSS_SELECTOR, "#root img")
        assert driver.execute_script("return window.__pwned === undefined")
    assert checked == len(Status) * len(REQUESTS) * len(Lease)
    # The table's own example: Pause on a failed slot is offered, and says when it takes effect
    set_row(env.store, Slot(Status.FAILED, None, Lease.NONE), None)
    driver.get(url)
    until(lambda: frame_text(driver, "#status").startswith("failed") or None, timeout=30, what="the failed slot")
    assert driver.find_element(By.ID, "action-pause").is_enabled()
    assert "its next attempt (a retry or a Clear) pauses before its first chunk" in attr(driver, "#action-pause", "title")
    assert attr(driver, "#action-cancel", "title").startswith("Not now: the slot is failed: no attempt runs it")


def test_a_cancel_pressed_in_the_tab_names_the_person_and_the_storage_link_opens_the_tab_in_the_ui(
    env: Env, browser: Any, shots: Path
) -> None:
    """The UI's user who pressed Cancel is named in the row's last error and its history (not "the
    control API"); a user whose name holds markup, cancelling through REST, is shown as text. The
    summary in Airflow's task state store (the Storage tab) links to the tab inside the Airflow UI."""
    import httpx
    from selenium.webdriver.common.by import By

    driver = browser
    login(driver, env)
    pressed, by_rest = f"ui_{uuid.uuid4().hex[:6]}", f"ui_{uuid.uuid4().hex[:6]}"
    for run in (pressed, by_rest):
        env.api.trigger(DAG_ID, run_id=run, conf={"items": 200, "delay": 0.25})
    for run in (pressed, by_rest):
        wait_for(lambda run=run: (r := env.row(run)) is not None and r.status == "running" and r.processed >= 2,
                 timeout=180, interval=0.2, what="the export to make progress")

    # When the admin presses Cancel in the tab and confirms
    frame, _ = open_tab(driver, env, DAG_ID, pressed, TASK_ID)
    until(lambda: driver.find_element(By.ID, "action-cancel").is_enabled() or None, timeout=30, what="Cancel enabled")
    assert "stops at its next chunk boundary" in attr(driver, "#action-cancel", "title")
    press(driver, "action-cancel", what="Cancel enabled")
    asked = until(lambda: frame_text(driver, "#confirmation") or None, timeout=10, what="the confirmation")
    assert "Cancel this slot's run? The run stops at its next chunk boundary" in asked, asked
    press(driver, "confirm", what="the confirmation")
    clicked = time.monotonic()
    # Then the run stops as cancelled, and its last error and history name the admin
    until(lambda: frame_text(driver, "#status").startswith("cancelled") or None, timeout=60,
          what="the tab to say cancelled", on_timeout=lambda: shown(driver, "body"))
    cancelled_after = time.monotonic() - clicked
    assert frame_text(driver, "#last-error") == "cancel requested by admin"
    history = frame_text(driver, "#history")
    assert "cancel_requested admin" in history and "requested: cancel requested by admin" in history, history
    assert env.row(pressed).last_error == "cancel requested by admin"
    driver.switch_to.default_content()
    driver.save_screenshot(str(shots / "checkpoint-tab-cancelled.png"))

    # When a user whose name holds markup cancels the other run through REST
    passwords = json.loads((env.airflow.home / "simple_auth_manager_passwords.json.generated").read_text())
    with httpx.Client(base_url=env.airflow.base_url, timeout=30) as http:
        token = http.post("/auth/token", json={"username": MARKUP_USER, "password": passwords[MARKUP_USER]})
        token.raise_for_status()
        done = http.post("/resumable/api/v1/checkpoint/cancel", params={"job": JOB, "slot": by_rest},
                         headers={"Authorization": f"Bearer {token.json()['access_token']}"})
    assert done.status_code == 200, done.text
    # Then the admin's tab shows the name as text, in the last error and the history
    frame, _ = open_tab(driver, env, DAG_ID, by_rest, TASK_ID)
    until(lambda: frame_text(driver, "#status").startswith("cancelled") or None, timeout=60,
          what="the other run cancelled", on_timeout=lambda: shown(driver, "body"))
    assert frame_text(driver, "#last-error") == f"cancel requested by {MARKUP_USER}"
    assert MARKUP_USER in frame_text(driver, "#history")
    assert not driver.find_elements(By.CSS_SELECTOR, "#root i")

    # And the Storage tab's summary links to the tab on the Airflow UI's own route
    summary = wait_for(lambda: (env.api.request(
        "GET", f"/dags/{DAG_ID}/dagRuns/{pressed}/taskInstances/{TASK_ID}/state-store/resumable",
        expect=(200, 404)) or {}).get("value"), timeout=60, interval=0.5, what="the task state store's summary")
    link = summary["checkpoint_tab"]
    assert link == f"{env.airflow.base_url}/dags/{DAG_ID}/runs/{pressed}/tasks/{TASK_ID}/plugin/checkpoint", link
    driver.switch_to.default_content()
    driver.get(link)
    opened = time.monotonic()
    frame = until(lambda: driver.find_element(By.CSS_SELECTOR, "iframe[title='Checkpoint']"), timeout=60,
                  what="the Checkpoint tab inside the Airflow UI", on_timeout=lambda: driver.current_url)
    driver.switch_to.frame(frame)
    until(lambda: frame_text(driver, "#status").startswith("cancelled") or None, timeout=30, what="the linked tab")
    link_seconds = time.monotonic() - opened
    driver.switch_to.default_content()
    assert driver.find_element(By.TAG_NAME, "nav")  # Airflow's own page around it, not the bare plugin page
    record(shots, cancel_seconds={"cancel_to_tab_cancelled": round(cancelled_after, 2),
                                  "storage_link_to_tab": round(link_seconds, 2)})


def test_the_jobs_page_takes_odd_filter_values_from_its_address_as_text(env: Env, browser: Any) -> None:
    """A shared address whose filters hold markup, a control character, a status that does not
    exist and an over-long DAG id: the page shows them as text, ignores the unknown status saying
    so, sends the API only what it accepts, and keeps working."""
    from urllib.parse import quote

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = browser
    login(driver, env)
    odd = '<script>window.__pwned=1</script>"\x00x' + "y" * 300
    for path in ("/plugin/resumable-jobs/resumable/ui/jobs", "/plugin/resumable-jobs"):
        driver.switch_to.default_content()
        driver.get(f"{env.airflow.base_url}{path}?dag_id={quote(odd)}&status={quote('bogus<b>')}")
        jobs = until(lambda: driver.find_element(By.CSS_SELECTOR, "iframe[title='Resumable jobs']"), timeout=60,
                     what="the jobs page's frame")
        driver.switch_to.frame(jobs)
        until(lambda: "updated" in frame_text(driver, "#refreshed") or None, timeout=30, what="the page's answer",
              on_timeout=lambda: shown(driver, "body"))
        typed = driver.find_element(By.NAME, "dag_id").get_attribute("value")
        assert typed == ('<script>window.__pwned=1</script>"x' + "y" * 300)[:250], (path, typed)
        assert Select(driver.find_element(By.NAME, "status")).first_selected_option.text == "any"
        assert "Status “bogus<b>” is not one of" in frame_text(driver, "#filter-note"), path
        assert frame_text(driver, "#message") == "No slots match.", (path, frame_text(driver, "#message"))
        assert driver.execute_script("return window.__pwned === undefined && !document.querySelector('#root b')")
