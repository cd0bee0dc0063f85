#!/usr/bin/env bash
# Install Debian packages the tests run beside Python (make browser-deps, make chaos-deps; make test
# runs both): as root, else through sudo; with neither, fail saying what to run.
#   scripts/apt_install.sh PACKAGE...
set -euo pipefail
if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
  # With no one to type sudo's password (CI, stdin not a terminal) it must not wait on its prompt
  case "$(printf %s "${CI:-}" | tr '[:upper:]' '[:lower:]')" in true|1|yes) in_ci=1 ;; *) in_ci="" ;; esac
  if [ -n "$in_ci" ] || [ ! -t 0 ]; then
    if ! sudo -n true 2>/dev/null; then
      echo "missing Debian packages: $*; sudo needs a password and no one is here to type it: run" \
           "sudo apt-get install -y $*" >&2
      exit 1
    fi
    as_root=(sudo -n)
  fi
else
  echo "missing Debian packages: $*; install them as root: apt-get install -y $*" >&2
  exit 1
fi
echo "installing Debian's $* (apt-get, once: the tests need them)"
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
