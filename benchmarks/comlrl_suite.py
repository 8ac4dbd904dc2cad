"""Run the test suite of the existing library (comlrl 1.4.3) against comlrl_nb, with only the import changed.

The library's tests are its specification of public behaviour. This script never commits them: it takes them from
the library's sdist at run time (downloaded with pip into a cache directory, or given with --sdist), copies them to a
temporary directory, and runs them under pytest with a test-only plugin that maps every `comlrl.X.Y` module path to
`comlrl_nb.X.Y` (a proxy module per path). A `wandb` stand-in with the real `wandb.init` signature is provided when
wandb is not installed (the library's tests import it at module level).

    PYTHONPATH=$PWD /work/venv/bin/python benchmarks/comlrl_suite.py                 # whole suite, summary + JSON
    PYTHONPATH=$PWD /work/venv/bin/python benchmarks/comlrl_suite.py -k test_utils   # a subset (pytest -k)

Output: counts (collected / passed / failed / errors / collection errors) per test file and in total, and with
--out FILE the per-test outcomes as JSON (for the gap list).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION = "1.4.3"
CACHE = Path(os.environ.get("COMLRL_SDIST_CACHE", "/tmp/comlrl_sdist"))

PLUGIN = r'''
"""Test-only: `comlrl.X` -> `comlrl_nb.X` (proxy modules), and a wandb stand-in when wandb is absent."""
import importlib, importlib.abc, importlib.machinery, importlib.util, os, sys, types


STUB = os.environ.get("COMLRL_SUITE_STUB") == "1"
MISSING = set()


def _get(target, alias, name):
    "A name of the library's module: ours, or (with COMLRL_SUITE_STUB=1) a placeholder that fails when used."
    try:
        return getattr(target, name)
    except AttributeError:
        if not STUB or name.startswith("__"):
            raise
    MISSING.add(f"{alias}.{name}")

    if name[:1].islower():                     # a function: identity on its first argument (enough to import helpers)
        def missing(*a, **k):
            if a:
                return a[0]
            raise NotImplementedError(f"comlrl_nb has no {alias}.{name}")
        return missing

    class Missing:
        def __init__(self, *a, **k):
            raise NotImplementedError(f"comlrl_nb has no {alias}.{name}")
    Missing.__name__ = name
    return Missing


def pytest_terminal_summary(terminalreporter):
    if MISSING:
        terminalreporter.write_line("STUBBED " + " ".join(sorted(MISSING)))


class _Alias(importlib.abc.Loader):
    def __init__(self, target):
        self.target = target

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        target = self.target
        mod.__getattr__ = lambda name: _get(target, spec.name, name)
        mod.__path__ = []                      # a package, so `comlrl.a.b` can be found below it
        mod.__comlrl_nb_target__ = target.__name__
        return mod

    def exec_module(self, module):
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "comlrl" and not fullname.startswith("comlrl."):
            return None
        ours = "comlrl_nb" + fullname[len("comlrl"):]
        try:
            mod = importlib.import_module(ours)
        except ModuleNotFoundError as e:
            if STUB:                           # a module comlrl_nb lacks: every name in it is a placeholder
                MISSING.add(fullname + " (module)")
                return importlib.util.spec_from_loader(fullname, _Alias(types.ModuleType(ours)), is_package=True)
            raise ModuleNotFoundError(f"{fullname} -> {ours}: {e}", name=fullname) from None
        return importlib.util.spec_from_loader(fullname, _Alias(mod), is_package=True)


sys.meta_path.insert(0, _Finder())

try:
    import wandb  # noqa: F401
except ImportError:
    wandb = types.ModuleType("wandb")
    wandb.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    wandb.__comlrl_nb_standin__ = True
    wandb.runs = []

    class _Run:
        def __init__(self, **kw):
            self.kw, self.logged, self.finished = kw, [], False
            self.id = kw.get("id") or "standin"

        def log(self, data, step=None, commit=None):
            self.logged.append(dict(data))

        def finish(self, exit_code=None, quiet=None):
            self.finished = True

    def init(entity=None, project=None, dir=None, id=None, name=None, notes=None, tags=None, config=None,
             config_exclude_keys=None, config_include_keys=None, allow_val_change=None, group=None, job_type=None,
             mode=None, force=None, anonymous=None, reinit=None, resume=None, resume_from=None, fork_from=None,
             save_code=None, tensorboard=None, sync_tensorboard=None, monitor_gym=None, settings=None):
        run = _Run(**{k: v for k, v in locals().items() if v is not None})
        wandb.run = run
        wandb.runs.append(run)
        return run

    def log(data, step=None, commit=None):
        wandb.run.log(data, step, commit)

    def finish(exit_code=None, quiet=None):
        if getattr(wandb, "run", None) is not None:
            wandb.run.finish()
        wandb.run = None

    wandb.init, wandb.log, wandb.finish, wandb.run, wandb.Run = init, log, finish, None, _Run
    sys.modules["wandb"] = wandb
'''


def sdist(path: str | None) -> Path:
    "The library's sdist: --sdist, else the cache, else `pip download` (the package registry is the only network)."
    if path:
        return Path(path)
    hit = CACHE / f"comlrl-{VERSION}.tar.gz"
    if not hit.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-q",
                        f"comlrl=={VERSION}", "-d", str(CACHE)], check=True)
    return hit


def extract_tests(archive: Path, dest: Path) -> Path:
    "Copy the sdist's tests/ (and nothing else) into dest."
    with tarfile.open(archive) as tf:
        members = [m for m in tf.getmembers() if f"comlrl-{VERSION}/tests/" in m.name and m.isfile()]
        if not members:
            raise SystemExit(f"{archive} has no tests/ directory; is it the comlrl {VERSION} sdist?")
        for m in members:
            m.name = m.name.split("/tests/", 1)[1]
            tf.extract(m, dest, filter="data")
    (dest / "_comlrl_alias.py").write_text(PLUGIN)
    return dest


def outcomes(xml: Path) -> dict:
    "test id -> (outcome, message) from pytest's JUnit XML."
    res = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        tid = f"{case.get('classname')}::{case.get('name')}"
        out, msg = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                out, msg = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag], (el.get("message") or "")
                break
        res[tid] = (out, msg[:300])
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sdist", help="path to comlrl-1.4.3.tar.gz (default: download/cache)")
    ap.add_argument("-k", default=None, help="pytest -k expression")
    ap.add_argument("--out", default=None, help="write per-test outcomes as JSON here")
    ap.add_argument("--stub-missing", action="store_true",
                    help="stand in for library names comlrl_nb lacks (placeholders that fail when used), to see the rest")
    ap.add_argument("pytest_args", nargs="*")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="comlrl_suite_") as tmp:
        tests = extract_tests(sdist(a.sdist), Path(tmp) / "tests")
        xml = Path(tmp) / "junit.xml"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
               "COMLRL_SUITE_STUB": "1" if a.stub_missing else "0"}
        cmd = [sys.executable, "-m", "pytest", str(tests), "-q", "-p", "no:cacheprovider", "-p", "_comlrl_alias",
               "--continue-on-collection-errors", "-o", "addopts=", f"--junitxml={xml}", "--tb=line", "-rN"]
        if a.k:
            cmd += ["-k", a.k]
        proc = subprocess.run(cmd + a.pytest_args, cwd=tmp, env=env, capture_output=True, text=True)
        lines = proc.stdout.strip().splitlines()
        tail = lines[-1:]
        stubbed = [l for l in lines if l.startswith("STUBBED ")]
        if not lines or (not xml.exists() and proc.returncode):
            print(proc.stdout[-3000:], proc.stderr[-3000:])
        res = outcomes(xml) if xml.exists() else {}
    per_file = defaultdict(Counter)
    for tid, (out, _) in res.items():
        per_file[tid.split("::")[0].split(".")[0]][out] += 1
    total = Counter(out for out, _ in res.values())
    coll_err = sum(1 for tid, (out, _) in res.items() if out == "error" and tid.split("::")[1] in ("", "None"))
    print(f"{'file':38s} {'passed':>7s} {'failed':>7s} {'error':>7s} {'skipped':>7s}")
    for f in sorted(per_file):
        c = per_file[f]
        print(f"{f:38s} {c['passed']:7d} {c['failed']:7d} {c['error']:7d} {c['skipped']:7d}")
    print(f"TOTAL collected={len(res)} passed={total['passed']} failed={total['failed']} error={total['error']} "
          f"skipped={total['skipped']} (collection errors among errors: {coll_err}); pytest: {' '.join(tail)}")
    for l in stubbed:
        print(l)
    if a.out:
        Path(a.out).write_text(json.dumps({k: list(v) for k, v in sorted(res.items())}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
