"""The environment of a project-local Airflow, written once.

Airflow reads its configuration when first imported, so whoever uses this sets it before anything
imports Airflow: Python code calls :func:`apply`, shell scripts evaluate the ``export`` lines that
``python -m devtools.airflow_env`` prints.

    eval "$(python -m devtools.airflow_env --home .airflow-home --dags dags --conn sqlite:////abs/ck.db)"

``--api [--port N]`` adds the api-server's settings (:func:`api_settings`), as ``make standalone`` does.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit


def environment(
    home: str | os.PathLike[str],
    dags: str | os.PathLike[str],
    *,
    conn: str | None = None,
    log_level: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The variables of an Airflow home at ``home`` with the DAGs of ``dags``.

    ``conn`` is the checkpoint store's connection URI (``resumable_default``); None leaves it unset.
    """
    env = {
        "AIRFLOW_HOME": str(Path(home).resolve()),
        "AIRFLOW__CORE__DAGS_FOLDER": str(Path(dags).resolve()),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        # `airflow standalone` starts one worker process per slot: 4 keep it near 1 GB, not 5.
        "AIRFLOW__CORE__PARALLELISM": "4",
    }
    if log_level:
        env["AIRFLOW__LOGGING__LOGGING_LEVEL"] = log_level
    if conn:
        env["AIRFLOW_CONN_RESUMABLE_DEFAULT"] = conn
    env.update(extra or {})
    return env


#: Airflow's own default port of the api-server (``[api] port``).
DEFAULT_PORT = "8080"
#: Hosts a person's own machine answers on: the api-server bound to one of them is local.
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def api_settings(environ: Mapping[str, str], port: str | int | None = None) -> dict[str, str]:
    """The api-server's settings for a local Airflow on one port: the UI, the REST API and the
    Execution API (which every task's supervisor calls) move together.

    ``port`` (``make standalone PORT=...``) wins over everything; else Airflow's own
    ``AIRFLOW__API__PORT`` (default 8080). ``[api] base_url`` and ``[core] execution_api_server_url``
    follow the port unless ``environ`` sets them itself (and no ``port`` was given): Airflow's own
    defaults for both name port 8080 whatever the port is, so a task on another port could not
    reach the Execution API. An address of ``environ`` that names this machine on another port (an
    ``env.sh`` of an earlier run sourced, say) is not this api-server's: it follows the port too,
    said on stderr. The host is ``127.0.0.1`` unless ``AIRFLOW__API__HOST`` names one (a local host
    also keeps Airflow's "looks like production" warning quiet); an api-server on IPv6's loopback
    is called there, under ``base_url``'s path (the api-server serves all of it under that path).

    Raises:
        ValueError: the port is not a number from 1 to 65535 (0 would let the api-server take any
            free port while every task called port 0).
    """
    host = environ.get("AIRFLOW__API__HOST") or "127.0.0.1"
    chosen = _port(port if port not in (None, "") else environ.get("AIRFLOW__API__PORT") or DEFAULT_PORT)
    local = host in LOCAL_HOSTS or host in ("0.0.0.0", "::", "[::]")
    scheme = "https" if environ.get("AIRFLOW__API__SSL_CERT") else "http"
    base = f"{scheme}://{'localhost' if local else host}:{chosen}"
    if port in (None, ""):
        base = _own(environ, "AIRFLOW__API__BASE_URL", chosen) or base
    # A local api-server is called on its own address, not through whatever base_url names; under
    # base_url's path, which the api-server serves everything under (its app's root_path).
    loopback = "[::1]" if host in ("::1", "[::1]", "::", "[::]") else "127.0.0.1"
    prefix = urlsplit(base).path.rstrip("/")
    execution = f"{scheme}://{loopback}:{chosen}{prefix}/execution/" if local else f"{base.rstrip('/')}/execution/"
    if port in (None, ""):
        execution = _own(environ, "AIRFLOW__CORE__EXECUTION_API_SERVER_URL", chosen) or execution
    return {
        "AIRFLOW__API__HOST": host,
        "AIRFLOW__API__PORT": chosen,
        "AIRFLOW__API__BASE_URL": base,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": execution,
    }


def _port(value: str | int) -> str:
    text = str(value).strip()
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"the api-server's port must be a number from 1 to 65535, not {str(value)!r} "
                         "(make standalone PORT=28080, or AIRFLOW__API__PORT)")
    return str(int(text))


def _own(environ: Mapping[str, str], key: str, port: str) -> str | None:
    """``environ``'s own ``key`` unless it names this machine on a port other than ``port``."""
    value = environ.get(key)
    if not value:
        return None
    try:
        parts = urlsplit(value)
        named = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return value
    if parts.hostname in (*LOCAL_HOSTS, "0.0.0.0", "::") and str(named) != port:
        print(f"{key}={value} names this machine on port {named}, not the api-server's {port}: it follows "
              f"the port (docs/how-to/ui.md#another-port)", file=sys.stderr)
        return None
    return value


def apply(env: Mapping[str, str], *, keep_conn: bool = False) -> None:
    """Set ``env`` in this process, first dropping inherited settings that would override it (a
    metadata database, the checkpoint connection) unless ``env`` sets them itself."""
    for key in ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", *(() if keep_conn else ("AIRFLOW_CONN_RESUMABLE_DEFAULT",))):
        if key not in env:
            os.environ.pop(key, None)
    os.environ.update(env)


def main() -> None:
    parser = argparse.ArgumentParser(description="print the export lines of a project-local Airflow")
    parser.add_argument("--home", required=True)
    parser.add_argument("--dags", required=True)
    parser.add_argument("--conn")
    parser.add_argument("--log-level")
    parser.add_argument("--api", action="store_true",
                        help="also the api-server's host, port, base URL and Execution API URL (api_settings)")
    parser.add_argument("--port", default=None, help="with --api: the port (make standalone PORT=...)")
    args = parser.parse_args()
    env = environment(args.home, args.dags, conn=args.conn, log_level=args.log_level)
    if args.api:
        try:
            env.update(api_settings(os.environ, args.port or None))
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
    for key, value in env.items():
        print(f"export {key}={shlex.quote(value)}")


if __name__ == "__main__":
    main()
