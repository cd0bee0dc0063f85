"""The operator layer's own log lines (a failed success mark, an overlap decision, a failed XCom push,
a tracing or lineage failure, a broken retry policy, a request's failed read-back) and the XCom it
pushes carry no credential and no raw control character: an error's text and its traceback go through
``outward_text`` (``outward_traceback`` in place of ``exc_info=True``)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from airflow_resumable.core.model.checkpoint import Origin
from airflow_resumable.core.model.errors import OverlapSkip
from airflow_resumable.operators.confirm import confirm_on_success
from airflow_resumable.operators.overlap import overlap_report, report_overlap
from airflow_resumable.operators.tracing import AttemptTrace

#: What a careless driver's error says, and a job name holding an escape sequence.
DSN_ERROR = "connection to postgresql://alice:s3cret@db/x failed (host=db password=s3cret)"
ESCAPES = "\x1b]0;pwned\x07\x1b[2J"
LOG = logging.getLogger("airflow_resumable.test.outward_lines")


def _said(caplog: pytest.LogCaptureFixture) -> str:
    """Everything the records say as a handler writes them: the message and any traceback."""
    handler = logging.StreamHandler()
    return "\n".join(handler.format(r) for r in caplog.records)


def _clean(text: str) -> None:
    assert "s3cret" not in text and "alice" not in text, text
    assert "\x1b" not in text and "\x07" not in text, text


class _Failing:
    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(DSN_ERROR + ESCAPES)


def test_a_failed_success_mark_logs_no_password(caplog: pytest.LogCaptureFixture) -> None:
    operator = type("Op", (), {"log": LOG, "on_success_callback": None})()

    class Store:
        def session(self, autocommit: bool) -> Any:
            raise RuntimeError(DSN_ERROR + ESCAPES)

    confirm_on_success(operator, Store(), f"job{ESCAPES}", "slot", Origin())
    with caplog.at_level(logging.WARNING, LOG.name):
        operator.on_success_callback[-1]({})
    said = _said(caplog)
    assert "could not record the success" in said and "postgresql://db/x" in said
    _clean(said)


def test_an_overlap_decision_logs_and_pushes_no_password_and_no_escape(caplog: pytest.LogCaptureFixture) -> None:
    exc = OverlapSkip(f"an earlier run of job{ESCAPES} is live; it said {DSN_ERROR}", job=f"job{ESCAPES}", slot="s")
    pushed: list[Any] = []

    class Ti:
        def xcom_push(self, key: str, value: Any) -> None:
            pushed.append(value)
            raise RuntimeError(DSN_ERROR + ESCAPES)

    with caplog.at_level(logging.WARNING, LOG.name):
        report_overlap(LOG, Ti(), "skip", exc)
    said = _said(caplog)
    assert "skipped by the overlap policy" in said and "could not push the overlap decision" in said
    _clean(said)
    _clean(repr(pushed) + repr(overlap_report("skip", exc)))


def test_a_tracing_failure_logs_its_traceback_without_the_password(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, LOG.name):
        AttemptTrace(span=None, tracer=_Failing(), log=LOG)
    said = _said(caplog)
    assert "could not record this attempt's span" in said and "Traceback" in said
    _clean(said)


def test_a_broken_retry_policy_logs_its_traceback_without_the_password() -> None:
    from airflow_resumable.operators import outcome

    class Policy:
        def evaluate(self, **kwargs: Any) -> Any:
            raise RuntimeError(DSN_ERROR + ESCAPES)

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    outcome.log.addHandler(handler)
    try:
        assert outcome.opinion(Policy(), ValueError("x"), try_number=1, max_tries=2, context={}) is None  # type: ignore[arg-type]
    finally:
        outcome.log.removeHandler(handler)
    said = "\n".join(logging.Formatter().format(r) for r in records)
    assert "retry_policy raised" in said and "Traceback" in said
    _clean(said)


def test_a_request_whose_answer_cannot_be_read_logs_no_password(caplog: pytest.LogCaptureFixture) -> None:
    from airflow_resumable import control

    with caplog.at_level(logging.WARNING):
        failed = control._read_back_failed(RuntimeError(DSN_ERROR + ESCAPES), "pause", "ops", None,
                                           job=f"job{ESCAPES}", slot="s")
    said = _said(caplog)
    assert "could not be read back" in said and "RuntimeError" in said
    _clean(said)
    _clean(str(failed))
