#!/usr/bin/env bash
# `make matrix`: the fast suite (no real scheduler, PostgreSQL server or browser: the `fast` target's
# selection) on every supported (Airflow, Python) pair but the newest, whose whole suite `make test`
# runs in .venv. A pair is a file constraints/airflow-<minor>-py<python>.txt (scripts/constraints.py
# writes them); its venv is .venvs/airflow-<minor>-py<python>/, made with pyenv's interpreter for that
# Python and installed from that file, and made again when the file or setup.cfg changed. Prints one
# row per pair (Airflow, Python, passed/failed, seconds to set up and to test) and exits non-zero if
# any pair failed, including one whose Python is missing (the row names the interpreter looked for).
#   CONSTRAINTS  the newest pair's file, left to `make test` (default constraints/airflow-3.3-py3.11.txt)
#   CELLS        only these pairs, space-separated (e.g. CELLS="airflow-3.1-py3.11")
#   TEST_LOGS    where each pair's log goes (default .test-logs/), as matrix-<pair>.log
#   MATRIX_JOBS  how many pairs' tests run at once (default 1). The venvs are set up one after
#                another first (an editable install leaves an egg-info in the checkout for a moment,
#                which another pair's pytest would see); the suites then run side by side, as
#                make test's groups do (free ports, private Airflow homes and schemas). A pair's
#                suite spends most of its time waiting (dag.test(), deadlines), so two share 2 cores.
#   arguments    passed to every pytest run (make matrix PYTEST_ARGS="-k lease")
set -uo pipefail
cd "$(dirname "$0")/.."
NEWEST="${CONSTRAINTS:-constraints/airflow-3.3-py3.11.txt}"
LOGS="${TEST_LOGS:-.test-logs}"
FAST="not scheduler and not postgres and not browser and not celery and not chaos and not dist and not site"
PIP="pip==26.3"
mkdir -p "$LOGS" .venvs

cells=()
if [ -n "${CELLS:-}" ]; then
  read -r -a cells <<<"$CELLS"
else
  for file in constraints/airflow-*-py*.txt; do
    [ "$file" = "$NEWEST" ] && continue
    cells+=("$(basename "$file" .txt)")
  done
fi
if [ "${#cells[@]}" -eq 0 ]; then
  echo "matrix: no pair to run (constraints/ has only $NEWEST)" >&2
  exit 1
fi

JOBS="${MATRIX_JOBS:-1}"
rows=() failed=0 total_passed=0 total_failed=0 began=$SECONDS
declare -A setup_of=() row_of=()
ready=()
# 1. Each pair's venv, one after another.
for cell in "${cells[@]}"; do
  file="constraints/$cell.txt" venv=".venvs/$cell" log="$LOGS/matrix-$cell.log"
  python="${cell##*-py}" airflow="${cell#airflow-}" airflow="${airflow%%-py*}"
  start=$SECONDS
  : >"$log"
  if [ ! -f "$file" ]; then
    row_of[$cell]="$cell|$airflow|$python|FAILED: no constraints file $file|0|0" failed=1 total_failed=$((total_failed + 1))
    continue
  fi
  if ! interpreter="$(python3 scripts/constraints.py --interpreter "$python" 2>&1)"; then
    echo "$cell: $interpreter" >&2
    row_of[$cell]="$cell|$airflow|$python|FAILED: $interpreter|0|0" failed=1 total_failed=$((total_failed + 1))
    continue
  fi
  echo "== $cell: $interpreter, $file"
  if [ ! -f "$venv/.installed" ] || [ "$file" -nt "$venv/.installed" ] || [ setup.cfg -nt "$venv/.installed" ]; then
    rm -rf "$venv"
    {
      "$interpreter" -m venv "$venv" &&
      "$venv/bin/python" -m pip install --quiet --progress-bar off "$PIP" &&
      "$venv/bin/python" -m pip install --quiet --progress-bar off -c "$file" -e ".[test,lint]"
    } >>"$log" 2>&1
    code=$?
    # As the Makefile does: an egg-info here would declare every entry point a second time.
    rm -rf airflow_resumable.egg-info
    if [ "$code" -ne 0 ]; then
      grep -v "^WARNING: Location" "$log" | tail -n 20 >&2
      row_of[$cell]="$cell|$airflow|$python|FAILED: the install (see $log)|$((SECONDS - start))|0" failed=1
      total_failed=$((total_failed + 1))
      continue
    fi
    touch "$venv/.installed"
  fi
  setup_of[$cell]=$((SECONDS - start))
  ready+=("$cell")
done
rm -rf airflow_resumable.egg-info  # whoever left one (an editable build elsewhere): see the install above

# 2. Each ready pair's fast suite, up to JOBS at once; a pair's exit code and seconds in a file.
# A pair on make test's own Python differs from it only in Airflow's version (and Airflow's own pins):
# there the core's tests that cannot reach Airflow are left out (tests/support/airflow_bound.py), as
# they run the same code on the same Python with the same libraries in make test.
NEWEST_PYTHON="${NEWEST##*-py}" NEWEST_PYTHON="${NEWEST_PYTHON%.txt}"
run_cell() {
  local cell="$1" venv=".venvs/$1" log="$LOGS/matrix-$1.log" start=$SECONDS code
  local only=()
  if [ "${cell##*-py}" = "$NEWEST_PYTHON" ]; then
    only=(-p support.airflow_bound --skip-airflow-free tests/unit/core)
  fi
  PYTHONPATH="tests${PYTHONPATH:+:$PYTHONPATH}" "$venv/bin/python" -m pytest -p no:cacheprovider -ra -m "$FAST" \
    "${only[@]}" "${@:2}" >>"$log" 2>&1
  code=$?
  echo "$code $((SECONDS - start))" >"$LOGS/matrix-$cell.exit"
}
for cell in "${ready[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  echo "-- $cell: the fast suite (log $LOGS/matrix-$cell.log)"
  run_cell "$cell" "$@" &
done
wait

for cell in "${ready[@]}"; do
  venv=".venvs/$cell" log="$LOGS/matrix-$cell.log"
  versions="$("$venv/bin/python" -c 'import platform, airflow; print(airflow.__version__, platform.python_version())' 2>/dev/null)"
  airflow="${versions% *}" python="${versions#* }"
  read -r code tests <"$LOGS/matrix-$cell.exit" || { code=1 tests=0; }
  rm -f "$LOGS/matrix-$cell.exit"
  summary="$(grep -E '[0-9]+ (passed|failed|errors?)' "$log" | tail -n 1 | sed -E 's/^=+ //; s/ =+$//')"
  passed="$(grep -oE '[0-9]+ passed' <<<"$summary" | grep -oE '^[0-9]+')"
  failures=0
  for n in $(grep -oE '[0-9]+ (failed|errors?)' <<<"$summary" | grep -oE '^[0-9]+'); do failures=$((failures + n)); done
  total_passed=$((total_passed + ${passed:-0})) total_failed=$((total_failed + ${failures:-0}))
  if [ "$code" -ne 0 ]; then
    failed=1
    echo "---- $cell failed (exit $code): $log" >&2
    grep -E '^(FAILED|ERROR) ' "$log" | head -n 30 >&2
    [ "${failures:-0}" -gt 0 ] || total_failed=$((total_failed + 1))
  fi
  row_of[$cell]="$cell|$airflow|$python|${summary:-exit $code}|${setup_of[$cell]}|$tests"
done
for cell in "${cells[@]}"; do rows+=("${row_of[$cell]}"); done

echo
printf '%-20s %-8s %-8s %-44s %7s %7s\n' cell Airflow Python "passed/failed" "setup s" "tests s"
for row in "${rows[@]}"; do
  IFS='|' read -r cell airflow python result setup tests <<<"$row"
  printf '%-20s %-8s %-8s %-44s %7s %7s\n' "$cell" "$airflow" "$python" "$result" "$setup" "$tests"
done
echo "matrix: ${#cells[@]} pairs in $((SECONDS - began))s (${JOBS} at a time)"
echo "matrix: $total_passed passed, $total_failed failed"
exit "$failed"
