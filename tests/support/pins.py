"""A constraints file's pins, by normalized distribution name."""

from __future__ import annotations

import re
from pathlib import Path


def pins(path: Path) -> dict[str, str]:
    """``{name: version}`` of every ``name==version`` line of ``path`` (names as PyPI normalizes them)."""
    found = {}
    for line in path.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            found[re.sub(r"[-_.]+", "-", name).lower()] = version.strip()
    return found
