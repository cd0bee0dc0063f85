"""Rebalancing through a real scheduler (LocalExecutor): four partitions side by side over a skewed
table (tests/dags/rebalance_dags.py: the first partition's rows cost 25x), on PostgreSQL. The
partitions that finish early take the upper half of what the slow one has left, agreed at its
checkpoints; every row is written exactly once, every range of the plan ends ``done``, and the
summary counts the plan's rows once. Then headless Chromium opens the jobs page of that same
Airflow and reads what a person sees there: the job's line with its splits listed (each range taken,
where from, who runs it, how it stands, how far it got) and counts that agree with the plan; and a
taking partition's Checkpoint tab says which range of the plan its slot reads, lists every slot its
task instance ran, and shows the partition's own on a click. The screenshots go where the browser
tests' go (``$RESUMABLE_SCREENSHOTS``).
"""

from __future__ import annotations

import json
from contextlib import closing
from typing import Any

import psycopg2
import pytest

from devtools.postgres import Server, dsn
from support.browser import (
    chromium,
    frame_text,
    need_chromium,
    open_checkpoint_tab,
    screenshots,
    shown,
    sign_in,
    until,
)
from support.paths import TESTS
from support.standalone import Standalone

DAG_ID = "rebalance_skewed"
ROWS = 400
JOB = f"{DAG_ID}.export"

# browser too: it runs in CI's celery-browser group (scripts/test.sh), once
pytestmark = [pytest.mark.scheduler, pytest.mark.browser]


def _rows(params: dict[str, Any], sql: str) -> list[tuple[Any, ...]]:
    with closing(psycopg2.connect(**params)) as conn:
        cur = conn.cursor()
        cur.execute(sql)
        return [tuple(r) for r in cur.fetchall()]


def test_four_skewed_partitions_rebalance_and_write_every_row_once(pg_server: Server) -> None:
    need_chromium()
    store = pg_server.create_database("resumable_rebalance_store")
    metadata = dsn(pg_server.create_database("resumable_rebalance_meta")).replace(
        "postgresql://", "postgresql+psycopg2://", 1)
    airflow = Standalone(metadata_uri=metadata, dag_files=[TESTS / "dags" / "rebalance_dags.py"], env={
        "AIRFLOW_CONN_RESUMABLE_DEFAULT": dsn(store),
        "AIRFLOW__CORE__PARALLELISM": "8",
    })
    try:
        airflow.start()
        airflow.serve((DAG_ID,))
        api = airflow.api
        assert api is not None
        # Given the skewed job, triggered once
        api.trigger(DAG_ID, run_id="skew_1")
        # When it runs to its end
        state = api.run_state(DAG_ID, "skew_1", timeout=300, interval=1.0, what="the run to end",
                              on_timeout=lambda: airflow.tail(80))
        slots = _rows(store, f"SELECT job, status, processed, total, last_error FROM resumable_checkpoints "
                             f"WHERE job LIKE '{JOB}[%' ORDER BY job")
        assert state == "success", (slots, airflow.tail(80))
        # Then the idle partitions took part of the slow one's range: the plan records the splits
        plan = json.loads(_rows(store, f"SELECT state FROM resumable_checkpoints WHERE job = '{JOB}#plan'")[0][0])
        # (the slow partition's, mostly; under load the scheduler starts the others late, and any
        # partition still running with enough left is asked)
        assert plan["splits"], plan
        # And every range of the plan ran to its end: the four partitions and one slot per split
        assert len(slots) == 4 + len(plan["splits"]), slots
        assert {status for _, status, *_ in slots} == {"done"}, slots
        # And every row was written exactly once, some by a slot that took it
        written = _rows(store, "SELECT id, count(*), min(job) FROM skew_export GROUP BY id ORDER BY id")
        assert [i for i, *_ in written] == list(range(1, ROWS + 1))
        assert {n for _, n, _ in written} == {1}
        assert any("]." in job for *_, job in written), "no row was written by a taken range"
        # And the summary counts the plan's rows once
        summary = api.get(f"/dags/{DAG_ID}/dagRuns/skew_1/taskInstances/export.summary/xcomEntries/return_value"
                          )["value"]
        summary = json.loads(summary) if isinstance(summary, str) else summary
        assert (summary["planned"], summary["processed"], summary["done"], summary["unfinished"]) == (ROWS, ROWS, 4, 0)
        # And a person sees all of it in the browser: the jobs page and a taking partition's tab
        _the_browser_shows_the_splits(airflow, store, plan)
    finally:
        airflow.close()


def _job_of(name: str) -> str:
    """The job reading range ``name`` of the plan: ``"1"`` → ``<job>[1]``, ``"1.2"`` → ``<job>[1].2``."""
    index, _, number = name.partition(".")
    return f"{JOB}[{index}]" + (f".{number}" if number else "")


def _keys(low: Any, high: Any) -> str:
    """A range's keys as the page says them: after ``low`` (None: from the first) up to ``high``."""
    return ("keys " + ("from the first" if low is None else f"after {low:,}") +
            (" to the last" if high is None else f" up to {high:,}"))


def _the_browser_shows_the_splits(airflow: Standalone, store: dict[str, Any], plan: dict[str, Any]) -> None:
    from selenium.webdriver.common.by import By

    rows = {job: (status, processed, total, map_index) for job, status, processed, total, map_index in _rows(
        store, f"SELECT job, status, processed, total, map_index FROM resumable_checkpoints WHERE job LIKE '{JOB}[%'")}
    # Each split of the plan as the page must list it: the range it took (named by the partition its
    # line descends from and the split's number), the keys it holds now (each split cuts the range it
    # is taken from at its key, in the order agreed), the range it was taken from, and its row
    bounds = [None, *plan["boundaries"], None]
    keys = {str(i): (bounds[i], bounds[i + 1]) for i in range(plan["partitions"])}
    expected = {}
    for cut in plan["splits"]:
        name = f"{cut['of'].split('.')[0]}.{cut['number']}"
        low, high = keys[cut["of"]]
        keys[cut["of"]], keys[name] = (low, cut["at"]), (cut["at"], high)
        expected[name] = {"job": _job_of(name), "from": _job_of(cut["of"]), "by": cut["by"], "row": rows[_job_of(name)]}
    splits = plan["splits"]
    folder = screenshots()
    with chromium() as driver:
        sign_in(driver, airflow)
        # When a person opens the jobs page
        driver.get(f"{airflow.base_url}/plugin/resumable-jobs")
        frame = until(lambda: driver.find_element(By.CSS_SELECTOR, "iframe[title='Resumable jobs']"), timeout=60,
                      what="the jobs page's frame")
        driver.switch_to.frame(frame)
        line_css = f"#summary tr[data-job='{JOB}']"
        listed = until(lambda: len(driver.find_elements(By.CSS_SELECTOR, f"{line_css} ul.splits li")) == len(splits)
                       or None, timeout=30, what="the job's line with its splits",
                       on_timeout=lambda: shown(driver, "body"))
        assert listed
        # Then the job's line counts its four partitions done, each once, and the plan's rows once:
        # planned = processed + skipped (none skipped)
        assert frame_text(driver, f"{line_css} td.standing") == "4 done of 4 partitions"
        assert frame_text(driver, f"{line_css} td.job-processed") == f"{ROWS} / {ROWS} · {ROWS} planned"
        # And it lists every split of the plan, in the order agreed: the range taken, from where, by
        # whom, who ran it (the taking partition's task instance), how it ended and how far it got
        items = driver.find_elements(By.CSS_SELECTOR, f"{line_css} ul.splits li")
        assert [li.get_attribute("data-range") for li in items] == list(expected), shown(driver, line_css)
        for li in items:
            want = expected[li.get_attribute("data-range")]
            status, processed, total, map_index = want["row"]
            text = li.text
            assert text.startswith(f"range {li.get_attribute('data-range')} ({want['job']}, "
                                   f"{_keys(*keys[li.get_attribute('data-range')])}) taken from "
                                   f"{want['from']} by {want['by']} at "), text
            assert text.endswith(f": run by [{map_index}], {status}, {processed} / {total}"), text
        driver.switch_to.default_content()
        driver.save_screenshot(str(folder / "jobs-page-splits.png"))

        # When they open the Checkpoint tab of a partition that took a range: it shows the slot its
        # task instance ran last, that range
        last = _rows(store, f"SELECT DISTINCT ON (map_index) task_id, map_index, job FROM resumable_checkpoints "
                            f"WHERE job LIKE '{JOB}[%' ORDER BY map_index, updated_at DESC")
        task_id, map_index, job = next(r for r in last if "]." in r[2])
        name = next(name for name, want in expected.items() if want["job"] == job)
        open_checkpoint_tab(driver, f"{airflow.base_url}/dags/{DAG_ID}/runs/skew_1/tasks/{task_id}/mapped/{map_index}")
        # Then the tab says which range of the plan the slot reads, and where it was taken from
        text = until(lambda: frame_text(driver, "#range") or None, timeout=30, what="the slot's range on its tab",
                     on_timeout=lambda: shown(driver, "body"))
        assert driver.find_element(By.ID, "range").get_attribute("data-range") == name, shown(driver, "dl")
        # (and the job it is a range of is the whole job, not the range's own)
        assert frame_text(driver, "#whole-job") == f"{JOB} (the whole job)", shown(driver, "dl")
        assert f"{job} — a range of {JOB} (the whole job)" in frame_text(driver, "dl"), shown(driver, "dl")
        assert text.startswith(f"{name} of the job's plan: {_keys(*keys[name])}, taken from {expected[name]['from']} "
                               f"by {expected[name]['by']} at "), text
        # And it lists every slot its task instance ran, the one shown first, each a way to show it
        ran = {job: row for job, row in rows.items() if row[3] == map_index}
        assert {a.get_attribute("data-job") for a in driver.find_elements(By.CSS_SELECTOR, "#ran [data-job]")} == set(ran)
        assert frame_text(driver, "#ran strong") == f"{job} (shown)"
        driver.switch_to.default_content()
        driver.save_screenshot(str(folder / "checkpoint-tab-taken-range.png"))

        # When they click the partition's own job there
        own = f"{JOB}[{map_index}]"
        frame = driver.find_element(By.CSS_SELECTOR, "iframe[title='Checkpoint']")
        driver.switch_to.frame(frame)
        until(lambda: driver.execute_script("var a = document.querySelector(arguments[0]); if (!a) return false; "
                                            "a.click(); return true;", f"#ran a[data-job='{own}']") or None,
              timeout=10, what="the link to the partition's own slot")
        # Then the tab shows that slot: its own range's figures, as its row has them
        until(lambda: frame_text(driver, "#ran strong") == f"{own} (shown)" or None, timeout=30,
              what="the partition's own slot in the tab", on_timeout=lambda: shown(driver, "body"))
        status, processed, total, _ = rows[own]
        assert frame_text(driver, "#figures").startswith(f"{processed} / {total} items"), shown(driver, "body")
        assert frame_text(driver, "#status").startswith(status), shown(driver, "body")
