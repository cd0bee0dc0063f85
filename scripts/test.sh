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
SLOW="scheduler or celery or browser or dist"
# name=marker expression; together they select every test exactly once.
GROUPS_=(
  "fast=not ($SLOW)"
  "scheduler=scheduler and not celery and not browser"
  "celery-browser=celery or browser"
  "dist=dist and not (scheduler or celery or browser)"
)
mkdir -p "$LOGS"
# The whole suite needs PostgreSQL and Redis beside it: say so now, not after half an hour.
if [ "$#" -eq 0 ] && ! "$PY" -m devtools.services; then
  exit 1
fi

names=() pids=()
for group in "${GROUPS_[@]}"; do
  name="${group%%=*}" expr="${group#*=}"
  "$PY" -m pytest -p no:cacheprovider -ra -m "$expr" "$@" >"$LOGS/$name.log" 2>&1 &
  names+=("$name") pids+=("$!")
  echo "$name group (-m \"$expr\") started: $LOGS/$name.log"
done
# Ctrl-C or a CI cancel stops every group (SIGINT: pytest then stops the Airflow it started).
trap 'kill -INT "${pids[@]}" 2>/dev/null; wait; exit 130' INT TERM

codes=()
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  codes+=("$?")
  echo "==== ${names[$i]} group: $LOGS/${names[$i]}.log (exit ${codes[$i]}) ===="
  cat "$LOGS/${names[$i]}.log"
done

# pytest's 5 is "no test selected": fine for some groups (arguments that pick tests of another
# group only), a failure when no group selected anything.
failed=0 selected=0
for i in "${!pids[@]}"; do
  echo "${names[$i]} group (exit ${codes[$i]}): $(tail -n 1 "$LOGS/${names[$i]}.log")"
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
