"""Do two build outputs hold the same bundles, apart from what a clock or a path decides?

    python tools/bundle_diff.py OLD NEW

OLD and NEW are `vitedge build -o` folders (one bundle, or one sub-folder per target). Used to
show that a refactor changed no output (issue 27: "the same bundles come out, apart from
timestamps"); build both with a fresh `--cache-dir` each, so that neither reads the other's
calibration.

What is compared:
- every artifact (ONNX, OpenVINO IR, plans, calibration tables: any file that is not JSON,
  Markdown, XML reports or an image) byte for byte, by SHA-256;
- `manifest.json` and `report/validation.json` as JSON, after dropping the keys a clock, the
  machine's load or the checkout's location decide (timestamps, durations, latency figures,
  absolute source paths; a gate row on speed or latency keeps only its name; "in 4.0 s" inside a
  sentence is masked);
- the set of files: one present on one side only is a difference.
Not compared: report.md, summary.md, junit.xml and latency.png, which are renderings of the
JSON above plus timings.

Exit 0 when nothing differs, 1 with one line per difference otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

RENDERINGS = {"report.md", "summary.md", "junit.xml", "latency.png"}
# Keys whose value a clock, the machine's load or the checkout's path decides.
VOLATILE = re.compile(r"(created|time|timestamp|seconds|duration|elapsed|latency|_ms$|^ms$|p50|p90|p99|"
                      r"throughput|speedup|wall|fps|^source$|path|host|peak_rss|memory|rss)", re.IGNORECASE)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# Gate rows that a clock decides (speed and latency limits), by their name.
TIMED_GATE_ROW = re.compile(r"speed|latency|p99|fps", re.IGNORECASE)
# "... in 4.0 s" inside a sentence.
TIMED_PHRASE = re.compile(r"\bin \d+(\.\d+)? ?(s|ms|min)\b")


def _stable(value: Any) -> Any:
    if isinstance(value, dict):
        if TIMED_GATE_ROW.search(str(value.get("name", ""))) and "passed" in value:
            return {"name": value["name"], "timed": True}
        return {k: _stable(v) for k, v in value.items() if not VOLATILE.search(str(k))}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    if isinstance(value, str):
        return TIMED_PHRASE.sub("in <time>", value)
    return value


def _json_differences(old: Any, new: Any, where: str) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            if key not in old or key not in new:
                out.append(f"{where}.{key}: only in {'new' if key in new else 'old'}")
            else:
                out += _json_differences(old[key], new[key], f"{where}.{key}")
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in _json_differences(a, b, f"{where}[{i}]")]
    return [] if old == new else [f"{where}: {str(old)[:80]} != {str(new)[:80]}"]


def compare(old_root: Path, new_root: Path) -> list[str]:
    old_files = {p.relative_to(old_root) for p in old_root.rglob("*") if p.is_file()}
    new_files = {p.relative_to(new_root) for p in new_root.rglob("*") if p.is_file()}
    differences = [f"{rel}: only in {'new' if rel in new_files else 'old'}" for rel in sorted(old_files ^ new_files)]
    for rel in sorted(old_files & new_files):
        if rel.name in RENDERINGS:
            continue
        old, new = old_root / rel, new_root / rel
        if rel.suffix == ".json":
            differences += _json_differences(_stable(json.loads(old.read_text())),
                                             _stable(json.loads(new.read_text())), str(rel))
        elif _digest(old) != _digest(new):
            differences.append(f"{rel}: bytes differ")
    return differences


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not all(Path(a).is_dir() for a in argv):
        print("usage: python tools/bundle_diff.py OLD_OUTPUT_DIR NEW_OUTPUT_DIR (two existing folders)", file=sys.stderr)
        return 2
    differences = compare(Path(argv[0]), Path(argv[1]))
    for line in differences:
        print(line)
    files = sum(1 for p in Path(argv[1]).rglob("*") if p.is_file())
    print(f"{len(differences)} difference(s) over {files} file(s)", file=sys.stderr)
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
