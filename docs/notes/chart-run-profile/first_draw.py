"""A first draw against a second in a fork of a process that imported the stack: `python first_draw.py none|freeze|nogc|imports|fonts|draw|datedraw` (what the parent does before it forks). CPU ms per step."""
import sys, time, io, os
t = time.process_time
prime = sys.argv[1]
import numpy as np, pandas as pd, matplotlib.pyplot as plt
def cell():
    rng = np.random.default_rng(37); rows = 20000
    df = pd.DataFrame({"day": pd.Timestamp("2026-01-01") + pd.to_timedelta(rng.integers(0, 90, rows), unit="D"),
        "region": pd.Categorical(rng.choice(["north", "south", "east", "west"], rows)), "sales": rng.gamma(2.0, 50.0, rows)})
    a = t(); daily = df.groupby("day")["sales"].mean(); b = t()
    fig = plt.figure(figsize=(8, 4)); plt.plot(daily.index, daily.values); plt.title("Mean sales per day"); plt.xlabel("day"); plt.ylabel("mean sales (EUR)"); c = t()
    buf = io.BytesIO(); fig.savefig(buf, format="png"); d = t(); plt.close("all")
    return "groupby %.1f plot %.1f png %.1f" % ((b - a) * 1e3, (c - b) * 1e3, (d - c) * 1e3)
if prime == "draw":
    f = plt.figure(figsize=(2, 1)); plt.plot([1, 2]); plt.title("x"); f.savefig(io.BytesIO(), format="png"); plt.close("all")
elif prime == "datedraw":
    f = plt.figure(figsize=(2, 1)); plt.plot(pd.date_range("2026-01-01", periods=3), [1, 2, 3]); plt.title("x"); plt.xlabel("x"); f.savefig(io.BytesIO(), format="png"); plt.close("all")
elif prime == "fonts":
    from matplotlib import font_manager
    from matplotlib.backends import backend_agg
    font_manager.get_font(font_manager.findfont("DejaVu Sans"))
elif prime == "imports":
    import matplotlib.backends.backend_agg, PIL.PngImagePlugin, matplotlib.dates, pandas.plotting
import gc
if prime == "freeze": gc.collect(); gc.freeze()
if prime == "nogc": gc.disable()
if os.fork() == 0:
    print(prime, "forked first:", cell()); print(prime, "forked second:", cell()); os._exit(0)
os.wait()
