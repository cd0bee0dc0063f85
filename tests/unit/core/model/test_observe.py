"""The core's facts for lineage and tracing (core/model/observe.py): what an attempt says it read and
wrote, how far it got, and the rules that keep them small and free of credentials. No Airflow."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from airflow_resumable.core import Attempt, Options
from airflow_resumable.core.model.errors import ConfigurationError
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.model.observe import (
    MAX_OUTPUTS,
    REASON_LIMIT,
    AttemptFacts,
    Part,
    Source,
    cut_text,
    without_credentials,
    without_credentials_in,
)
from airflow_resumable.core.readers import KeysetReader, SequenceReader
from airflow_resumable.core.stores import Store
from airflow_resumable.core.view import facts_json

pytestmark = pytest.mark.one_store("the facts are the attempt's memory, not the store's", kind="sqlite")


def attempt(store: Store, n: int = 1) -> Attempt:
    return Attempt(
        store, Identity(job="observe.job", slot="2026-01-01", attempt=n, owner=f"owner-{n}"), options=Options(),
    )


def test_an_attempt_s_facts_say_where_it_resumed_how_far_it_got_and_what_it_read_and_wrote(store: Store) -> None:
    """Given try 1 stopping after 2 checkpoints and try 2 finishing, Then try 2's facts say it resumed
    from 2, processed 5 in 3 checkpoints, read its reader's table and wrote what the handler named."""
    class Stop(Exception):
        pass

    def first(ctx: Any) -> None:
        for i in (1, 2):
            ctx.checkpoint(i, processed=i, total=5)
        raise Stop

    one = attempt(store, 1)
    with pytest.raises(Stop):
        one.run(first)
    assert (one.facts().status, one.facts().checkpoints, one.facts().resumed) == ("failed", 2, False)

    reader = KeysetReader(connect=lambda: None, key="id", table="public.loans")
    reader.connect.conn_id = "warehouse"  # type: ignore[attr-defined]  # as sql_reader's connect names it

    def second(ctx: Any) -> None:
        ctx.reading(reader.source())
        ctx.output(table="report", connection="warehouse")
        ctx.output(table="report", connection="warehouse")  # the same output once
        for i in (3, 4, 5):
            ctx.checkpoint(i, processed=i, total=5)

    two = attempt(store, 2)
    two.run(second)
    facts = two.facts()
    assert (facts.status, facts.resumed, facts.resumed_from, facts.position, facts.processed, facts.total,
            facts.checkpoints) == ("done", True, 2, 5, 5, 5, 3)
    assert facts.inputs == (Source("table", "public.loans", "warehouse"),)
    assert facts.outputs == (Source("table", "report", "warehouse"),)


def test_a_reader_says_what_it_reads_on_its_first_read_of_an_attempt(store: Store) -> None:
    def handler(ctx: Any) -> None:
        reader = SequenceReader(list(range(3)))
        for batch in reader.chunks(ctx, 2):
            ctx.checkpoint(batch.position, processed=len(batch))

    one = attempt(store)
    one.run(handler)
    assert one.facts().inputs == ()  # items in memory: no dataset


@pytest.mark.parametrize(("kwargs", "why"), [
    ({}, "exactly one of table= and file="),
    ({"table": "a", "file": "b"}, "exactly one of table= and file="),
    ({"table": "  "}, "a non-empty name"),
    ({"table": "t", "connection": 5}, "an optional connection id"),
])
def test_ctx_output_refuses_what_names_no_dataset_naming_the_job_and_slot(store: Store, kwargs: dict[str, Any],
                                                                          why: str) -> None:
    def handler(ctx: Any) -> None:
        ctx.output(**kwargs)

    with pytest.raises(ConfigurationError, match=why) as caught:
        attempt(store).run(handler)
    assert (caught.value.job, caught.value.slot) == ("observe.job", "2026-01-01")


def test_more_than_a_hundred_inputs_and_outputs_never_fail_the_attempt_the_extras_are_left_out_with_one_warning(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Given a handler that declares 150 outputs and 150 inputs (with or without a lineage backend),
    When it runs, Then it finishes done; its facts keep the first 100 of each, and the log warns once
    per direction, naming the job and the slot."""
    def handler(ctx: Any) -> None:
        for i in range(150):
            ctx.output(table=f"t{i}")
            ctx.input(file=f"s3://bucket/in/{i}.csv")
        ctx.checkpoint(1, processed=1)

    one = attempt(store)
    with caplog.at_level(logging.WARNING):
        one.run(handler)
    facts = one.facts()
    assert facts.status == "done"
    assert [s.name for s in facts.outputs] == [f"t{i}" for i in range(MAX_OUTPUTS)]
    assert len(facts.inputs) == MAX_OUTPUTS
    warnings = [r.getMessage() for r in caplog.records if "left out of its lineage events" in r.getMessage()]
    assert len(warnings) == 2 and all("job=observe.job slot=2026-01-01" in w for w in warnings)


def test_a_reader_whose_source_cannot_be_named_costs_the_lineage_not_the_attempt(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Given a reader of one's own whose ``source()`` raises (its message holding a DSN's password),
    When an attempt reads it, Then the attempt finishes done without that input, and the warning
    names the error without the password."""
    class Broken(SequenceReader):
        def source(self) -> Source | None:
            raise RuntimeError("cannot name postgresql://alice:hunter2@db/x")

    def handler(ctx: Any) -> None:
        for batch in Broken([1, 2, 3]).chunks(ctx, 2):
            ctx.checkpoint(batch.position, processed=len(batch))

    one = attempt(store)
    with caplog.at_level(logging.WARNING):
        one.run(handler)
    assert (one.facts().status, one.facts().inputs) == ("done", ())
    assert "could not name what this reader reads" in caplog.text and "hunter2" not in caplog.text


@pytest.mark.parametrize("limit", [0, 1, 3, 4, 200, 1000])
def test_a_cut_text_is_never_longer_than_its_limit(limit: int) -> None:
    """Given texts around and far over a limit, Then the cut is at most the limit (a schema's maxLength
    holds), ends with ``...`` when something was cut, and a short enough text stays whole."""
    for size in (0, limit, limit + 1, 10 * limit + 7, 10_000_000):
        text = "x" * size
        cut = cut_text(text, limit)
        assert len(cut) <= limit
        assert cut == text if size <= limit else (cut.endswith("...") or limit < 3)


def test_a_stop_reason_goes_cut_to_the_schema_s_200_characters() -> None:
    facts = AttemptFacts(job="j", slot="s", attempt=1, status="cancelled", stop_reason="r" * 10_000)
    assert len(facts_json(facts)["stop_reason"]) == REASON_LIMIT == 200


@pytest.mark.parametrize("text, scrubbed", [
    ("could not connect to postgresql://alice:hunter2@db:5432/loans: refused",
     "could not connect to postgresql://db:5432/loans: refused"),
    ("connect('postgresql://alice:hun/ter2@db/x')", "connect('postgresql://db/x')"),
    ("dsn='host=db port=5432 user=alice password=hunter2 dbname=x'",
     "dsn='host=db port=5432 user=alice password=*** dbname=x'"),
    ("{'login': 'alice', 'password': 'hunter2'}", "{'login': 'alice', 'password': '***'}"),
    ('{"aws_secret_access_key": "wJalrXUtnFEMI"}', '{"aws_secret_access_key": "***"}'),
    ("GET https://api.example/v1?token=tok-123&x=1 failed", "GET https://api.example/v1 failed"),
    ("Authorization: token: tok-123", "Authorization: token: ***"),
    ("password authentication failed for user alice", "password authentication failed for user alice"),
])
def test_credentials_in_a_free_text_are_dropped_and_the_rest_kept(text: str, scrubbed: str) -> None:
    assert without_credentials_in(text) == scrubbed


def test_a_file_s_url_loses_its_credentials_and_query_before_anything_keeps_it() -> None:
    assert Source("file", "s3://key:secret@bucket/dir/x.csv?X-Amz-Signature=abc#f").name == "s3://bucket/dir/x.csv"
    assert without_credentials("https://u:p@host:8443/a?b=c") == "https://host:8443/a"
    assert without_credentials("/data/x.csv") == "/data/x.csv"


def test_huge_positions_and_names_go_as_short_previews() -> None:
    huge = ["x" * 10_000, list(range(5000))]
    facts = AttemptFacts(job="j" * 1024, slot="s", attempt=1, status="done", resumed_from=huge, position=huge,
                         partition=Part(job="p", index=0, count=2, after=huge, until=None))
    out = facts_json(facts)
    assert len(json.dumps(out)) < 2_500
    assert out["position"]["truncated"] is True and out["position"]["bytes"] == len(json.dumps(huge))
    assert out["partition"]["after"]["truncated"] is True and out["job"].endswith("...") and len(out["job"]) == 1000


def test_an_attempt_s_facts_count_the_slot_s_skipped_items(store: Store) -> None:
    def handler(ctx: Any) -> None:
        for i in (1, 2, 3):
            if i != 2:
                ctx.skip({"item": i}, position=i, error=ValueError("bad"), limit=5)
            ctx.checkpoint(i, processed=i)

    one = attempt(store)
    one.run(handler)
    assert (one.facts().skipped, one.facts().checkpoints) == (2, 3)


@pytest.mark.parametrize("url, named", [
    ("s3://AKIAX:wJal/rXUtn@bucket/key", "s3://bucket/key"),  # a secret with a "/" (AWS secret keys)
    ("s3://AKIAX:123/abcSECRET@bucket/key", "s3://bucket/key"),
    ("user:PASSW0RD@host:/path/file.csv", "host:/path/file.csv"),  # scp style, no "//"
    ("s3:AKIA:NOSLASHSECRET@bucket/key", "bucket/key"),
    ("https://host/path;jsessionid=SECRETSESSION/x", "https://host/path/x"),
    ("s3://[::1]:9000/bucket/k", "s3://[::1]:9000/bucket/k"),
    ("s3://bucket/v@2.csv", "s3://bucket/v@2.csv"),  # an "@" in a path is not a credential
])
def test_a_url_s_credentials_never_leave_however_the_secret_is_written(url: str, named: str) -> None:
    assert without_credentials(url) == named
    assert Source("file", url).name == named


def test_a_huge_text_is_scrubbed_in_linear_time_and_a_cut_leaves_no_half_of_a_url() -> None:
    """Given 1 MB texts that made the scrubber's patterns backtrack (a run of letters, of ``a:`` pairs,
    of URL-like words), When they are scrubbed, Then each takes well under 10 s (it took hours); and given
    a limit that falls inside a URL with its password after it, Then no part of that URL's userinfo is
    kept and the result is within the limit."""
    import time

    for text in ("a" * 1_000_000, "a:" * 500_000, "x://a:" * 170_000, "password=" * 110_000):
        began = time.monotonic()
        without_credentials_in(text)
        assert time.monotonic() - began < 10, text[:20]
    text = "error " * 100 + "postgresql://alice:hunter2@db/x failed"
    for limit in range(590, 640):
        cut = without_credentials_in(text, limit)
        assert len(cut) <= limit and "hunter" not in cut and "alice" not in cut, limit


def test_a_stop_reason_s_dsn_loses_its_password_even_when_the_cut_falls_before_its_at_sign() -> None:
    """Given a handler's own stop reason holding a DSN whose user and password start before the 200th
    character and whose ``@`` comes after it, When the facts go out, Then the reason is 200 characters and
    holds neither the user nor the password."""
    reason = "x" * 150 + " postgresql://bob:" + "p" * 100 + "@db.internal/x"
    shown = facts_json(AttemptFacts(job="j", slot="s", attempt=1, status="cancelled", stop_reason=reason))["stop_reason"]
    assert shown.startswith("x" * 150 + " postgresql://db.internal/x")
    assert "bob" not in shown and "ppp" not in shown and len(shown) <= REASON_LIMIT
