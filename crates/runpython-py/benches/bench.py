"""The Python side of `cargo xtask bench`. The Rust harness (tests/src/bin/runpython-bench.rs) starts this
script with the venv's interpreter where the release wheel is installed, and drives it one request per line
on stdin, interleaving each with the same measurement made from Rust:

    run          one `rp.run("1+1")` (no pool, no store: the harness's cold engine); prints its wall ms
    tools N      one run making N sequential calls of a plain Python callable; prints calls per second,
                 timed inside the sandbox as the harness times its Rust tool

It prints one line per request and exits at the end of stdin.
"""

from __future__ import annotations

import sys
import time

from runpython import RunPython


def inc(x: int) -> int:
    """x + 1."""
    return x + 1


def main() -> None:
    cold = RunPython(timeout=120, pool=False)
    engines: dict[int, RunPython] = {}
    for line in sys.stdin:
        request = line.split()
        if request == ["run"]:
            started = time.perf_counter()
            envelope = cold.run("1+1")
            elapsed = (time.perf_counter() - started) * 1e3
            if envelope.return_value != 2:
                raise SystemExit(f"the run failed: {envelope.error}")
            print(elapsed, flush=True)
        elif len(request) == 2 and request[0] == "tools":
            n = int(request[1])
            engine = engines.setdefault(n, RunPython(timeout=120, max_tool_calls=n + 1, tools=[inc]))
            code = f"import time\ninc(0)\nt = time.perf_counter()\nfor i in range({n}):\n    inc(i)\n{n} / (time.perf_counter() - t)"
            envelope = engine.run(code)
            if not isinstance(envelope.return_value, float):
                raise SystemExit(f"the tool run failed: {envelope.error}")
            print(envelope.return_value, flush=True)
        else:
            raise SystemExit(f"unknown request {line!r}")


if __name__ == "__main__":
    main()
