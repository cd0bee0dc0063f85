"""``airflow resumable ...``: the Airflow CLI group, registered through the provider info's ``cli``.

    airflow resumable list [--dag-id D] [--status S] [--limit N]
    airflow resumable show JOB SLOT          airflow resumable history JOB SLOT
    airflow resumable pause|resume|cancel|restart JOB SLOT [--by WHO]
    airflow resumable release JOB SLOT [--force] [--by WHO]
    airflow resumable jobs [--dag-id D]      airflow resumable jobs --job JOB [--run-id R]
    airflow resumable rerun-failed JOB RUN_ID [--by WHO]
    airflow resumable skipped list JOB SLOT  airflow resumable skipped retry JOB SLOT [--by WHO]
    airflow resumable skipped withdraw JOB SLOT [--by WHO]
    airflow resumable migrate [--sql | --check]
    airflow resumable clean --older-than 30d [--dry-run]

Every command takes ``--conn-id`` (the checkpoint store's Airflow connection, default
``resumable_default``) and ``--output table|json|yaml|plain``. Requests go through
:mod:`airflow_resumable.control`; ``--by`` (who asks, kept in the slot's history) defaults to the
OS user (``user@host``); one holding a control character is refused. A refused request exits 1 saying
why; nothing was changed then.

What a command prints is :mod:`airflow_resumable.core.view`'s shapes, whose texts went through
:func:`~airflow_resumable.core.model.outward.outward_text` (no credential, no raw control character);
a table, YAML or plain output passes every text cell through it once more before the terminal sees
it, the row's JSON values too.

This module is imported by every ``airflow`` command line: the definitions below import nothing
heavy, the commands' bodies import what they need.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from airflow_resumable.cli import MAX_AGE_DAYS, MAX_BATCH, MAX_LIMIT, duration, whole_number
from airflow_resumable.core.model.defaults import CONN_ID
from airflow_resumable.core.model.request_rules import Action, forceable, taken_when
from airflow_resumable.core.model.states import Status
from airflow_resumable.version_compat import (
    ARG_OUTPUT,
    ActionCommand,
    Arg,
    GroupCommand,
    lazy_load_command,
    needs,
    supports,
)

_HERE = __name__

ARG_CONN_ID = Arg(("--conn-id",), default=CONN_ID, help="the checkpoint store's Airflow connection (default: %(default)s)")
ARG_JOB = Arg(("job",), help="the job (default name <dag_id>.<task_id>, plus [map_index] when mapped)")
ARG_SLOT = Arg(("slot",), help="the slot (the run's data interval start in ISO 8601, else its run id)")
ARG_BY = Arg(("--by",), default=None, help="who asks, kept in the slot's history (default: the OS user, user@host)")
ARG_FORCE = Arg(("--force",), action="store_true", help="release: also free a live holder's lease, fencing it out")
ARG_DAG_ID = Arg(("--dag-id",), default=None, help="only this DAG's slots")
ARG_STATUS = Arg(("--status",), default=None, choices=tuple(Status), help="only slots in this status")
ARG_PLANS = Arg(("--include-plans",), action="store_true", help="also list partitioned jobs' plan rows (<job>#plan: "
                "the split each run's partitions read, not work; `airflow resumable jobs` folds them into their job)")
ARG_LIMIT = Arg(("--limit",), type=whole_number(1, MAX_LIMIT), default=100,
                help=f"at most this many slots, most recent first, 1 to {MAX_LIMIT:,} (default: 100)")
ARG_RUN_ID = Arg(("run_id",), help="the DAG run id (as `airflow resumable jobs` shows it)")
ARG_JOB_OPT = Arg(("--job",), default=None, help="one job (as `airflow resumable jobs` lists it): its line, then "
                 "each partition's row, with the Checkpoint tab's figures")
ARG_RUN_OPT = Arg(("--run-id",), default=None, help="with --job: that DAG run (default: the job's latest)")
ARG_SQL = Arg(("--sql",), action="store_true", help="print the SQL it would run, change nothing")
ARG_CHECK = Arg(("--check",), action="store_true", help="exit 1 if the database needs migrating")


def _duration_text(text: str) -> str:
    """``--older-than`` checked here, so a wrong one is refused by this parser (naming ``airflow
    resumable clean``), and passed on as written to the one implementation."""
    duration(text)
    return text


ARG_OLDER_THAN = Arg(("--older-than",), required=True, metavar="DURATION", type=_duration_text,
                     help=f"age of the last write, e.g. 30d, 12h, 2w (at most {MAX_AGE_DAYS}d)")
ARG_DRY_RUN = Arg(("--dry-run",), action="store_true", help="count what would be removed, change nothing")
ARG_BATCH = Arg(("--batch",), type=whole_number(1, MAX_BATCH), default=None,
                help=f"slots per transaction, 1 to {MAX_BATCH:,}")

_REQUEST_HELP = {
    Action.PAUSE: "Ask the slot's run to stop at its next chunk boundary and defer until resumed",
    Action.RESUME: "Let a paused slot continue from its checkpoint",
    Action.CANCEL: "Stop the slot's run (its task fails without a retry; the checkpoint is kept)",
    Action.RESTART: "Make the slot's next attempt start from the beginning",
    Action.RELEASE: "Free the lease of a holder that stopped heartbeating",
}


def get_cli_commands() -> list[GroupCommand]:
    """The ``resumable`` group (the name no core command uses: reusing one breaks Airflow's CLI).
    A request's description says which slots take it, from the rules themselves."""
    requests = [
        ActionCommand(name=action.value, help=_REQUEST_HELP[action],
                      description=f"{_REQUEST_HELP[action]}: {taken_when(action)}.",
                      func=lazy_load_command(f"{_HERE}.{action.value}_command"),
                      args=(ARG_JOB, ARG_SLOT, ARG_BY, *((ARG_FORCE,) if forceable(action) else ()),
                            ARG_CONN_ID, ARG_OUTPUT))
        for action in Action
    ]
    return [
        GroupCommand(
            name="resumable",
            help="Inspect and steer resumable jobs (airflow-resumable)",
            subcommands=[
                ActionCommand(name="list", help="Live and recent slots, most recently updated first",
                              func=lazy_load_command(f"{_HERE}.list_command"),
                              args=(ARG_DAG_ID, ARG_STATUS, ARG_LIMIT, ARG_PLANS, ARG_CONN_ID, ARG_OUTPUT)),
                ActionCommand(name="show", help="One slot: its row, progress and lease",
                              func=lazy_load_command(f"{_HERE}.show_command"),
                              args=(ARG_JOB, ARG_SLOT, ARG_CONN_ID, ARG_OUTPUT)),
                ActionCommand(name="history", help="The slot's attempts and requests, oldest first",
                              func=lazy_load_command(f"{_HERE}.history_command"),
                              args=(ARG_JOB, ARG_SLOT, ARG_CONN_ID, ARG_OUTPUT)),
                *requests,
                GroupCommand(
                    name="skipped", help="A slot's skipped items: list them, or retry them through the task's code",
                    subcommands=[
                        ActionCommand(name="list", help="The slot's skipped items, oldest first, with their state",
                                      func=lazy_load_command(f"{_HERE}.skipped_list_command"),
                                      args=(ARG_JOB, ARG_SLOT, ARG_CONN_ID, ARG_OUTPUT)),
                        ActionCommand(name="retry", help="Replay the slot's skipped items through the task's own code "
                                      "on its next run",
                                      description="Mark the slot's skipped items retry_requested (who asked goes to "
                                      "its history) and clear its task instance through Airflow when it has "
                                      "finished: the next run replays them first, through ChunkedOperator's process "
                                      "(or a ResumableOperator's replay), and marks those that succeed replayed. "
                                      "Refused (exit 1) while the slot runs or when it has no replayable item.",
                                      func=lazy_load_command(f"{_HERE}.skipped_retry_command"),
                                      args=(ARG_JOB, ARG_SLOT, ARG_BY, ARG_CONN_ID, ARG_OUTPUT)),
                        ActionCommand(name="withdraw", help="Withdraw a retry of the slot's skipped items that no "
                                      "run carried out yet",
                                      description="Put the slot's items still retry_requested back to skipped, their "
                                      "errors as they were (who asked goes to its history): a retry no run will carry "
                                      "out (its task instance is removed, say), or one asked by mistake. Refused "
                                      "(exit 1) while the slot runs or when no retry is pending.",
                                      func=lazy_load_command(f"{_HERE}.skipped_withdraw_command"),
                                      args=(ARG_JOB, ARG_SLOT, ARG_BY, ARG_CONN_ID, ARG_OUTPUT)),
                    ],
                ),
                ActionCommand(name="jobs", help="One line per job: its latest run's partitions (done, running, paused, "
                              "failed, waiting) and its progress (processed/total, rate, ETA: the partitions' sum)",
                              description="One line per job: its latest run's partitions counted by how they stand, "
                              "and the job's progress as the sum of its partitions'. With --job, that job's line "
                              "and one line per partition (map index, status, processed/total, rate, ETA).",
                              func=lazy_load_command(f"{_HERE}.jobs_command"),
                              args=(ARG_DAG_ID, ARG_JOB_OPT, ARG_RUN_OPT, ARG_CONN_ID, ARG_OUTPUT)),
                ActionCommand(name="rerun-failed", help="Clear exactly the failed task instances of a job in one run",
                              description="Clear, through Airflow, the task instances of JOB in RUN_ID that failed "
                              "(a mapped job: only its failed map indexes), so they run again and resume from "
                              "their checkpoints; a partitioned job's summary (and tasks upstream_failed) too. "
                              "Each cleared partition's history records who asked. Exits 1 when none failed.",
                              func=lazy_load_command(f"{_HERE}.rerun_failed_command"),
                              args=(ARG_JOB, ARG_RUN_ID, ARG_BY, ARG_CONN_ID, ARG_OUTPUT)),
                ActionCommand(name="migrate", help="Bring the checkpoint database to this release's schema",
                              func=lazy_load_command(f"{_HERE}.migrate_command"),
                              args=(ARG_CONN_ID, ARG_SQL, ARG_CHECK)),
                ActionCommand(name="clean", help="Remove finished slots and their history past an age",
                              func=lazy_load_command(f"{_HERE}.clean_command"),
                              args=(ARG_CONN_ID, ARG_OLDER_THAN, ARG_DRY_RUN, ARG_BATCH)),
            ],
        )
    ]


def add_to_module_cli(sub: Any, parser: argparse.ArgumentParser) -> set[str]:
    """The group's commands that ``python -m airflow_resumable`` lacks (list, show, history, pause...),
    added to its subparsers ``sub`` from the same definitions; their names. On an Airflow without
    provider CLI commands (3.1) that command line is where they are, and its help says so."""
    feature = "airflow resumable ... (provider CLI commands)"
    if not supports(feature):
        parser.epilog = f"{needs(feature)}; list, show, history, pause, resume, cancel, restart and release are here."
    names = set()
    for command in get_cli_commands()[0].subcommands:
        if command.name in sub.choices:  # migrate and clean: the module's own, which also take --url
            continue
        _add(sub, command)
        names.add(command.name)
    return names


def _add(sub: Any, command: Any) -> None:
    """``command`` (an Airflow ActionCommand, or a GroupCommand of them) on the subparsers ``sub``."""
    from airflow_resumable.cli import plain

    each = sub.add_parser(command.name, help=plain(command.help), description=plain(getattr(command, "description", None)))
    if hasattr(command, "subcommands"):  # a group: skipped list|retry
        inner = each.add_subparsers(dest=f"{command.name}_command", required=True)
        for child in command.subcommands:
            _add(inner, child)
        return
    for arg in command.args:
        arg.add_to_parser(each)
    each.set_defaults(func=command.func)


# -- the commands ---------------------------------------------------------------------------------

_LIST_COLUMNS = ("job", "slot", "status", "percent", "processed", "total", "dag_id", "run_id", "updated_at")
_HISTORY_COLUMNS = ("id", "attempt", "outcome", "requested_by", "owner", "started_at", "ended_at", "processed_start",
                    "processed_end", "stop_reason", "error")


def list_command(args: argparse.Namespace) -> None:
    import airflow_resumable.control as control

    rows = _guard(lambda: control.recent(conn_id=args.conn_id, dag_ids={args.dag_id} if args.dag_id else None,
                                         status=args.status, limit=args.limit, plans=args.include_plans))
    # as show and jobs judge a slot: a running row whose holder died, or whose task instance ended, is abandoned
    views = control.listed(rows, _task_states)
    columns = ("kind", *_LIST_COLUMNS) if args.include_plans else _LIST_COLUMNS
    _print(views if args.output == "json" else [{k: _shown_status(v) if k == "status" else v.get(k) for k in columns}
                                                for v in views], args.output)


def show_command(args: argparse.Namespace) -> None:
    _print_slot(args, _guard(lambda: _detail(args.job, args.slot, args.conn_id)))


def history_command(args: argparse.Namespace) -> None:
    import airflow_resumable.control as control
    from airflow_resumable.core.view import record_json

    _guard(lambda: control.get(args.job, args.slot, conn_id=args.conn_id))  # unknown slot: exit 1, saying so
    records = [record_json(r) for r in _guard(lambda: control.history(args.job, args.slot, conn_id=args.conn_id))]
    _print(records if args.output == "json" else [{k: r.get(k) for k in _HISTORY_COLUMNS} for r in records],
           args.output)


_SKIPPED_COLUMNS = ("position", "state", "attempt", "skipped_at", "error")


def skipped_list_command(args: argparse.Namespace) -> None:
    import airflow_resumable.control as control

    _guard(lambda: control.get(args.job, args.slot, conn_id=args.conn_id))  # unknown slot: exit 1, saying so
    view = _guard(lambda: control.skipped_view(args.job, args.slot, conn_id=args.conn_id, limit=MAX_LIMIT))
    items = view["skipped_items"]
    _print(view if args.output == "json" else [{k: _cell(i.get(k)) for k in _SKIPPED_COLUMNS} for i in items],
           args.output)


def skipped_retry_command(args: argparse.Namespace) -> None:
    import airflow_resumable.control as control

    asked = _guard(lambda: control.request_retry_skipped(args.job, args.slot, conn_id=args.conn_id, by=args.by))
    view = _guard(lambda: control.skipped_view(args.job, args.slot, conn_id=args.conn_id, limit=MAX_LIMIT))
    if args.output == "json":
        _print({**view, "retry": asked.as_json()}, "json")
        return
    # Which run carries the retry out, or why none will until the task instance is cleared.
    print(_terminal(f"retry of {asked.items} skipped item(s) requested: {asked.next_run}"),
          file=sys.stdout if asked.cleared else sys.stderr)
    _print([{k: _cell(i.get(k)) for k in _SKIPPED_COLUMNS} for i in view["skipped_items"]], args.output)


def skipped_withdraw_command(args: argparse.Namespace) -> None:
    import airflow_resumable.control as control

    items = _guard(lambda: control.withdraw_retry_skipped(args.job, args.slot, conn_id=args.conn_id, by=args.by))
    view = _guard(lambda: control.skipped_view(args.job, args.slot, conn_id=args.conn_id, limit=MAX_LIMIT))
    if args.output == "json":
        _print({**view, "withdrawn": {"items": items}}, "json")
        return
    print(_terminal(f"retry of {items} skipped item(s) withdrawn: they are skipped again"))
    _print([{k: _cell(i.get(k)) for k in _SKIPPED_COLUMNS} for i in view["skipped_items"]], args.output)


_JOBS_COLUMNS = ("job", "dag_id", "task_id", "run_id", "done", "running", "stalled", "abandoned", "paused", "failed",
                 "waiting", "total",
                 "planned", "processed", "skipped", "rate", "eta", "splits", "updated_at")
_PARTITION_COLUMNS = ("map_index", "job", "status", "processed", "rate", "eta", "attempt", "updated_at", "last_error")
#: A split of a partitioned job (rebalancing): the range it took (``1.2``, read by ``job``), from
#: which range, the keys it holds, who asked and when, and who runs it now (``map_index``).
_SPLIT_COLUMNS = ("range", "job", "from", "after", "until", "by", "when", "map_index", "status", "processed")


def _splits(line: dict[str, Any]) -> str:
    """A job's splits as a cell of its line: ``1.1 of 1 (running)``, one per split."""
    return "; ".join(f"{s['range']} of {s['of']} ({s.get('shown_status') or s['status']})"
                     for s in line.get("splits") or [])


def _split_row(split: dict[str, Any]) -> dict[str, Any]:
    shown, stored = split.get("shown_status") or split["status"], split["status"]
    figures = _figures(split)["processed"] if split.get("processed") is not None else "not started"
    return {k: _cell({**split, "processed": figures,
                      "status": shown if shown == stored else f"{shown} (its row says {stored})"}.get(k))
            for k in _SPLIT_COLUMNS}


def _figures(line: dict[str, Any]) -> dict[str, Any]:
    """A job's or a partition's progress as a table shows it: ``processed/total (percent)``, the
    rate per second and the ETA."""
    from airflow_resumable.core.attempt.reporter import _duration as format_duration  # the task log's own format

    processed = f"{line.get('processed') or 0:,}" + (f"/{line['total']:,}" if line.get("total") is not None else "")
    if line.get("percent") is not None:
        processed += f" ({line['percent']:.0f}%)"
    rate = line.get("rate")
    eta = line.get("eta_seconds")
    stalled = line.get("stalled_since")
    return {"processed": processed, "rate": "" if rate is None else f"{rate:,.1f}/s",
            "eta": f"stalled since {stalled}" if stalled else "" if eta is None else format_duration(eta)}


def jobs_command(args: argparse.Namespace) -> None:
    import airflow_resumable.control as control

    if args.job is None:
        if args.run_id is not None:
            raise SystemExit("--run-id needs --job: name the job whose run to show")
        lines = _guard(lambda: control.jobs(conn_id=args.conn_id, dag_ids={args.dag_id} if args.dag_id else None,
                                            task_states=_task_states))
        _print(lines if args.output == "json" else [{k: {**j, **j["partitions"], **_figures(j),
                                                         "splits": _splits(j)}.get(k)
                                                     for k in _JOBS_COLUMNS} for j in lines], args.output)
        return
    detail = _guard(lambda: control.job_partitions(args.job, args.run_id, conn_id=args.conn_id,
                                                   task_states=_task_states))
    if args.output == "json":
        _print(detail, args.output)
        return
    _print([{k: {**detail, **detail["partitions"], **_figures(detail), "splits": _splits(detail)}.get(k)
             for k in _JOBS_COLUMNS}], args.output)
    _print([{k: _cell({**r, **_figures(r), "status": _shown_status(r)}.get(k)) for k in _PARTITION_COLUMNS}
            for r in detail["partition_rows"]], args.output)
    if detail.get("splits"):  # the ranges rebalancing took: which from which, when, who runs each now
        _print([_split_row(split) for split in detail["splits"]], args.output)


def _shown_status(view: dict[str, Any]) -> str:
    """A slot's status as a table shows it: how it is shown (``stalled``, ``abandoned``), saying
    what its row holds when that differs (a row whose attempt died still says ``running``)."""
    shown, stored = view.get("shown_status") or view.get("status"), view.get("status")
    return str(shown) if shown == stored else f"{shown} (its row says {stored})"


def rerun_failed_command(args: argparse.Namespace) -> None:
    import airflow_resumable.control as control

    cleared = _guard(lambda: control.rerun_failed(args.job, args.run_id, conn_id=args.conn_id, by=args.by))
    _print({"job": args.job, "run_id": args.run_id, "cleared": cleared} if args.output == "json"
           else [{"job": args.job, "run_id": args.run_id, "cleared map indexes": ", ".join(map(str, cleared))}],
           args.output)


def _request(action: str, args: argparse.Namespace) -> None:
    import airflow_resumable.control as control

    def ask() -> Any:
        if action == "release":
            return control.release(args.job, args.slot, conn_id=args.conn_id, by=args.by, force=args.force)
        return getattr(control, action)(args.job, args.slot, conn_id=args.conn_id, by=args.by)

    _guard(ask)
    _print_slot(args, _guard(lambda: _detail(args.job, args.slot, args.conn_id)))


def pause_command(args: argparse.Namespace) -> None:
    _request("pause", args)


def resume_command(args: argparse.Namespace) -> None:
    _request("resume", args)


def cancel_command(args: argparse.Namespace) -> None:
    _request("cancel", args)


def restart_command(args: argparse.Namespace) -> None:
    _request("restart", args)


def release_command(args: argparse.Namespace) -> None:
    _request("release", args)


def migrate_command(args: argparse.Namespace) -> None:
    """The same as ``python -m airflow_resumable migrate`` (one implementation)."""
    _module_cli(["migrate", "--conn-id", args.conn_id, *(["--sql"] if args.sql else []),
                 *(["--check"] if args.check else [])])


def clean_command(args: argparse.Namespace) -> None:
    """The same as ``python -m airflow_resumable clean`` (one implementation)."""
    _module_cli(["clean", "--conn-id", args.conn_id, "--older-than", args.older_than,
                 *(["--dry-run"] if args.dry_run else []), *(["--batch", str(args.batch)] if args.batch else [])])


def _module_cli(argv: list[str]) -> None:
    from airflow_resumable.cli import main

    server_context()
    code = main(argv)
    if code:
        raise SystemExit(code)


# -- helpers -------------------------------------------------------------------------------------

def _detail(job: str, slot: str, conn_id: str) -> dict[str, Any]:
    import airflow_resumable.control as control

    return control.detail(job, slot, conn_id=conn_id, explained=False, task_states=_task_states)


def _task_states(dag_id: str | None, task_id: str | None, run_id: str | None) -> dict[int, str] | None:
    """Airflow's task instance states, as the jobs page and the Checkpoint tab show a slot by them
    (:func:`airflow_resumable.control.task_instance_states`): a running row whose task instance ended
    is ``abandoned`` here too. Without Airflow's metadata database (a machine that has only the
    checkpoint store's connection) the slot is judged by its lease alone, as the module CLI judges it."""
    import airflow_resumable.control as control

    try:
        return control.task_instance_states(dag_id, task_id, run_id)
    except Exception:  # the metadata database unreachable or not set up: the lease decides
        return None


def server_context() -> None:
    """Read connections as Airflow's own ``airflow connections get`` does: environment variables,
    the configured secrets backends and the metadata database (connections added in the UI or with
    ``airflow connections add``). Airflow gives a process the metadata database only when it says
    it is a server; a command line that says nothing sees environment variables only."""
    os.environ["_AIRFLOW_PROCESS_CONTEXT"] = "server"


def _guard(call: Any) -> Any:
    """Run ``call``; our errors (unknown slot, refused request, missing connection) end the command
    with exit status 1 and the error's own words (job, slot, what to do)."""
    from airflow_resumable.core.model.errors import ResumableError

    server_context()
    try:
        return call()
    except ResumableError as exc:
        print(_terminal(f"error: {exc}"), file=sys.stderr)
        raise SystemExit(1) from None


def _print_slot(args: argparse.Namespace, view: dict[str, Any]) -> None:
    if args.output == "json":
        _print(view, "json")
        return
    fields = {k: v for k, v in view.items() if k != "history"}
    fields["status"] = _shown_status(view)
    fields["offers"] = ", ".join(a for a, ok in (view.get("offers") or {}).items() if ok) or "-"
    _print([{"field": k, "value": _cell(v)} for k, v in fields.items()], args.output)


def _cell(value: Any) -> str:
    return "" if value is None else _terminal(value) if isinstance(value, str) else json.dumps(value)


def _terminal(text: str) -> str:
    """``text`` as a terminal may get it: through ``outward_text`` (no credential, every control
    character and escape sequence written out, never sent raw)."""
    from airflow_resumable.core.model.outward import outward_text

    return outward_text(text)


def _shown(value: Any) -> Any:
    """A value of a table, YAML or plain output with each of its texts through :func:`_terminal`."""
    if isinstance(value, str):
        return _terminal(value)
    if isinstance(value, dict):
        return {k: _shown(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_shown(v) for v in value]
    return value


def _print(data: Sequence[Any] | dict[str, Any], output: str) -> None:
    if output == "json":  # plain JSON on stdout, for scripts (no colours, no wrapping; JSON escapes control characters)
        print(json.dumps(data, default=str))
        return
    from airflow_resumable.version_compat import AirflowConsole

    rows = [_shown(row) for row in data]
    if output != "table" or not rows:
        AirflowConsole().print_as(data=rows, output=output)
        return
    _print_table(AirflowConsole(), rows)


def _print_table(console: Any, rows: list[dict[str, Any]]) -> None:
    """Airflow's table, whose cells are plain text (a value holding ``[bold]`` or ``[link=...]`` is
    printed as it is, not as rich's markup) and wrap between words but never inside one: a job, a slot, a run
    id or a time stays whole on its line (each column is at least as wide as its longest word), and
    a table wider than the terminal runs past its edge rather than cut a name."""
    from rich.text import Text

    from airflow_resumable.version_compat import SimpleTable

    table = SimpleTable(show_header=console.show_header)
    for column in rows[0]:
        words = [word for row in rows for word in str(row[column]).split()] + [column]
        table.add_column(column, min_width=max(len(word) for word in words))
    for row in rows:  # each cell as text, never read as rich's markup (``[link=...]``, ``[/]``)
        table.add_row(*(Text(str(value)) for value in row.values()))
    console.print(table, crop=False)
