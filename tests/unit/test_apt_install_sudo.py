"""``make test``'s set-up (scripts/apt_install.sh, through browser-deps and chaos-deps) as a user who
is not root and whose sudo asks for a password: with no one to type it (CI, a job started from a
script, ``make test < /dev/null``), it must stop at once saying what to run, not wait on sudo's
prompt until the CI job's own timeout.

Fakes on PATH: ``id`` says uid 1000, ``sudo`` behaves as one that needs a password (``-n``: fails
at once; otherwise it waits for the password, here 60 s), ``apt-get`` records that it ran.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from support.paths import ROOT

FAKES = {
    "id": '#!/bin/sh\n[ "$1" = "-u" ] && { echo 1000; exit 0; }\nexec /usr/bin/id "$@"\n',
    "sudo": '#!/bin/sh\nif [ "$1" = "-n" ]; then echo "sudo: a password is required" >&2; exit 1; fi\n'
            'echo "[sudo] password for newcomer: " >&2\nsleep 60\nexit 1\n',
    "apt-get": '#!/bin/sh\necho "apt-get $*" >> "$APT_LOG"\n',
}


def test_a_sudo_that_asks_for_a_password_with_no_one_to_answer_stops_at_once_naming_the_command(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in FAKES.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "APT_LOG": str(tmp_path / "apt.log")}
    started = time.monotonic()
    try:
        done = subprocess.run(["bash", str(ROOT / "scripts" / "apt_install.sh"), "dumb-init", "socat"],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=20)
    except subprocess.TimeoutExpired:
        raise AssertionError("apt_install.sh waited on sudo's password prompt with no one to answer it") from None
    assert time.monotonic() - started < 15
    assert done.returncode != 0
    assert "apt-get install -y dumb-init socat" in done.stderr, done.stderr
    assert not (tmp_path / "apt.log").exists()
