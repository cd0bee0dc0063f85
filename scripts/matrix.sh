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
#   PREPARE      "yes": only put each pair's pinned packages in its venv (its constraints file's pins
#                of setup.cfg's requirements with the test and lint extras), not the project: no
#                egg-info is written in the checkout, so this runs beside make test (CI does); the
#                run after it installs only the project (pip --no-deps -e .). Exits 0 (a pair it could
#                not prepare is installed whole by the run after it)
#   SHARE        "yes" (CI's choice): the pairs that differ from make test's in the same one thing
#                share out their suite, each test on one of them (tests/support/share.py): the
#                other Airflow minors on make test's Python, and the newest Airflow on the other
#                Pythons; default: each runs them all
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
FAST="not scheduler and not postgres and not browser and not celery and not chaos and not dist and not site and not trials"
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
  current() {  # $1 (a marker file in the venv) is newer than the pair's constraints file and setup.cfg
    [ -f "$venv/$1" ] && [ ! "$file" -nt "$venv/$1" ] && [ ! setup.cfg -nt "$venv/$1" ]
  }
  new_venv() {  # the pair's venv made afresh, with the pinned pip
    rm -rf "$venv" && "$interpreter" -m venv "$venv" && "$venv/bin/python" -m pip install --quiet --progress-bar off "$PIP"
  }
  if [ "${PREPARE:-}" = "yes" ]; then
    current .installed && continue
    if {
      new_venv &&
      python3 - "$venv/requirements.txt" <<'PYEOF' &&
import configparser, sys
cfg = configparser.ConfigParser()
cfg.read("setup.cfg")
wanted = [cfg["options"]["install_requires"]] + [cfg["options.extras_require"][extra] for extra in ("test", "lint")]
lines = [line.strip() for value in wanted for line in value.splitlines()]
open(sys.argv[1], "w").write("".join(f"{line}\n" for line in lines if line and not line.startswith("#")))
PYEOF
      "$venv/bin/python" -m pip install --quiet --progress-bar off -c "$file" -r "$venv/requirements.txt"
    } >"$LOGS/matrix-$cell-prepare.log" 2>&1; then
      touch "$venv/.prepared"
      echo "-- $cell: its pinned packages are in ($((SECONDS - start)) s)"
    else
      echo "-- $cell: could not prepare its venv ($LOGS/matrix-$cell-prepare.log): the run installs it whole" >&2
      rm -rf "$venv"
    fi
    continue
  fi
  if ! current .installed; then
    if current .prepared; then  # its pinned packages are in (PREPARE=yes): the project only
      "$venv/bin/python" -m pip install --quiet --progress-bar off --no-deps -e . >>"$log" 2>&1
    else
      {
        new_venv &&
        "$venv/bin/python" -m pip install --quiet --progress-bar off -c "$file" -e ".[test,lint]"
      } >>"$log" 2>&1
    fi
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
if [ "${PREPARE:-}" = "yes" ]; then
  echo "matrix: the pairs' venvs prepared in $((SECONDS - began))s"
  exit 0
fi

# 2. Each ready pair's fast suite, up to JOBS at once; a pair's exit code and seconds in a file.
# A pair on make test's own Python differs from it only in Airflow's version (and Airflow's own pins):
# there the core's tests that cannot reach Airflow are left out (tests/support/airflow_bound.py), as
# they run the same code on the same Python with the same libraries in make test.
# With SHARE=yes, the pairs of make test's own Python (other Airflow minors), and those of its own
# Airflow (other Pythons), each share out their suite among themselves: the i-th of n such pairs
# runs --share=i/n.
NEWEST_PYTHON="${NEWEST##*-py}" NEWEST_PYTHON="${NEWEST_PYTHON%.txt}"
NEWEST_AIRFLOW="${NEWEST#*airflow-}" NEWEST_AIRFLOW="${NEWEST_AIRFLOW%%-py*}"
declare -A share_of=()
if [ "${SHARE:-}" = "yes" ]; then
  minors=() pythons=()
  for cell in "${ready[@]}"; do
    airflow="${cell#airflow-}" airflow="${airflow%%-py*}"
    if [ "${cell##*-py}" = "$NEWEST_PYTHON" ]; then
      minors+=("$cell")
    elif [ "$airflow" = "$NEWEST_AIRFLOW" ]; then
      pythons+=("$cell")
    fi
  done
  for i in "${!minors[@]}"; do share_of[${minors[$i]}]="$((i + 1))/${#minors[@]}"; done
  for i in "${!pythons[@]}"; do share_of[${pythons[$i]}]="$((i + 1))/${#pythons[@]}"; done
fi
run_cell() {
  local cell="$1" venv=".venvs/$1" log="$LOGS/matrix-$1.log" start=$SECONDS code
  local only=()
  if [ "${cell##*-py}" = "$NEWEST_PYTHON" ]; then
    only=(-p support.airflow_bound --skip-airflow-free tests/unit/core)
  fi
  if [ -n "${share_of[$cell]:-}" ]; then
    only+=(-p support.share "--share=${share_of[$cell]}")
  fi
  PYTHONPATH="tests${PYTHONPATH:+:$PYTHONPATH}" "$venv/bin/python" -m pytest -p no:cacheprovider -ra -m "$FAST" \
    "${only[@]}" "${@:2}" >>"$log" 2>&1
  code=$?
  echo "$code $((SECONDS - start))" >"$LOGS/matrix-$cell.exit"
}
for cell in "${ready[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  echo "-- $cell: the fast suite${share_of[$cell]:+, share ${share_of[$cell]}} (log $LOGS/matrix-$cell.log)"
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
