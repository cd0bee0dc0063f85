"""What the browser tests share (tests/integration/browser/): the DAGs the UI shows, Chromium's
place and arguments, the deployment under test, and the steps a person takes in the page (log in,
press, open the Checkpoint tab, read what it shows), each waiting on what the page shows, with a
deadline; the times measured go next to the screenshots.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from airflow_resumable.core import SQLiteStore
from support.paths import ROOT
from support.standalone import Standalone, wait_for

DAG_FILE = ROOT / "tests" / "dags" / "browser_dags.py"


#: The UI tour's own DAG (docs/how-to/ui.md): its skipped items and their retry.
TOUR_DAG_FILE = ROOT / "dags" / "readings_import.py"


#: A user whose name holds markup (the simple auth manager takes any name without ':' or ',').
MARKUP_USER = "<i>eve</i>"

DAG_ID, TASK_ID = "ui_export", "export"

JOB = f"{DAG_ID}.{TASK_ID}"

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"

CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1440,1000")


def need_chromium() -> None:
    """Fail the test, saying what to install, when Debian's Chromium or its chromedriver is missing
    (before a test starts Airflow: minutes of it would be wasted)."""
    import pytest

    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            pytest.fail(f"{path} is missing: apt-get install -y chromium chromium-driver (make browser-deps)",
                        pytrace=False)


@contextmanager
def chromium() -> Iterator[Any]:
    """Headless Chromium (Debian's, driven by its chromedriver through Selenium; nothing is
    downloaded), on a profile of its own, quit and its profile removed at the end."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    need_chromium()
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager: never look for a driver online
    profile = tempfile.mkdtemp(prefix="resumable-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (*CHROMIUM_ARGS, f"--user-data-dir={profile}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshots() -> Path:
    """Where screenshots (and measurements.json) go: ``$RESUMABLE_SCREENSHOTS`` (``make screenshots``
    sets ``docs/screenshots``), else a temporary folder."""
    folder = Path(os.environ.get("RESUMABLE_SCREENSHOTS") or tempfile.mkdtemp(prefix="resumable-shots-"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


#: The tab's refresh period while the slot is live (resumable.js REFRESH_MS); the issue asks <= 5 s.
REFRESH = 2.0

T = TypeVar("T")


class Env:
    def __init__(self, airflow: Standalone, store: SQLiteStore):
        self.airflow, self.store = airflow, store

    @property
    def api(self) -> Any:
        assert self.airflow.api is not None
        return self.airflow.api

    def row(self, run_id: str, *, job: str = JOB) -> Any:
        with self.store.open() as s:
            return s.checkpoints.load(job, run_id)


def until(condition: Callable[[], T | None], *, timeout: float, what: str,
          on_timeout: Callable[[], str] | None = None) -> T:
    """``wait_for`` that also rides over a page that is being re-rendered (stale or missing elements)."""
    from selenium.common.exceptions import WebDriverException

    def attempt() -> T | None:
        try:
            return condition()
        except WebDriverException:
            return None

    return wait_for(attempt, timeout=timeout, interval=0.05, what=what, on_timeout=on_timeout)


def login(driver: Any, env: Env) -> None:
    sign_in(driver, env.airflow)


def sign_in(driver: Any, airflow: Standalone) -> None:
    """Sign in to ``airflow``'s UI as admin through its login form (once per browser)."""
    from selenium.webdriver.common.by import By

    if driver.current_url.startswith(airflow.base_url) and driver.get_cookie("_token"):
        return  # signed in by an earlier test of the module
    driver.get(airflow.base_url + "/")
    until(lambda: driver.find_element(By.CSS_SELECTOR, "input[name=username]"), timeout=60, what="the login form")
    driver.find_element(By.CSS_SELECTOR, "input[name=username]").send_keys("admin")
    driver.find_element(By.CSS_SELECTOR, "input[name=password]").send_keys(airflow.admin_password())
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    until(lambda: driver.get_cookie("_token"), timeout=60, what="the session cookie after signing in")


def press(driver: Any, element_id: str, *, what: str, timeout: float = 10) -> None:
    """Click the tab's button ``element_id`` once it is there and enabled. Found and clicked in one
    script: the tab re-renders itself every refresh, and an element found before a refresh is gone
    after it (a busy machine stretches the gap between a find and a click past one)."""
    until(lambda: driver.execute_script(
        "var e = document.getElementById(arguments[0]); if (!e || e.disabled) return false; e.click(); return true;",
        element_id) or None, timeout=timeout, what=what)


def frame_text(driver: Any, css: str) -> str:
    """The element's text; read again when a refresh re-rendered it between the find and the read."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    for _ in range(4):
        try:
            return str(driver.find_element(By.CSS_SELECTOR, css).text)
        except StaleElementReferenceException:
            continue
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


#: What the tests measured, written to measurements.json beside the screenshots as they go.
MEASURED: dict[str, Any] = {}


def record(shots: Path, **values: Any) -> None:
    MEASURED.update(values)
    (shots / "measurements.json").write_text(json.dumps(MEASURED, indent=2) + "\n")


def open_tab(driver: Any, env: Env, dag_id: str, run_id: str, task_id: str) -> tuple[Any, float]:
    """Open the task instance's page, click its Checkpoint tab, switch into the tab's frame; how
    long from the click to the tab showing the slot (or saying why not)."""
    return open_checkpoint_tab(driver, f"{env.airflow.base_url}/dags/{dag_id}/runs/{run_id}/tasks/{task_id}")


def open_checkpoint_tab(driver: Any, address: str) -> tuple[Any, float]:
    """:func:`open_tab` for the task instance page at ``address`` (a mapped one's ends ``/mapped/<i>``)."""
    from selenium.webdriver.common.by import By

    driver.switch_to.default_content()
    driver.get(address)
    tab = until(lambda: driver.find_element(
        By.XPATH, "//*[self::a or self::button][.//text()[normalize-space()='Checkpoint']]"),
        timeout=60, what="the Checkpoint tab on the task instance page")
    tab.click()
    clicked = time.monotonic()
    frame = until(lambda: driver.find_element(By.CSS_SELECTOR, "iframe[title='Checkpoint']"), timeout=30,
                  what="the tab's frame")
    driver.switch_to.frame(frame)
    until(lambda: driver.find_elements(By.ID, "figures") or driver.find_elements(By.ID, "not-resumable")
          or driver.find_elements(By.ID, "overlap") or driver.find_elements(By.ID, "never-started") or None,
          timeout=30, what="the tab's content")
    return frame, time.monotonic() - clicked


def shown(driver: Any, what: str) -> str:
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.CSS_SELECTOR, what)
    return found[0].text if found else ""


def attr(driver: Any, css: str, name: str) -> str | None:
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.CSS_SELECTOR, css)
    return found[0].get_attribute(name) if found else None


def problem_showing(driver: Any, element: Any) -> str | None:
    """None when ``element`` is wholly inside its frame's viewport, its text not cut; else what is wrong."""
    return driver.execute_script(
        "var e = arguments[0], r = e.getBoundingClientRect(), w = document.documentElement.clientWidth;"
        "if (r.width === 0) return 'not shown';"
        "if (r.left < 0 || r.right > w + 0.5) return 'outside the frame (' + Math.round(r.left) + '..' + "
        "  Math.round(r.right) + ' of ' + w + ')';"
        "if (e.scrollWidth > e.clientWidth + 1) return 'its text is cut';"
        "return null;", element)


def assert_buttons_visible(driver: Any, frame: Any, css: str) -> list[str]:
    """Every button ``css`` selects in ``frame`` is wholly visible without scrolling sideways, and
    the frame is inside the window. Returns the buttons' texts."""
    from selenium.webdriver.common.by import By

    driver.switch_to.default_content()
    outside = driver.execute_script("var r = arguments[0].getBoundingClientRect(); return r.right > "
                                    "document.documentElement.clientWidth + 0.5;", frame)
    assert not outside, "the frame reaches past the window"
    driver.switch_to.frame(frame)
    buttons = driver.find_elements(By.CSS_SELECTOR, css)
    assert buttons, css
    problems = {b.text: problem_showing(driver, b) for b in buttons}
    assert not any(problems.values()), problems
    return [b.text for b in buttons]
