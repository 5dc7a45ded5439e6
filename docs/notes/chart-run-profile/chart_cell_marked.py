import time as _t
_M = []
import runpython_runner as _rr
def _mark(name):
    _M.append([name, _t.clock_gettime_ns(_t.CLOCK_MONOTONIC)])
    _rr._CPU.append((name, _t.process_time_ns()))
_mark('code_start')
import numpy as np
import pandas as pd
import matplotlib.pyplot as plt
_mark("imports")
rng = np.random.default_rng(37)
rows = 20_000
df = pd.DataFrame(
    {
        "day": pd.Timestamp("2026-01-01") + pd.to_timedelta(rng.integers(0, 90, rows), unit="D"),
        "region": pd.Categorical(rng.choice(["north", "south", "east", "west"], rows)),
        "sales": rng.gamma(2.0, 50.0, rows),
    }
)
_mark("frame")
daily = df.groupby("day")["sales"].mean()
_mark("groupby")
plt.figure(figsize=(8, 4))
plt.plot(daily.index, daily.values)
plt.title("Mean sales per day")
plt.xlabel("day")
plt.ylabel("mean sales (EUR)")
_mark("plot")
plt.show()
_mark("show")
_v = {
    "days": int(daily.size),
    "rows": len(df),
    "mean_sales": round(float(df["sales"].mean()), 3),
    "by_region": {str(k): round(float(v), 3) for k, v in df.groupby("region", observed=True)["sales"].mean().items()},
}
_mark("value")
_v["_marks"] = _M
_v
