"""The test toolchain's pins: record them, and try the suite against the newest releases on purpose.

    python tools/pins.py freeze   # write constraints/test.txt from this environment (run after the suite passed here)
    python tools/pins.py latest   # a throw-away venv with the newest releases, the suite in it, result in constraints/latest.md

The README's test command and .ci/run install ".[dev]" with ``-c constraints/test.txt``, so a new
release of pytest, numpy, a runtime or a model zoo cannot turn CI red by itself. Users' own
installs stay unpinned: pyproject.toml keeps ranges. torch and torchvision are not pinned here:
``pip install torch torchvision`` takes the builds this machine holds (see README), and pinning
them would make pip fetch another build. Move the pins on purpose: run ``latest``, read
constraints/latest.md, fix what broke, then ``freeze`` in an environment where the suite passed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import re
import subprocess
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "constraints" / "test.txt"
LATEST = REPO / "constraints" / "latest.md"
ROOT = "vitedge"
EXTRAS = ("dev",)
# Installed by `pip install torch torchvision` (the machine's own builds), not by the test extra.
UNPINNED = re.compile(r"^(torch|torchvision|triton|nvidia-.*|cuda-.*)$")
PYTEST = ["-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "-p", "no:cacheprovider"]


def closure(root: str = ROOT, extras: tuple[str, ...] = EXTRAS) -> dict[str, str]:
    """{canonical name: installed version} of everything `pip install root[extras]` needs here, without
    descending into the unpinned packages (torch's own dependencies come with torch)."""
    found: dict[str, str] = {}
    todo: list[tuple[str, tuple[str, ...]]] = [(root, extras)]
    seen: set[tuple[str, tuple[str, ...]]] = set()
    while todo:
        name, wanted = todo.pop()
        if (name, wanted) in seen:
            continue
        seen.add((name, wanted))
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            raise SystemExit(f"pins: {name} is needed but not installed here; install the test extra first "
                             f"(pip install -e '.[dev]')") from None
        if canonicalize_name(name) != ROOT:
            found[canonicalize_name(name)] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            envs = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker is not None and not any(req.marker.evaluate(env) for env in envs):
                continue
            if UNPINNED.match(canonicalize_name(req.name)):
                continue
            todo.append((req.name, tuple(sorted(req.extras))))
    return found


def read_pins(path: Path = CONSTRAINTS) -> dict[str, str]:
    """{canonical name: version} from a constraints file of `name==version` lines."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            if not sep:
                raise SystemExit(f"pins: {path}: '{line}' is not name==version")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def _cpu_isa() -> str:
    try:
        flags = set(next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")).split())
    except (OSError, StopIteration):
        return "unknown"
    return next((f for f in ("amx_int8", "avx512_vnni", "avx_vnni") if f in flags), "avx2, no VNNI" if "avx2" in flags else "no AVX2")


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def freeze(_: argparse.Namespace) -> None:
    pins = closure()
    torch_builds = ", ".join(f"{n} {distribution(n).version}" for n in ("torch", "torchvision") if _installed(n))
    lines = [
        "# The test toolchain the suite was last green with. The README's test command and .ci/run install",
        "# the test extra with `-c constraints/test.txt`; pyproject.toml keeps ranges for users.",
        "# Regenerate on purpose, in an environment where the suite passed: python tools/pins.py freeze",
        f"# Written {dt.date.today().isoformat()}, Python {platform.python_version()}, {platform.machine()};"
        f" not pinned: torch and torchvision (here: {torch_builds or 'none'}) and their CUDA packages.",
    ]
    lines += [f"{name}=={pins[name]}" for name in sorted(pins)]
    CONSTRAINTS.parent.mkdir(exist_ok=True)
    CONSTRAINTS.write_text("\n".join(lines) + "\n")
    print(f"wrote {CONSTRAINTS.relative_to(REPO)}: {len(pins)} pins")


def _installed(name: str) -> bool:
    try:
        distribution(name)
        return True
    except PackageNotFoundError:
        return False


def latest(args: argparse.Namespace) -> None:
    """A venv over this interpreter's packages (so torch is the machine's), the test extra upgraded to
    the newest releases, the suite run there; writes constraints/latest.md. Never touches this environment."""
    venv = Path(args.venv or tempfile.mkdtemp(prefix="vitedge-latest-"))
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    keep = venv / "keep-torch.txt"  # the machine's torch builds stay as they are
    keep.write_text("".join(f"{n}=={distribution(n).version}\n" for n in ("torch", "torchvision") if _installed(n)))
    install = subprocess.run([py, "-m", "pip", "install", "-q", "-U", "--upgrade-strategy", "eager", "-c", str(keep),
                              "-e", f"{REPO}[{','.join(EXTRAS)}]"], capture_output=True, text=True)
    if install.returncode != 0:
        raise SystemExit(f"pins: installing the newest releases failed:\n{install.stderr[-3000:]}")
    versions = subprocess.run([py, "-c", "import json,sys; sys.path.insert(0, 'tools'); import pins; "
                               "print(json.dumps(pins.closure()))"], cwd=REPO, capture_output=True, text=True, check=True)
    import json

    newest = json.loads(versions.stdout)
    started = dt.datetime.now(dt.timezone.utc)
    run = subprocess.run([py, *PYTEST, *args.pytest_args], cwd=REPO, capture_output=True, text=True)
    minutes = (dt.datetime.now(dt.timezone.utc) - started).total_seconds() / 60
    out_lines = run.stdout.splitlines()
    closing = next((ln for ln in reversed(out_lines) if re.search(r"\b(passed|failed|error)", ln)), "(no summary line)")
    failures = [ln for ln in out_lines if ln.startswith(("FAILED", "ERROR"))]
    pins = read_pins()
    moved = [(n, pins.get(n, "(not pinned)"), v) for n, v in sorted(newest.items()) if pins.get(n) != v]
    report = [
        "# The suite against the newest releases",
        "",
        f"`python tools/pins.py latest`, {started:%Y-%m-%d %H:%M} UTC, Python {platform.python_version()}, "
        f"CPU {_cpu_isa()}, {minutes:.1f} min, commit {_commit()}. Exit code {run.returncode}.",
        "",
        f"Closing line: `{closing.strip()}`",
        "",
    ]
    report += ["Failures:", ""] + [f"- `{ln}`" for ln in failures] + [""] if failures else ["No failures.", ""]
    report += ["| package | pinned (constraints/test.txt) | newest |", "|---|---|---|"]
    report += [f"| {n} | {p} | {v} |" for n, p, v in moved] or ["| (none moved) | | |"]
    LATEST.write_text("\n".join(report) + "\n")
    print(f"wrote {LATEST.relative_to(REPO)}: {closing.strip()}; {len(moved)} packages newer than the pins")
    if not args.venv:
        subprocess.run(["rm", "-rf", str(venv)], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("freeze", help="write constraints/test.txt from this environment").set_defaults(func=freeze)
    p = sub.add_parser("latest", help="run the suite against the newest releases, in a throw-away venv")
    p.add_argument("--venv", help="keep the venv at this path instead of a temporary one")
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    p.set_defaults(func=latest)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
