"""First-use work of packages, done once in a template so that the runs forked from it never pay it:
each primer uses a package the way a data cell does (its lazily loaded modules imported, its caches
built) and leaves nothing behind (no figure open, nothing written but the package's own caches).

Stdlib only by itself; a primer runs only for a package the template's environment holds, in the
template, before any run exists. Which packages have one is `PRIMERS`.
"""

import sys


def _matplotlib():
    # The font list (matplotlib builds it on first use, ~0.1-0.9 s, with fc-list), the Agg renderer, a
    # date axis and text: what a chart run would otherwise do first.
    import datetime
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    try:
        days = [datetime.date(2024, 1, d) for d in (1, 2, 3)]
        ax.plot(days, [1.0, 3.0, 2.0], label="v")
        ax.set_title("t")
        ax.set_xlabel("x")
        ax.legend()
        fig.savefig(io.BytesIO(), format="png")
    finally:
        plt.close(fig)


def _numpy():
    # numpy loads numpy.random lazily; a run re-seeds it after the fork (`runpython_forked._reseed`).
    import numpy.random  # noqa: F401


def _pandas():
    import pandas

    frame = pandas.DataFrame({"d": pandas.date_range("2024-01-01", periods=3), "v": [1.0, 2.0, 3.0]})
    frame.groupby("d").mean()
    frame.to_string()


PRIMERS = {"matplotlib": _matplotlib, "numpy": _numpy, "pandas": _pandas}


def prime(names):
    """Runs the primer of each of `names` that has one; a primer that fails is left for the run to see."""
    for name in names:
        primer = PRIMERS.get(name)
        if primer is None:
            continue
        try:
            primer()
        except Exception:
            pass
    _join_finished_timers()


def _join_finished_timers():
    # matplotlib says it is building the font cache from a threading.Timer it cancels when done: the
    # cancelled timer's thread may still be ending, and a template must have no thread when it forks.
    threading = sys.modules.get("threading")
    if threading is None:
        return
    for thread in threading.enumerate():
        if isinstance(thread, threading.Timer) and thread.finished.is_set():
            thread.join(1.0)
