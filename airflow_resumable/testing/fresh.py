"""Attempts in new processes, for the kit's :attr:`~airflow_resumable.testing.Interruption.PROCESS_DEATH`.

A real crash loses the process: its module globals, its caches, every object the handler kept in
memory. The kit proves a handler survives that by running the attempt that crashes, and the one
that resumes, in processes of their own, each importing the handler anew by its module path.

The handler travels by :mod:`pickle`, which names a function or a class by its module and
qualified name (never by value): the new process imports that module itself. It is pickled once,
when the check starts, so an object's attributes travel as they were before any run. A lambda, a
function defined inside another, or a handler defined in the script being run (``__main__``) has no
such name: :class:`NotImportable` says so before any new process starts.

A new process is forked from a server process the kit starts on first use
(``python -c "from airflow_resumable.testing.fresh import serve; serve()"``), which has imported the
product but never any of the user's modules: each child imports them anew, with the test's current
environment variables, working directory and ``sys.path``. To keep a child quick the server
imports beforehand the installed libraries (the standard library, site-packages, this product;
never the user's own code) that the handler's modules use, such as Airflow, and those the children
before had to import; a library imported so is in the state a fresh import leaves it in. The
server is kept for the checks that follow while the environment, the working directory and
``sys.path`` stay as they were when it started (a change starts a new one), and stopped at exit.
The crashing child kills itself with SIGKILL once its checkpoint is durable; the server reports
how each child ended.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import logging
import marshal
import math
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
import types
from pathlib import Path
from typing import Any

__all__ = ["Ended", "FreshProcesses", "NotImportable", "handler_payload", "refuse_in_child", "store_payload"]

#: How long a child may run before the kit kills it (a handler that hangs in a new process).
CHILD_TIMEOUT = 600.0

#: Set in a child's environment: a check of the kit started there (by a module that runs one when
#: imported) would start the same check again in a new child, and so on without end.
IN_CHILD = "RESUMABLE_KIT_CHILD"

_LEN = struct.Struct("!I")


class NotImportable(TypeError):
    """The handler (or the store, or the options) cannot be sent to a new process by name."""


# -- the handler, by name --------------------------------------------------------------------------


def unwrap(module: str, qualname: str, attribute: str) -> Any:
    """``module.qualname.attribute``: a function that a decorator replaced in its module
    (``@task.resumable``'s ``.function``, ``functools.wraps``' ``__wrapped__``), by name."""
    import importlib

    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return getattr(found, attribute)


class _ByName(pickle.Pickler):
    """Pickles functions by module and name; a function that its module holds under a decorator
    (``m.f`` is a task whose ``.function`` is the function) by that path. Notes the modules of
    the functions, classes and objects it pickles."""

    def __init__(self, file: io.BytesIO, protocol: int):
        super().__init__(file, protocol=protocol)
        self.modules: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        named = obj if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)) else type(obj)
        if isinstance(getattr(named, "__module__", None), str):
            self.modules.add(named.__module__)
        if not isinstance(obj, types.FunctionType):
            return NotImplemented
        module, qualname = obj.__module__ or "", obj.__qualname__
        found: Any = sys.modules.get(module)
        for part in qualname.split("."):
            found = getattr(found, part, None)
        if found is obj or found is None:
            return NotImplemented  # pickle's own check names what is wrong
        for attribute in ("function", "__wrapped__", "python_callable"):
            if getattr(found, attribute, None) is obj:
                return unwrap, (module, qualname, attribute)
        return NotImplemented


class _Modules(pickle.Unpickler):
    """Reads a payload back in this process, noting the modules it names."""

    def __init__(self, data: bytes):
        super().__init__(io.BytesIO(data))
        self.modules: set[str] = set()

    def find_class(self, module: str, name: str) -> Any:
        self.modules.add(module)
        return super().find_class(module, name)


def refuse_in_child(label: str) -> None:
    """Refuse a check started inside one of the kit's new processes.

    Raises:
        NotImportable: this process is one of the kit's new processes: the handler's module (or a
            module it imports) runs a check when it is imported.
    """
    if os.environ.get(IN_CHILD):
        raise NotImportable(
            f"{label}: a check of the test kit started while a new process of process_death imported the handler: "
            "the handler's module (or one it imports) runs a check when it is imported, so each new process would "
            "start the same check again, without end. Run the check inside a test function, or under "
            "`if __name__ == \"__main__\":`")


def handler_payload(handler: Any, options: Any, *, label: str) -> tuple[bytes, list[str]]:
    """``(handler, options)`` pickled by name, and the installed modules worth importing before a
    child starts (those the handler's own modules use).

    Raises:
        NotImportable: one of them cannot be named so that a new process imports it; or this
            platform cannot fork (Windows).
    """
    if not hasattr(os, "fork"):
        raise NotImportable(f"{label}: process_death forks its new processes (os.fork), which this platform does not "
                            "have; leave this kind out: interruptions=IN_PROCESS_INTERRUPTIONS")
    buffer = io.BytesIO()
    pickler = _ByName(buffer, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        pickler.dump((handler, options))
    except Exception as exc:
        raise NotImportable(_not_importable(label, handler, options, exc)) from None
    payload = buffer.getvalue()
    reader = _Modules(payload)
    try:
        reader.load()
    except Exception as exc:
        raise NotImportable(_not_importable(label, handler, options, exc)) from None
    if "__main__" in reader.modules:
        raise NotImportable(
            f"{label}: process_death runs the resumed attempt in a new process, which imports the handler by its "
            "module path; this one is defined in the script being run (__main__), which a new process does not "
            "import. Move it to a module of its own (and import it from the script), or leave this kind out: "
            "interruptions=IN_PROCESS_INTERRUPTIONS")
    return payload, _preloads(reader.modules | pickler.modules)


def store_payload(store: Any, *, label: str) -> bytes:
    """The checkpoint store of a trial, pickled for its new processes.

    Raises:
        NotImportable: the store cannot be sent to a new process.
    """
    try:
        return pickle.dumps(store, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise NotImportable(_not_importable(label, None, None, exc, what="the store")) from None


def _not_importable(label: str, handler: Any, options: Any, exc: BaseException, *, what: str = "") -> str:
    if not what:
        what = "the handler"
        try:
            pickle.dumps(options, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            what = "the options"
    why = f"{type(exc).__name__}: {exc}"
    if what == "the handler":
        return (f"{label}: process_death runs the resumed attempt in a new process, which imports the handler anew "
                f"by its module path, and the handler cannot be named so ({why}). The handler must be importable: "
                "a function at the top level of a module (not a lambda, not a function defined inside another or "
                "inside a test), a functools.partial of one, a bound method or a callable object whose class is "
                "at the top level of a module and whose attributes pickle; the same for a ChunkedOperator's read, "
                "process and their options (use operator.itemgetter('id') for position=lambda o: o['id']). "
                "Or leave this kind out: interruptions=IN_PROCESS_INTERRUPTIONS")
    return (f"{label}: process_death opens the checkpoint store in a new process, and {what} cannot be sent there "
            f"({why}). Give store= a URL, a SQLiteStore or a PostgresStore built from its parameters (and "
            "options whose functions are importable), or leave this kind out: interruptions=IN_PROCESS_INTERRUPTIONS")


def _installed_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple({os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")
                  if k in paths})


def _installed(module: types.ModuleType, roots: tuple[str, ...]) -> bool:
    """Whether ``module`` is a library (standard library, site-packages, a built-in, this product
    wherever it is installed from), not the user's code."""
    file = getattr(module, "__file__", None)
    return (file is None or module.__name__.split(".")[0] == "airflow_resumable"
            or os.path.realpath(file).startswith(roots))


def _preloads(named: set[str]) -> list[str]:
    """The installed modules that the user's modules among ``named`` import: worth importing once,
    in the server, so that each child imports only the user's code."""
    roots = _installed_roots()
    found: set[str] = set()
    for name in named:
        module = sys.modules.get(name)
        if module is None or _installed(module, roots):
            continue
        for value in list(vars(module).values()):
            used = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
            library = sys.modules.get(used) if isinstance(used, str) else None
            if library is not None and used != name and _installed(library, roots):
                found.add(used)  # type: ignore[arg-type]
    return sorted(found)


# -- the server's side -------------------------------------------------------------------------------


def _send(fd: int, message: dict[str, Any]) -> None:
    body = marshal.dumps(message)
    data = memoryview(_LEN.pack(len(body)) + body)
    while data:
        data = data[os.write(fd, data):]


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks = b""
    while len(chunks) < n:
        got = os.read(fd, n - len(chunks))
        if not got:
            return None
        chunks += got
    return chunks


def _receive(fd: int) -> dict[str, Any] | None:
    head = _read_exact(fd, _LEN.size)
    if head is None:
        return None
    body = _read_exact(fd, _LEN.unpack(head)[0])
    return None if body is None else marshal.loads(body)


def serve() -> None:
    """The server: read requests on stdin, fork a child for each, say on stdout how it ended.

    Its own stdin and stdout carry only the protocol: they are moved to private descriptors, and
    what anything else prints goes to stderr (the test's output).
    """
    requests, replies = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    import airflow_resumable.testing.interrupt  # noqa: F401  the product, once, for every child

    while (request := _receive(requests)) is not None:
        _apply(request)
        for name in request.get("preload", ()):
            with contextlib.suppress(BaseException):  # a child imports what failed here itself
                __import__(name)
        pid = os.fork()
        if pid == 0:  # the child: nothing of the test's process, nothing of the user's code yet
            os.close(requests)
            os.close(replies)
            _child(request)  # never returns
        _send(replies, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        _send(replies, {"status": status})


def _apply(request: dict[str, Any]) -> None:
    """The test process's environment, working directory and import path, as they are now."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[:] = request["path"]
    logging.getLogger("airflow_resumable").setLevel(request["log_level"])  # the attempts log as the test's would


def _child(request: dict[str, Any]) -> None:
    """Import the handler anew, run the requested attempts, write what they gave, exit at once."""
    from airflow_resumable.testing.interrupt import Interruption, _Plan, run_to_the_end

    answer: dict[str, Any]
    known = set(sys.modules)
    os.environ[IN_CHILD] = "1"
    try:
        try:
            handler, options = pickle.loads(request["payload"])
        except BaseException as exc:  # an import error, or an import's sys.exit()
            answer = {"error": "import", "text": _error(exc), "trace": traceback.format_exc()}
        else:
            # "crash": killed at the point-th checkpoint (this returns only when the run ended first)
            plan = _Plan(kind=Interruption.PROCESS_DEATH if request["mode"] == "crash" else None,
                         point=request["point"])
            outcome, attempts = run_to_the_end(handler, pickle.loads(request["store"]), plan, options,
                                               request["max_attempts"], first_attempt=request["first_attempt"])
            answer = {"result": outcome.result, "state": outcome.checkpoint.state, "attempts": attempts,
                      "checkpoints": plan.calls}
    except BaseException as exc:
        answer = {"error": "run", "text": _error(exc), "trace": traceback.format_exc()}
    roots = _installed_roots()  # the libraries this child had to import: the next ones find them loaded
    answer["imported"] = sorted(n for n, m in list(sys.modules.items())
                                if n not in known and m is not None and _installed(m, roots))
    _write(request["answer"], answer)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _write(path: str, answer: dict[str, Any]) -> None:
    try:
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # a result that does not pickle: compared by its repr
        answer["result"] = Unpicklable(repr(answer.get("result")))
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    with open(path + ".part", "wb") as f:
        f.write(data)
    os.replace(path + ".part", path)


class Unpicklable(str):
    """The ``repr`` of a result that a child could not send back."""


# -- the test's side ----------------------------------------------------------------------------------


class Ended:
    """How a child ended: killed (by a signal, its number) or exited, and what it wrote."""

    def __init__(self, status: int, answer: dict[str, Any] | None):
        self.killed = os.WIFSIGNALED(status)
        self.signal = os.WTERMSIG(status) if self.killed else None
        self.exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        self.answer = answer

    def describe(self) -> str:
        if self.killed:
            return f"killed by signal {self.signal}"
        return f"exited with status {self.exit_code}"


class _Server:
    """The server process, with the libraries it has imported so far; one at a time, kept for
    the checks that follow while the environment, the working directory and ``sys.path`` stay
    as they were when it started (its libraries read them when imported)."""

    def __init__(self, key: tuple[Any, ...]):
        self.key = key
        self.preload: set[str] = set()
        self.lock = threading.Lock()
        self.popen = subprocess.Popen(
            [sys.executable, "-c", "from airflow_resumable.testing.fresh import serve; serve()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})

    def alive(self) -> bool:
        return self.popen.poll() is None

    def close(self) -> None:
        """Stop it: it exits once its requests end (a child still running ends first)."""
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.close()
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        self.popen.stdout.close()


_SERVERS: list[_Server] = []  # at most one
#: Variables that change from test to test and no library reads when imported (pytest's own).
_VOLATILE = frozenset({"PYTEST_CURRENT_TEST"})
_SERVERS_LOCK = threading.Lock()


def _server() -> _Server:
    """The server for this process's environment, working directory and import path, as they are
    now: the one running when they have not changed since it started, else a new one."""
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k not in _VOLATILE))
    key = (sys.executable, env, os.getcwd(), tuple(sys.path))
    with _SERVERS_LOCK:
        if _SERVERS and _SERVERS[0].key == key and _SERVERS[0].alive():
            return _SERVERS[0]
        if _SERVERS:
            _SERVERS.pop().close()
        _SERVERS.append(_Server(key))
        return _SERVERS[0]


@atexit.register
def stop_server() -> None:
    """Stop the kit's server process, if one runs (at exit, or to start afresh)."""
    with _SERVERS_LOCK:
        while _SERVERS:
            _SERVERS.pop().close()


class FreshProcesses:
    """New processes for one check's handler: each :meth:`run` forks one from the kit's server."""

    def __init__(self, payload: bytes, preload: list[str], *, timeout: float = CHILD_TIMEOUT):
        self.payload, self.preload, self.timeout = payload, preload, timeout
        self._folder = tempfile.TemporaryDirectory(prefix="resumable-kit-fresh-")
        self._count = 0

    def run(self, store: bytes, *, mode: str, point: int = 0, first_attempt: int = 1, max_attempts: int = 20) -> Ended:
        """Run ``mode`` (``crash`` at checkpoint ``point``, or ``run`` to the end from the slot's
        checkpoint) in a new process; wait for it to end (killing it after the timeout).

        Raises:
            RuntimeError: the server process died.
        """
        server = _server()
        with server.lock:
            return self._run(server, store, mode=mode, point=point, first_attempt=first_attempt,
                             max_attempts=max_attempts)

    def _run(self, server: _Server, store: bytes, *, mode: str, point: int, first_attempt: int,
             max_attempts: int) -> Ended:
        assert server.popen.stdin is not None and server.popen.stdout is not None
        self._count += 1
        answer = Path(self._folder.name) / f"answer-{self._count}"
        _send(server.popen.stdin.fileno(), {
            "payload": self.payload, "preload": sorted(server.preload | set(self.preload)), "mode": mode,
            "point": point, "first_attempt": first_attempt, "max_attempts": max_attempts, "store": store,
            "answer": str(answer), "env": dict(os.environ), "cwd": os.getcwd(), "path": list(sys.path),
            "log_level": logging.getLogger("airflow_resumable").getEffectiveLevel()})
        server.preload |= set(self.preload)
        replies = server.popen.stdout.fileno()
        started = _reply(replies, None)
        ended = _reply(replies, time.monotonic() + self.timeout)
        if ended is None:  # hung: kill it, as the supervisor would, and take the status
            os.kill(started["pid"], signal.SIGKILL)
            ended = _reply(replies, None)
            return Ended(ended["status"], {"error": "run", "text": f"the attempt did not end in {self.timeout:g}s "
                                           "in a new process; it was killed", "trace": ""})
        data = answer.read_bytes() if answer.exists() else None
        answered = None if data is None else pickle.loads(data)
        if answered is not None:  # the libraries it imported: loaded in the server for the next ones
            server.preload |= set(answered.pop("imported", ()))
        return Ended(ended["status"], answered)

    def close(self) -> None:
        """Remove the answers (the server stays for the next check; :func:`stop_server` stops it)."""
        self._folder.cleanup()


def _reply(fd: int, deadline: float | None) -> Any:
    """The server's next message; None when ``deadline`` passed first.

    Raises:
        RuntimeError: the server process ended.
    """
    if deadline is not None:
        poller = select.poll()  # not select.select(): it refuses a descriptor numbered past 1,024
        poller.register(fd, select.POLLIN)
        if not poller.poll(max(0, math.ceil((deadline - time.monotonic()) * 1000))):
            return None
    message = _receive(fd)
    if message is None:
        raise RuntimeError("the test kit's process server ended unexpectedly (see the output above)")
    return message
