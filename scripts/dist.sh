#!/usr/bin/env bash
# `make dist`: the wheel and the sdist in dist/ (or DIST_DIR), checked by `twine check --strict`.
# They are built from a copy of the checkout's files (tracked and new, less what .gitignore
# ignores), so the build's airflow_resumable.egg-info never lands in the checkout: there, on
# sys.path, it would declare every entry point a second time. The build's own environment is
# isolated and takes setuptools from the constraints file.
#   PY           the interpreter with the release extra (default .venv/bin/python)
#   DIST_DIR     where the artifacts go (default dist/); earlier artifacts there are removed first
#   CONSTRAINTS  the pins for the build environment (make passes its CONSTRAINTS; default
#                constraints/airflow-3.3-py3.11.txt when it exists, else setuptools unpinned, said so)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
OUT="$(mkdir -p "${DIST_DIR:-dist}" && cd "${DIST_DIR:-dist}" && pwd)"
CONSTRAINTS="${CONSTRAINTS:-constraints/airflow-3.3-py3.11.txt}"
pins=()
if [ -f "$CONSTRAINTS" ]; then
  pins=(--dependency-constraints-txt "$(realpath "$CONSTRAINTS")")
else
  echo "dist: no constraints file $CONSTRAINTS: the build environment's setuptools is not pinned" >&2
fi

if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "make dist builds from a git checkout of airflow-resumable (it copies the files git lists)" >&2
  exit 2
fi
src="$(mktemp -d)"
trap 'rm -rf "$src"' EXIT
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' path; do
  [ -e "$path" ] && printf '%s\0' "$path"  # a tracked file deleted in the work tree is not built
done | xargs -0 cp --parents -t "$src"

rm -f "$OUT"/airflow_resumable-*.whl "$OUT"/airflow_resumable-*.tar.gz
"$PY" -m build "${pins[@]}" --outdir "$OUT" "$src"
"$PY" -m twine check --strict "$OUT"/airflow_resumable-*.whl "$OUT"/airflow_resumable-*.tar.gz
ls -l "$OUT"/airflow_resumable-*
