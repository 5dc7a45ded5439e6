"""Temporary timestamps in a copy of runpython's code directory, for docs/notes/chart-run-profile.md.

    python3 instrument.py DIR

DIR is a copy of the code directory (`~/.cache/runpython/py-<digest>`) under a private
`$XDG_CACHE_HOME/runpython/`: the host uses a code directory that exists as it is, so a host run with
that `XDG_CACHE_HOME` runs these patched modules and no one else's runs do. Each mark records
CLOCK_MONOTONIC (the host's `Instant` clock) and the process's CPU time; the one-shot path prints
them to stderr (`MARK name ns`, `CPU name ns`) just before it writes its result. Never committed to
the engine: the marks cost a little and print into the run's stderr.
"""

import pathlib
import shutil
import sys

PATCHES = {
    "runpython_runner.py": [
        ("import posix\n", "import posix\nimport time as _ptime\n_MARKS = []\n_CPU = []\n\n\ndef _mk(name):\n"
         "    _MARKS.append((name, _ptime.clock_gettime_ns(_ptime.CLOCK_MONOTONIC)))\n"
         "    _CPU.append((name, _ptime.process_time_ns()))\n"),
        ("    pid = posix.getpid()\n    request = _read_request()\n",
         "    _mk(\"one_shot\")\n    pid = posix.getpid()\n    request = _read_request()\n    _mk(\"request_read\")\n"),
        ("    _add_sites([request.get(\"site_dir\")], [])\n    namespace = _new_main_module()\n    _install_display()\n",
         "    _add_sites([request.get(\"site_dir\")], [])\n    _mk(\"env_sites\")\n    namespace = _new_main_module()\n"
         "    _install_display()\n    _mk(\"display_installed\")\n"),
        ("    _save_open_figures()\n    _finish_like_exit(namespace)\n",
         "    _mk(\"run_returned\")\n    _save_open_figures()\n    _mk(\"saved_open_figures\")\n    _finish_like_exit(namespace)\n"),
        ("    _write_result(RESULT_FD, _result_text(status, result, summary))\n",
         "    _mk(\"flushed\")\n    _text = _result_text(status, result, summary)\n    _mk(\"result_encoded\")\n"
         "    posix.write(2, (\"\".join(\"MARK %s %d\\n\" % m for m in _MARKS) + \"\".join(\"CPU %s %d\\n\" % m for m in _CPU)).encode())\n"
         "    _write_result(RESULT_FD, _text)\n"),
        ("        body_code, last_code = _compile(source, bridge)\n        has_value, value = _execute(body_code, last_code, namespace, loop)\n",
         "        body_code, last_code = _compile(source, bridge)\n        _mk(\"compiled\")\n"
         "        has_value, value = _execute(body_code, last_code, namespace, loop)\n        _mk(\"executed\")\n"),
    ],
    "runpython_display.py": [
        ("    bundle = _mime_bundle(obj)\n",
         "    import runpython_runner as _rr\n\n    _rr._mk(\"display_start\")\n    bundle = _mime_bundle(obj)\n    _rr._mk(\"mime_bundle_png\")\n"),
        ("    entry = {\"formats\": formats}\n", "    _rr._mk(\"display_files\")\n    entry = {\"formats\": formats}\n"),
        ("    _DISPLAYS.append(entry)\n", "    _rr._mk(\"chart_data\")\n    _DISPLAYS.append(entry)\n"),
    ],
    "runpython_template.py": [
        ("    sock = socket.socket(fileno=run)\n    try:\n",
         "    sock = socket.socket(fileno=run)\n    runner._MARKS.clear()\n    runner._CPU.clear()\n    runner._mk(\"H_start\")\n    try:\n"),
        ("        me = posix.pidfd_open(posix.getpid())\n", "        runner._mk(\"H_cgroup_joined\")\n        me = posix.pidfd_open(posix.getpid())\n"),
        ("        scratch, egress_fds = _setup(s, command, fds)\n        _reseed()\n",
         "        runner._mk(\"H_init_told\")\n        scratch, egress_fds = _setup(s, command, fds)\n        runner._mk(\"H_layers\")\n"
         "        _reseed()\n        runner._mk(\"H_reseeded\")\n"),
        ("        for fd in [scratch] + egress_fds:\n            posix.close(fd)\n",
         "        for fd in [scratch] + egress_fds:\n            posix.close(fd)\n        runner._mk(\"H_ready_sent\")\n"),
        ("        message, got, _, _ = socket.recv_fds(sock, 16, len(RUN_FDS) + 1)\n",
         "        message, got, _, _ = socket.recv_fds(sock, 16, len(RUN_FDS) + 1)\n        runner._mk(\"H_got_fds\")\n"),
    ],
}


def main():
    root = pathlib.Path(sys.argv[1])
    for name, pairs in PATCHES.items():
        text = (root / name).read_text()
        for old, new in pairs:
            if text.count(old) != 1:
                sys.exit("%s: the patch point %r is not there once: the runner changed, update the patch" % (name, old))
            text = text.replace(old, new)
        (root / name).write_text(text)
    # The host compiles the directory again when the runner's bytecode is missing.
    shutil.rmtree(root / "__pycache__", ignore_errors=True)
    here = pathlib.Path(__file__).parent
    shutil.copy(here / "runpython_prime_chart.py", root / "runpython_prime_chart.py")


if __name__ == "__main__":
    main()
