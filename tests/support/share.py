"""A pytest plugin that shares a suite out between processes or pairs, by a CRC-32 of each test's
(or module's) id: the same on every machine and Python.

``--share=I/N`` is ``make matrix SHARE=yes``'s: the pairs that differ from ``make test``'s in the
same one thing (the older Airflow minors on its Python; its Airflow on the newer Pythons) share out
their suite, each keeping the tests whose node id hashes to ``I - 1`` modulo ``N``. Given to ``N``
pairs as ``1/N`` to ``N/N``, every test runs on one of them (and ``make test`` runs each on its own
pair), so every test runs on one older Airflow (if it can reach Airflow: tests/support/airflow_bound.py)
and on one newer Python. What this gives up: a test that fails on one of the sharing pairs only,
and passes on the other, is caught only when its share is that pair's.

``--modules=I[,J...]/N`` is ``make test``'s split of one group into processes (scripts/test.sh):
it keeps the tests of the modules whose path hashes to one of the shares given, so a
module's fixtures are set up in one process only. Given the shares ``1`` to ``N`` between them,
the processes run every test once.
"""

from __future__ import annotations

import zlib

import pytest

from support.selection import keep_only


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--share", metavar="I/N", default=None,
                     help="keep the I-th of N shares of the tests (tests/support/share.py)")
    parser.addoption("--modules", metavar="I[,J...]/N", default=None,
                     help="keep the tests of the modules in these of N shares (tests/support/share.py)")


def share_of(nodeid: str, n: int) -> int:
    """The share (1 to ``n``) the test ``nodeid`` falls in."""
    return zlib.crc32(nodeid.encode("utf-8")) % n + 1


def _parse(value: str, option: str = "--share") -> tuple[set[int], int]:
    try:
        shares, n_text = value.split("/")
        n = int(n_text)
        chosen = {int(part) for part in shares.split(",")}
    except ValueError:
        raise pytest.UsageError(f"{option}={value!r}: expected I/N, e.g. 1/2") from None
    if not all(1 <= i <= n for i in chosen):
        raise pytest.UsageError(f"{option}={value!r}: I must be between 1 and N")
    return chosen, n


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    value = config.getoption("--share")
    if value is not None:
        chosen, n = _parse(value)
        if len(chosen) != 1:
            raise pytest.UsageError(f"--share={value!r}: one share, e.g. 1/2")
        keep_only(config, items, lambda item: share_of(item.nodeid, n) in chosen)
    modules = config.getoption("--modules")
    if modules is not None:
        chosen, n = _parse(modules, "--modules")
        keep_only(config, items, lambda item: share_of(item.nodeid.split("::")[0], n) in chosen)
