"""`import feplb` fails at import, with the command that works, where the extension does not
load; `import feplb.torch` does not need the extension."""

import os
import subprocess
import sys

from conftest import REPO


def python_run(code, pythonpath):
    env = dict(os.environ, PYTHONPATH=pythonpath, PYTHONDONTWRITEBYTECODE="1")
    # From the file system's root: `python -c` puts the working directory first on sys.path.
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd="/")


def built_package():
    import feplb  # the tested build's

    return os.path.dirname(os.path.dirname(os.path.abspath(feplb.__file__)))


def test_an_interpreter_without_numpy_gets_the_command_at_import():
    # What a Python without numpy (or built for another version) sees: the import itself fails.
    r = python_run("import sys; sys.modules['numpy'] = None; import feplb", built_package())
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: feplb did not load in "), last
    with open(os.path.join(built_package(), "feplb", "_built_for.txt")) as f:
        built_for = f.read().strip()
    assert f"run `PYTHONPATH={built_package()} {built_for}`" in last, last


def test_the_source_tree_alone_says_to_build():
    # python/ of the repository has no extension: import fails at once, naming what to run.
    r = python_run("import feplb", str(REPO / "python"))
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: feplb did not load"), last
    assert "scripts/build" in last or "scripts/python" in last, last


def test_feplb_torch_does_not_need_the_extension():
    # Without torch, importing feplb.torch fails on torch, not on the planning extension.
    r = python_run("import sys; sys.modules['numpy'] = None; import feplb.torch", str(REPO / "python"))
    assert "feplb did not load" not in r.stderr, r.stderr


def run_in_repo_root(pythonpath):
    """`python3 -c 'import feplb; feplb.plan'` from the repository's root, where Python also sees
    the C++ source folder feplb/."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-s", "-c", "import feplb; print(feplb.plan.__module__)"],
                          capture_output=True, text=True, env=env, cwd=str(REPO))


def test_from_the_repository_root_the_package_is_found_or_named():
    # With the package on the path: the C++ folder hands the import over to it.
    r = run_in_repo_root(built_package())
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "feplb._plan"
    # Without it: a clear ImportError naming what to run, not an empty namespace package.
    r = run_in_repo_root(None)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: feplb: Python found the C++ source folder"), last
    assert "scripts/python" in last and "scripts/install-python" in last, last
