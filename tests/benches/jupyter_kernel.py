"""The warm Jupyter kernel the chart yardstick measures (`jupyter_cell_ms`): an ipykernel started by
jupyter_client's `KernelManager` (the venv's interpreter, matplotlib's default backend in a kernel,
inline), driven through a blocking client as hosted code interpreters drive theirs. Run by the venv's
python with the cell's file as its argument; the bench harness drives it one round at a time so its
rounds interleave with runpython's:

    stdin:  one line per round (any text)
    stdout: one JSON line per round: {"ms": ..., "png_bytes": ..., "value": "..."}
            or {"error": "..."} (then it exits)

Each round executes the cell, waits for the kernel to go idle, and collects what the kernel sent: the
`display_data` PNG `plt.show()` made and the last expression's `execute_result`. A round that missed
either, or ended in an error, is an error: a broken kernel cannot look fast.
"""

import base64
import json
import os
import shutil
import sys
import tempfile
import time

from jupyter_client import KernelManager

TIMEOUT_S = 120


def execute(client, code):
    """Runs `code`; returns the PNG bytes shown and the last value's text, or raises."""
    msg_id = client.execute(code, store_history=True)
    png, value, error = None, None, None
    while True:
        msg = client.get_iopub_msg(timeout=TIMEOUT_S)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "display_data" and "image/png" in content["data"]:
            png = base64.b64decode(content["data"]["image/png"])
        elif kind == "execute_result":
            value = content["data"].get("text/plain")
        elif kind == "error":
            error = "%s: %s" % (content["ename"], content["evalue"])
        elif kind == "status" and content["execution_state"] == "idle":
            break
    reply = client.get_shell_msg(timeout=TIMEOUT_S)
    if error or reply["content"]["status"] != "ok":
        raise RuntimeError("the cell failed in the kernel: %s" % (error or reply["content"]["status"]))
    if png is None or not png.startswith(b"\x89PNG"):
        raise RuntimeError("the kernel showed no PNG for the chart")
    if value is None:
        raise RuntimeError("the kernel sent no value for the cell's last expression")
    return png, value


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        code = f.read()
    home = tempfile.mkdtemp(prefix="runpython-bench-jupyter-")
    env = dict(os.environ)
    # The kernel's own defaults: ipykernel picks the inline backend when MPLBACKEND is unset.
    env.pop("MPLBACKEND", None)
    # Its caches and profile in a directory of its own, built by the first (excluded) round.
    env.update(
        HOME=home,
        IPYTHONDIR=os.path.join(home, "ipython"),
        MPLCONFIGDIR=os.path.join(home, "matplotlib"),
        JUPYTER_RUNTIME_DIR=os.path.join(home, "runtime"),
        JUPYTER_DATA_DIR=os.path.join(home, "data"),
        JUPYTER_PLATFORM_DIRS="1",
    )
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=env)
    client = km.blocking_client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=TIMEOUT_S)
        for _ in sys.stdin:
            started = time.perf_counter()
            try:
                png, value = execute(client, code)
            except Exception as exc:
                print(json.dumps({"error": "%s: %s" % (type(exc).__name__, exc)}), flush=True)
                return 1
            ms = (time.perf_counter() - started) * 1000
            print(json.dumps({"ms": ms, "png_bytes": len(png), "value": value}), flush=True)
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=True)
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
