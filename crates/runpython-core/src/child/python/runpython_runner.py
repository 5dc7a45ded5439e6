"""runpython's runner: the entry point of every interpreter the host starts in the sandboxed child.

The host starts `python -I -S -X utf8 -c "…import runpython_runner" CODE_DIR [MODE ARGS]`, importing this
module from runpython's code directory (so its bytecode is cached). It only chooses the mode; the work is
in the library modules beside it:

- a one-shot run (no mode, or `--site DIR` / `--warm a,b` for an interpreter started ahead of its run):
  `runpython_run.one_shot`, which reads the request on stdin and answers on descriptor 3;
- `--session`: a session's interpreter, `runpython_session.main`;
- `--template`: a template that forks runs, `runpython_template.serve` (runpython-sandbox's: it takes each
  run's sandbox, then hands the run to `runpython_run.forked_main`).

Plain `python3 runpython_runner.py 3>result.json <request` works too (how the Python-side tests drive it).
"""

import posix
import sys

if __name__ == "__main__":  # run as a script (the tests): its siblings beside it, and known by its name
    sys.path.insert(0, __file__.rpartition("/")[0] or ".")
    sys.modules.setdefault("runpython_runner", sys.modules["__main__"])

import runpython_run


def main():
    posix.set_inheritable(runpython_run.RESULT_FD, False)  # the code's subprocesses must not hold the result pipe
    try:
        posix.set_inheritable(runpython_run.BRIDGE_FD, False)  # nor the tool bridge
    except OSError:
        pass
    if "--session" in sys.argv[2:]:
        import runpython_session

        return runpython_session.main()
    if "--template" in sys.argv[2:]:
        # A template: it forks runs, each of which comes back to `runpython_run.forked_main`.
        import runpython_template

        return runpython_template.serve(sys.argv[2:], runpython_run.warm_up, runpython_run.forked_main)
    runpython_run.warm_up(sys.argv[2:])
    runpython_run.one_shot()


if __name__ in ("__main__", "runpython_runner"):
    main()
