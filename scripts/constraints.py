"""Generate the constraints files: one per (Airflow minor, Python) pair, never edited by hand.

    python3 scripts/constraints.py 3.1.8 3.11     # writes constraints/airflow-3.1-py3.11.txt
    python3 scripts/constraints.py --all          # every file in constraints/, at its own Airflow
    python3 scripts/constraints.py --interpreter 3.12   # print pyenv's Python 3.12 (exit 1 if none)

Each file comes from a fresh venv made with pyenv's interpreter for that Python
(``$PYENV_ROOT/versions/<X.Y.Z>/bin/python``, the newest patch release there). The package, with
every extra setup.cfg declares (read from setup.cfg, so a new extra is included on the next run),
is resolved against the given Airflow by uv's resolver (pinned, installed into that venv), which
keeps today's pins where they still resolve: it prefers the pins of the file being regenerated (for
a new file, the newest Airflow's file for that Python, else for Python 3.11). Airflow's own packages
always come from the requested version. pip then installs exactly that set into the fresh venv (its
own resolver and ``pip check`` confirm it), and ``pip freeze`` of the venv is the file, under a
header that says how it was made.

Only the standard library is needed (it runs before any venv exists). ``make constraints`` runs
``--all``; ``make constraints AIRFLOW=3.2.2 FOR_PYTHON=3.12`` makes or refreshes one file.
"""

from __future__ import annotations

import argparse
import configparser
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIRECTORY = ROOT / "constraints"
#: The pip every venv of this repository uses (the Makefile's too).
PIP = "pip==26.3"
NAME = re.compile(r"^airflow-(?P<airflow>\d+\.\d+)-py(?P<python>\d+\.\d+)\.txt$")
#: Airflow's own distributions: their versions follow the requested Airflow, never a seed's pins.
AIRFLOW_FAMILY = re.compile(r"^apache-airflow(-core|-task-sdk)?$")
#: The resolver, pinned: the files do not change with its releases.
UV = "uv==0.13.8"
#: Caps on Airflow's own dependencies for one Airflow minor, where a later release of a dependency
#: breaks that Airflow (each file's header names its caps and why). Airflow's own constraints file
#: for the release predates the breaking release, so it pins a version below the cap as well.
CAPS: dict[str, dict[str, tuple[str, str]]] = {
    "3.2": {
        "svcs": ("<26.2", "svcs 26.2's FastAPI lifespan removes app.state.svcs_registry when it exits, and "
                 "Airflow 3.2's dag.test() exits it (it drops the in-process Execution API but keeps its "
                 "transport): every later request answers 500. Airflow 3.3 keeps the API alive"),
    },
}


def caps_for(airflow: str) -> dict[str, tuple[str, str]]:
    """The caps (name -> (specifier, why)) that apply to ``airflow``'s minor."""
    return CAPS.get(minor(airflow), {})


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def path_for(airflow: str, python: str) -> Path:
    """``constraints/airflow-<major.minor>-py<major.minor>.txt``."""
    return DIRECTORY / f"airflow-{minor(airflow)}-py{minor(python)}.txt"


def minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def interpreter(python: str) -> Path:
    """pyenv's newest ``python`` binary for ``python`` (``3.12``), or SystemExit naming what is missing."""
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    found = []
    for candidate in (root / "versions").glob(f"{minor(python)}.*/bin/python"):
        patch = candidate.parent.parent.name[len(minor(python)) + 1:]
        if patch.isdigit():
            found.append((int(patch), candidate))
    if not found:
        raise SystemExit(
            f"no Python {minor(python)} interpreter: looked for {root}/versions/{minor(python)}.*/bin/python. "
            f"Install it with `pyenv install {minor(python)}` (or set PYENV_ROOT), then run this again"
        )
    return max(found)[1]


def extras() -> list[str]:
    """Every extra setup.cfg declares, sorted."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    return sorted(parser["options.extras_require"]) if parser.has_section("options.extras_require") else []


def pins(path: Path) -> dict[str, str]:
    """A constraints file's ``name==version`` lines, by canonical name."""
    return pins_of(path.read_text())


def version_of(pin: str) -> str:
    return pin.partition("==")[2]


def pins_of(text: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            found[canonical(name)] = f"{name.strip()}=={version.strip()}"
    return found


def seed_for(target: Path, python: str) -> Path | None:
    """The pins to start from: the target's own, else the newest Airflow's for this Python, else for 3.11."""
    if target.exists():
        return target
    for wanted in (minor(python), "3.11"):
        same = sorted((p for p in DIRECTORY.glob(f"airflow-*-py{wanted}.txt") if NAME.match(p.name)),
                      key=lambda p: tuple(int(x) for x in NAME.match(p.name)["airflow"].split(".")))  # type: ignore[index]
        if same:
            return same[-1]
    return None


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, text=True, capture_output=True, **kwargs)  # type: ignore[call-overload]


def resolve(airflow: str, python: str, *, seed: Path | None) -> tuple[str, str]:
    """Resolve, install into a fresh venv and freeze it: (the frozen lines, the exact Python version).

    uv's resolver picks the versions, preferring the seed's pins (an existing output file's pins are
    uv's preferences); pip then installs exactly those into the fresh venv, which checks them with
    pip's own resolver on this interpreter, and the freeze of that venv is the result.
    """
    exe = interpreter(python)
    kept = {n: p for n, p in (pins(seed) if seed else {}).items() if not AIRFLOW_FAMILY.match(n)}
    kept.pop("airflow-resumable", None)
    wanted = extras()
    with tempfile.TemporaryDirectory(prefix="resumable-constraints-") as tmp:
        venv = Path(tmp) / "venv"
        _check(run([str(exe), "-m", "venv", str(venv)]), f"{exe} -m venv")
        py = str(venv / "bin" / "python")
        _check(run([py, "-m", "pip", "install", "--quiet", PIP, UV]), f"pip install {UV}")
        # A copy of the source tree: the builds leave no egg-info or build/ in the repository.
        source = Path(tmp) / "src"
        shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
            ".git", ".venv", ".venvs", "*.egg-info", "build", "dist", "__pycache__", ".test-logs", ".airflow*",
            "screenshots"))
        airflow_pin = Path(tmp) / "airflow.txt"
        airflow_pin.write_text(f"apache-airflow=={airflow}\n"
                               + "".join(f"{name}{spec}\n" for name, (spec, _) in caps_for(airflow).items()))
        compiled = Path(tmp) / "compiled.txt"
        compiled.write_text("\n".join(sorted(kept.values())) + "\n")  # uv prefers these
        print(f"  resolving with uv: Airflow {airflow} on {exe}, preferring {len(kept)} pins", flush=True)
        _check(run([str(venv / "bin" / "uv"), "pip", "compile", str(source / "setup.cfg"),
                    *(f"--extra={e}" for e in wanted), "--constraint", str(airflow_pin), "--python", py,
                    "--output-file", str(compiled), "--no-header", "--no-annotate", "--quiet"],
                   env={**os.environ, "UV_CACHE_DIR": str(Path.home() / ".cache" / "uv")}), "uv pip compile")
        print("  installing them with pip into the fresh venv", flush=True)
        target = f"{source}[{','.join(wanted)}]" if wanted else str(source)
        _check(run([py, "-m", "pip", "install", "--quiet", "--progress-bar", "off", "-c", str(compiled), target]),
               "pip install")
        _check(run([py, "-m", "pip", "check"]), "pip check")
        frozen = run([py, "-m", "pip", "freeze", "--exclude-editable"]).stdout.splitlines()
        version = run([py, "-c", "import platform; print(platform.python_version())"]).stdout.strip()
    lines = sorted((line for line in frozen if line and _name(line) not in ("airflow-resumable", "uv")), key=_name)
    return "\n".join(lines) + "\n", version


def _name(line: str) -> str:
    """The canonical name of a ``pip freeze`` line (``name==version`` or ``name @ url``)."""
    return canonical(re.split(r"[=@ ]", line, maxsplit=1)[0])


def _check(result: subprocess.CompletedProcess[str], what: str) -> None:
    if result.returncode:
        errors = "\n".join(line for line in (result.stdout + result.stderr).splitlines()
                           if not line.startswith("WARNING: Location"))
        raise SystemExit(f"{what} failed (exit {result.returncode}):\n{errors[-6000:]}")


def generate(airflow: str, python: str) -> Path:
    target = path_for(airflow, python)
    seed = seed_for(target, python)
    print(f"{target.relative_to(ROOT)}: Airflow {airflow}, Python {python}, starting from "
          f"{seed.relative_to(ROOT) if seed else 'no pins'}", flush=True)
    before = pins(seed) if seed else {}
    body, version = resolve(airflow, python, seed=seed)
    after = pins_of(body)
    changed = sorted(n for n in before if n in after and version_of(before[n]) != version_of(after[n])
                     and not AIRFLOW_FAMILY.match(n))
    header = (
        f"# Constraints for airflow-resumable: Airflow {airflow} on Python {version}, with the extras\n"
        f"# {', '.join(extras())} (all of setup.cfg's): the freeze of a fresh venv made by scripts/constraints.py\n"
        f"# (uv resolved, keeping the previous pins where they resolve; pip installed). Never edit it by hand.\n"
        f"# Regenerate: python3 scripts/constraints.py {airflow} {minor(python)}   (make constraints: every file)\n"
    ) + "".join(f"# Capped by scripts/constraints.py's CAPS: {name}{spec}: {why}.\n"
                for name, (spec, why) in caps_for(airflow).items())
    DIRECTORY.mkdir(exist_ok=True)
    target.write_text(header + body)
    moved = ", ".join(f"{before[n]} -> {version_of(after[n])}" for n in changed)
    print(f"wrote {target.relative_to(ROOT)}: {len(after)} pins; of the {len(before)} it started from, "
          f"{len(changed)} moved to resolve" + (f" ({moved})" if moved else ""), flush=True)
    return target


def airflow_of(path: Path) -> str:
    """The Airflow version a constraints file pins."""
    version = pins(path).get("apache-airflow", "").partition("==")[2]
    if not version:
        raise SystemExit(f"{path.relative_to(ROOT)} pins no apache-airflow; regenerate it with a version: "
                         f"python3 scripts/constraints.py AIRFLOW PYTHON")
    return version


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/constraints.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("airflow", nargs="?", help="the Airflow version, e.g. 3.1.8")
    parser.add_argument("python", nargs="?", help="the Python version, e.g. 3.11")
    parser.add_argument("--all", action="store_true", help="regenerate every file in constraints/")
    parser.add_argument("--interpreter", metavar="PYTHON", help="print pyenv's interpreter for PYTHON and exit")
    args = parser.parse_args(argv)
    if args.interpreter:
        print(interpreter(args.interpreter))
        return 0
    if args.all:
        files = sorted(p for p in DIRECTORY.glob("airflow-*-py*.txt") if NAME.match(p.name))
        if not files:
            raise SystemExit("constraints/ has no airflow-<minor>-py<version>.txt file to regenerate")
        for path in files:
            match = NAME.match(path.name)
            assert match is not None
            generate(airflow_of(path), match["python"])
        return 0
    if not (args.airflow and args.python):
        parser.error("give AIRFLOW and PYTHON (e.g. 3.1.8 3.11), or --all")
    generate(args.airflow, args.python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
