#!/usr/bin/env python3
"""Runs every shell and Python code block of README.md and docs/*.md (and of docs/results/*.md
where they have any) as a whole program, as a reader would paste it, twice in a row in the same
directory (a reader runs an example again); fails on a block that exits non-zero either time,
naming the file and line. A C++ block named after a program of tests/consumer (```cpp NAME) must
be exactly the part of tests/consumer/NAME.cc between its two `// [NAME]` lines (unindented):
that program is compiled against the installed package and run by the install test.

    run_blocks.py --build BUILD_DIR --scratch DIR [FILE.md ...]

Blocks are fenced with ```sh, ```bash or ```shell (run with bash -e), or ```python (run with
scripts/python: the interpreter scripts/build built the module for, the module on PYTHONPATH).
Other blocks (json, cmake, output without an info string, C++ without a program's name) are not
programs and are not run.

A block that cannot run here says so on the line right before its fence, with the reason:

    <!-- doc-test: skip: needs a GPU -->

Each block runs in a fresh directory whose entries are links to the repository's (so `data/...`,
`scripts/...` and `build/bin/feplb` work as in a checkout, `build` being the tested build), and
where the files a block writes stay out of the repository. The blocks are meant to be quick (the
whole run takes a few seconds); a block is stopped after --timeout seconds.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)\s*([\w-]*)(.*)$")
SKIP = re.compile(r"^\s*<!--\s*doc-test:\s*skip:\s*(.+?)\s*-->\s*$")
SHELL = {"sh", "bash", "shell"}
PYTHON = {"python", "py"}


def blocks_of(path: pathlib.Path):
    """(line, language, name, code, skip reason or None) of every fenced block of a Markdown
    file; `name` is the word after the language (```cpp lifecycle), or ""."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang, name = m.group(1), m.group(2), m.group(3).lower(), m.group(4)
        skip = SKIP.match(lines[i - 1]) if i > 0 else None
        start = i + 1
        j = start
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        code = "\n".join(l[len(indent):] if l.startswith(indent) else l for l in lines[start:j])
        out.append((start, lang, name, code + "\n", skip.group(1) if skip else None))
        i = j + 1
    return out


def scratch_dir(root: pathlib.Path, build: pathlib.Path, n: int) -> pathlib.Path:
    """A fresh directory whose entries link to the repository's, with `build` the tested build."""
    d = root / f"block-{n}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    for entry in REPO.iterdir():
        if entry.name == ".git" or entry.name.startswith("build"):
            continue
        (d / entry.name).symlink_to(entry)
    (d / "build").symlink_to(build)
    return d


def consumer_excerpt(name: str) -> str | None:
    """The part of tests/consumer/NAME.cc between its two `// [NAME]` lines, unindented as the
    first of them; None if there is no such program or part."""
    src = REPO / "tests" / "consumer" / f"{name}.cc"
    if not src.is_file():
        return None
    lines = src.read_text(encoding="utf-8").splitlines()
    marks = [i for i, l in enumerate(lines) if l.strip() == f"// [{name}]"]
    if len(marks) != 2:
        return None
    indent = len(lines[marks[0]]) - len(lines[marks[0]].lstrip())
    part = [l[indent:] if l.startswith(" " * indent) else l.lstrip() for l in lines[marks[0] + 1:marks[1]]]
    return "\n".join(part) + "\n"


def python_module_built(build: pathlib.Path) -> bool:
    package = build / "python" / "feplb"
    return (package / "_built_for.txt").is_file() and any(package.glob("_feplb*.so"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True, type=pathlib.Path)
    ap.add_argument("--scratch", required=True, type=pathlib.Path)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("files", nargs="*", type=pathlib.Path)
    args = ap.parse_args()
    build = args.build.resolve()
    files = args.files or [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
                           *sorted((REPO / "docs" / "results").glob("*.md"))]
    env = dict(os.environ, BUILD_DIR=str(build), PYTHONDONTWRITEBYTECODE="1")
    has_python = python_module_built(build)
    ran = skipped = 0
    failures = []
    t_all = time.monotonic()
    for md in files:
        rel = md.resolve().relative_to(REPO)
        for line, lang, name, code, skip in blocks_of(md):
            where = f"{rel}:{line} ({lang})"
            if lang in {"cpp", "c++"} and name:
                want = consumer_excerpt(name)
                ran += 1
                if want is None:
                    failures.append(where)
                    print(f"FAIL {where}: no part marked // [{name}] in tests/consumer/{name}.cc",
                          file=sys.stderr)
                elif want != code:
                    failures.append(where)
                    print(f"FAIL {where}: differs from tests/consumer/{name}.cc between its "
                          f"// [{name}] lines (copy that part, unindented)", file=sys.stderr)
                else:
                    print(f"ok   {where}: tests/consumer/{name}.cc's part (compiled by the install test)")
                continue
            if lang not in SHELL | PYTHON:
                continue
            if skip is None and lang in PYTHON and not has_python:
                skip = "the Python module is not built in this build"
            if skip is not None:
                print(f"skip {where}: {skip}")
                skipped += 1
                continue
            d = scratch_dir(args.scratch, build, ran)
            if lang in SHELL:
                (d / "block.sh").write_text(code)
                cmd = ["bash", "-e", "-o", "pipefail", "block.sh"]
            else:
                (d / "block.py").write_text(code)
                cmd = [str(REPO / "scripts" / "python"), "block.py"]
            for attempt in ("", " (run again)"):
                t0 = time.monotonic()
                try:
                    r = subprocess.run(cmd, cwd=d, env=env, capture_output=True, text=True,
                                       timeout=args.timeout, stdin=subprocess.DEVNULL)
                    rc, output = r.returncode, r.stdout + r.stderr
                except subprocess.TimeoutExpired as e:
                    rc, output = "timeout", f"stopped after {args.timeout} s\n{e.stdout or ''}"
                seconds = time.monotonic() - t0
                print(f"{'ok  ' if rc == 0 else 'FAIL'} {where}{attempt} in {seconds:.1f} s")
                if rc != 0:
                    failures.append(where + attempt)
                    print(f"--- {where}{attempt}: exit {rc}; the block:\n{code}--- its output:\n{output}",
                          file=sys.stderr)
                    break
            ran += 1
    print(f"{ran} blocks run, {skipped} skipped, {len(failures)} failed "
          f"in {time.monotonic() - t_all:.1f} s")
    if ran == 0:
        print("no block ran: nothing was tested", file=sys.stderr)
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
