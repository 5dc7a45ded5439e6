"""Tests of the template's parts that need no privilege (`src/template/runpython_template.py` and
`runpython_forked.py`), with plain `python3` and the stdlib.

    python3 -m unittest discover -s crates/runpython-sandbox/tests/python -t crates/runpython-sandbox/tests/python

What needs namespaces (a fork taking its sandbox) is tested from Rust (`tests/tests/templates.rs`, and the
hostile suites with `RUNPYTHON_TEMPLATES=require`). Each test here runs in a child interpreter of its own:
the template's code closes descriptors and forks.
"""

import pathlib
import subprocess
import sys
import textwrap
import unittest

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "template"
DEADLINE = 60

# The template module alone: it imports nothing of runpython's (the runner hands it what a forked run
# continues into).
PRELUDE = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, %r)
    import runpython_forked as forked
    import runpython_template as template
    """
    % (str(SRC),)
)


def child(code):
    """Runs `code` after the prelude in a fresh interpreter; its stdout, stripped."""
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", PRELUDE + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    if proc.returncode != 0:
        raise AssertionError("the child failed (%d): %s" % (proc.returncode, proc.stderr))
    return proc.stdout.strip()


class Quiesce(unittest.TestCase):
    def test_a_thread_left_running_is_named(self):
        out = child(
            """
            import threading, time
            threading.Thread(target=time.sleep, args=(30,), name="warm-pool", daemon=True).start()
            t = template.Template.__new__(template.Template)
            print(t.quiesce())
            """
        )
        # A Python thread's kernel name is the process's (`python3`): one is reported.
        self.assertNotEqual(out, "[]")
        self.assertEqual(len(eval(out)), 1, out)

    def test_a_single_threaded_interpreter_may_be_forked(self):
        out = child(
            """
            t = template.Template.__new__(template.Template)
            print(t.quiesce())
            """
        )
        self.assertEqual(out, "[]")


class Descriptors(unittest.TestCase):
    def test_named_descriptors_keep_their_order_and_repeats(self):
        out = child(
            """
            fds = forked.Fds(["status", "cgroup", "landlock", "cgroup"], [7, 8, 9, 10])
            print(fds.one("status"), fds.one("landlock"), fds.all("cgroup"), fds.one("missing"))
            """
        )
        self.assertEqual(out, "7 9 [8, 10] None")

    def test_keep_only_closes_every_other_descriptor_above_stderr(self):
        out = child(
            """
            opened = [os.open("/dev/null", os.O_RDONLY) for _ in range(6)]
            forked.keep_only(forked.Sys(), [opened[1], opened[4]])
            def is_open(fd):
                try:
                    os.fstat(fd)
                    return True
                except OSError:
                    return False
            print([fd for fd in opened if is_open(fd)], [fd for fd in (0, 1, 2) if is_open(fd)])
            print(opened[1], opened[4])
            """
        )
        kept, expected = out.splitlines()
        self.assertEqual(kept, "[%s] [0, 1, 2]" % ", ".join(expected.split()))


class Reports(unittest.TestCase):
    def test_a_failed_step_is_reported_by_name_and_errno(self):
        out = child(
            """
            r, w = os.pipe()
            forked._report(w, forked.StepFailed("mount_proc", 13))
            print(os.read(r, 4096).decode())
            """
        )
        self.assertTrue(out.startswith("E{"), out)
        self.assertIn('"step":"mount_proc"', out)
        self.assertIn('"errno":13', out)


if __name__ == "__main__":
    unittest.main()
