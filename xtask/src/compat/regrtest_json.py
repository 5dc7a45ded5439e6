"""Runs one module of CPython's regression suite under regrtest and writes each test's outcome, one JSON
line per result, as it comes (so a crash or a hang keeps what ran before it).

    python regrtest_json.py MODULE OUT.jsonl [REGRTEST OPTIONS...]

regrtest runs the module exactly as `python -m test MODULE` would (its resources, its environment checks,
its temporary working directory); only its result class is watched. Each line is
`{"id": ..., "outcome": "passed" | "failed" | "skipped", "detail": ...}`: an expected failure counts as
passed (regrtest says OK), an unexpected success as failed, a failing subtest fails its test, and an
error in a class or module fixture is a line of its own (`setUpClass (test.test_x.Case)`), its tests then
never reported. Stdlib only; the interpreter's own `test` package.
"""

import atexit
import json
import sys


def _id(test):
    case = getattr(test, "test_case", None)  # a subtest: its test
    if case is not None:
        test = case
    try:
        return test.id()
    except Exception:
        return str(test)


def _why(err):
    kind, value = err[0], err[1]
    name = getattr(kind, "__name__", str(kind))
    text = "%s: %s" % (name, value)
    return " ".join(text.split())[:300]


def _watch(result_class, out):
    def record(test, outcome, detail=None):
        line = {"id": _id(test), "outcome": outcome}
        if detail:
            line["detail"] = detail
        out.write(json.dumps(line) + "\n")

    def wrap(name, outcome, detail=None):
        original = getattr(result_class, name)

        def method(self, test, *args):
            try:
                record(test, outcome, detail(args) if detail else None)
            except Exception:
                pass
            return original(self, test, *args)

        setattr(result_class, name, method)

    wrap("addSuccess", "passed")
    wrap("addExpectedFailure", "passed")
    wrap("addUnexpectedSuccess", "failed", lambda _: "unexpected success")
    wrap("addFailure", "failed", lambda args: _why(args[0]))
    wrap("addError", "failed", lambda args: _why(args[0]))
    wrap("addSkip", "skipped", lambda args: str(args[0])[:300])
    original_subtest = result_class.addSubTest

    def add_subtest(self, test, subtest, err):
        if err is not None:
            try:
                skipped = issubclass(err[0], __import__("unittest").SkipTest)
                if not skipped:
                    record(test, "failed", "%s: %s" % (subtest._subDescription(), _why(err)))
            except Exception:
                pass
        return original_subtest(self, test, subtest, err)

    result_class.addSubTest = add_subtest


def main():
    module, out_path = sys.argv[1], sys.argv[2]
    options = sys.argv[3:]
    out = open(out_path, "a", buffering=1, encoding="utf-8")
    atexit.register(out.close)
    try:
        from test.libregrtest import testresult
    except ImportError:  # before 3.11: beside test.support
        from test.support import testresult
    _watch(testresult.RegressionTestResult, out)
    from test.libregrtest.main import main as regrtest

    sys.argv = [sys.argv[0], *options, module]
    regrtest()


if __name__ == "__main__":
    main()
