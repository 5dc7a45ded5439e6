"""`cargo xtask compat`'s driver: runs modules of CPython's regression suite, each in a process of its own
(`regrtest_json.py`, its own session: no controlling terminal), and gathers every test's outcome.

The same file runs in both places being compared:

- inside a run, as its code (`runpython run --file regrtest_json.py ... driver.py` with the inputs
  `modules`, `timeout` and `match`): it hands the list of results to the host's tool `compat_result`;
- in a plain process, `python driver.py TIMEOUT MODULE... [--match ID]...`: it prints the list as JSON.

A result: `{"module", "exit", "seconds", "cpu_seconds" (what regrtest and what it waited for took),
"tests": {"passed": [ids], "failed": {id: why}, "skipped":
{id: why}}, "log": the tail of regrtest's output when it did not exit 0, "skipped": why, when regrtest
skipped the whole module}`. `exit` is regrtest's exit code
(0 passed, 2 a test failed, 3 the environment changed, 4 no test ran), or "timeout", or "signal N".
"""

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

RANK = {"skipped": 0, "passed": 1, "failed": 2}


def _bootstrap():
    here = globals().get("__file__")
    if here:
        beside = os.path.join(os.path.dirname(os.path.abspath(here)), "regrtest_json.py")
        if os.path.exists(beside):
            return beside
    return os.path.abspath("regrtest_json.py")


def run_module(module, timeout, match=()):
    """One module under regrtest, killed (its whole session) after `timeout` seconds."""
    work = tempfile.mkdtemp(prefix="compat-%s-" % module)
    out = os.path.join(work, "results.jsonl")
    log_path = os.path.join(work, "regrtest.log")
    # A test that hangs dumps its traceback and ends the module well before the module's own limit.
    command = [sys.executable, _bootstrap(), module, out, "--timeout=%d" % max(60, timeout * 2 // 3)]
    for pattern in match:
        # `!PATTERN`: every test but those (regrtest's --ignore).
        command += ["--ignore", pattern[1:]] if pattern.startswith("!") else ["--match", pattern]
    started = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, cwd=work, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout)
            exit = code if code >= 0 else "signal %d" % -code
        except subprocess.TimeoutExpired:
            exit = "timeout"
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # what the module left running too
        except OSError:
            pass
        proc.wait()
    tests = {}
    try:
        with open(out, encoding="utf-8") as f:
            for line in f:
                try:
                    seen = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a crash
                old = tests.get(seen["id"])
                if old is None or RANK[seen["outcome"]] > RANK[old[0]]:
                    tests[seen["id"]] = (seen["outcome"], seen.get("detail"))
    except OSError:
        pass
    grouped = {"passed": [], "failed": {}, "skipped": {}}
    for test_id, (outcome, detail) in sorted(tests.items()):
        if outcome == "passed":
            grouped["passed"].append(test_id)
        else:
            grouped[outcome][test_id] = detail or ""
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    result = {
        "module": module,
        "exit": exit,
        "seconds": round(time.monotonic() - started, 2),
        "cpu_seconds": round(cpu, 2),
        "tests": grouped,
    }
    with open(log_path, "rb") as f:
        log = f.read().decode("utf-8", "replace")
    if exit != 0:
        result["log"] = log[-3000:]
    for line in log.splitlines():
        # A module regrtest skips as a whole (its import raised SkipTest, or a resource is not enabled).
        if ("%s skipped" % module) in line and not tests:
            result["skipped"] = line.split(" -- ", 1)[-1].strip()[:300]
    shutil.rmtree(work, ignore_errors=True)
    return result


def main(modules, timeout, match=()):
    return [run_module(module, int(timeout), match) for module in modules]


def _cli():
    args = sys.argv[1:]
    match = [args[i + 1] for i, a in enumerate(args) if a == "--match"]
    rest = [a for i, a in enumerate(args) if a != "--match" and (i == 0 or args[i - 1] != "--match")]
    json.dump(main(rest[1:], rest[0], match), sys.stdout)
    sys.stdout.write("\n")


if "modules" in globals():
    # Inside a run: the results go to the host through the harness's tool (an envelope keeps a few KiB).
    compat_result(main(modules, timeout, globals().get("match") or ()))  # noqa: F821 (the run's inputs and tool)
else:
    _cli()
