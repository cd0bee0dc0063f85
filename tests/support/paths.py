"""Where the checkout's parts are, for test modules at any depth under tests/ and their workers."""

from __future__ import annotations

from pathlib import Path

#: tests/
TESTS = Path(__file__).resolve().parents[1]
#: The checkout's root (setup.cfg, dags/, docs/, scripts/).
ROOT = TESTS.parent
#: tests/support/: the helpers and the worker scripts the tests start as processes of their own.
SUPPORT = TESTS / "support"
