#!/usr/bin/env bash
# `make test`: the whole suite as concurrent pytest processes, one per group below. The slow groups
# (a real Airflow each: scheduler, api-server, Celery workers, a browser; the built wheel in a
# fresh venv) use free ports and
# databases of their own, so they run beside each other and beside the fast group (dag.test() on a
# private Airflow home, a PostgreSQL schema per test); most of their time is spent waiting for
# Airflow, not computing. Each group writes its own log; the logs are printed, then one summary line
# per group (pytest's "N passed ..."), so the output ends with them. Exits non-zero when any fails.
#   PY          the interpreter (default .venv/bin/python)
#   TEST_LOGS   where the logs go (default .test-logs/)
#   arguments   passed to every pytest process (make test PYTEST_ARGS="-k lease")
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
LOGS="${TEST_LOGS:-.test-logs}"
SLOW="scheduler or celery or browser or dist or trials"
# name=marker expression[=more pytest arguments]; together they select every test exactly once. Four
# processes side by side keep the two cores busy: more made the machine so loaded (load average
# 12-13) that tests waiting on Airflow ran out of their deadlines. The trials (minutes of
# subprocesses) run beside the built wheel's tests, the shortest slow group.
# The fast part is the longest by far (in CI it ran alone on one core for its last 25 minutes), so
# a third of its modules (--modules: tests/support/share.py, by a CRC-32 of each module's path; 32 %
# of its time as measured) run as fast-2, after dist-trials, which ends first: still four at once.
SPLIT="-p support.share --modules"
GROUPS_=(
  "fast=not ($SLOW)=$SPLIT=3,4,5/5"
  "scheduler=scheduler and not celery and not browser"
  "celery-browser=celery or browser"
  "dist-trials=(dist or trials) and not (scheduler or celery or browser)"
)
declare -A AFTER=(
  [dist-trials]="fast-2=not ($SLOW)=$SPLIT=1,2/5"
)
mkdir -p "$LOGS"
# The whole suite needs PostgreSQL and Redis beside it: say so now, not after half an hour.
if [ "$#" -eq 0 ] && ! "$PY" -m devtools.services; then
  exit 1
fi

# One group: its pytest process, its log, its exit code in a file.
run_group() {
  local name="${1%%=*}" rest="${1#*=}" expr more=()
  expr="${rest%%=*}"
  [ "$rest" = "$expr" ] || read -r -a more <<<"${rest#*=}"
  echo "$name group (-m \"$expr\"${more[*]:+ ${more[*]}}) started: $LOGS/$name.log"
  PYTHONPATH="$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pytest -p no:cacheprovider -ra -m "$expr" "${more[@]}" "${@:2}" \
    >"$LOGS/$name.log" 2>&1
  echo "$?" >"$LOGS/$name.exit"
}

names=() pids=()
for group in "${GROUPS_[@]}"; do
  name="${group%%=*}" then="${AFTER[${group%%=*}]:-}"
  names+=("$name")
  [ -z "$then" ] || names+=("${then%%=*}")
  (
    trap 'kill -INT $(jobs -p) 2>/dev/null; wait' INT TERM
    run_group "$group" "$@" &
    wait
    if [ -n "$then" ]; then run_group "$then" "$@" & wait; fi
  ) &
  pids+=("$!")
done
# Ctrl-C or a CI cancel stops every group (SIGINT: pytest then stops the Airflow it started).
trap 'kill -INT "${pids[@]}" 2>/dev/null; wait; exit 130' INT TERM
wait "${pids[@]}"

codes=()
for name in "${names[@]}"; do
  code="$(cat "$LOGS/$name.exit" 2>/dev/null || echo 1)"
  rm -f "$LOGS/$name.exit"
  codes+=("$code")
  echo "==== $name group: $LOGS/$name.log (exit $code) ===="
  cat "$LOGS/$name.log"
done

# pytest's 5 is "no test selected": fine for some groups (arguments that pick tests of another
# group only), a failure when no group selected anything.
failed=0 selected=0
for i in "${!names[@]}"; do
  echo "${names[$i]} group (exit ${codes[$i]}): $(tail -n 1 "$LOGS/${names[$i]}.log")"
  # The group's failing tests by name (pytest -ra's short summary), so the output's last lines say
  # which tests failed even where only its tail is kept (a CI service's log view).
  grep -E '^(FAILED|ERROR) ' "$LOGS/${names[$i]}.log" | cut -c1-300 | sed 's/^/  /'
  case "${codes[$i]}" in
    0) selected=1 ;;
    5) ;;
    *) failed=1 selected=1 ;;
  esac
done
# One closing line for the whole suite, summed over the groups' pytest summaries, with its time
# (minutes:seconds since the script started).
"$PY" - "$LOGS" "$SECONDS" "${names[@]}" <<'PYEOF'
import re, sys
logs, seconds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
total = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
for name in names:
    lines = open(f"{logs}/{name}.log", errors="replace").read().splitlines()
    last = next((line for line in reversed(lines) if re.search(r"\d+ (passed|failed|error|deselected)", line)), "")
    for count, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", last):
        total["error" if word.startswith("error") else word] += int(count)
extra = f", {total['skipped']} skipped" if total["skipped"] else ""
print(f"suite: {total['passed']} passed, {total['failed'] + total['error']} failed{extra} in {seconds // 60}:{seconds % 60:02d}")
PYEOF
[ "$failed" -eq 0 ] || exit 1
[ "$selected" -eq 1 ] || exit 5
exit 0
