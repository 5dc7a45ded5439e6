# The data cell agents send (issue 37): a 20,000-row frame, grouped, a line chart of the group means
# shown, and a small value last. The bench runs this file as it is in runpython (a one-shot run and a
# session cell), in a warm Jupyter kernel and as a plain Python process.
import numpy as np
import pandas as pd
import matplotlib.pyplot as plt

rng = np.random.default_rng(37)
rows = 20_000
df = pd.DataFrame(
    {
        "day": pd.Timestamp("2026-01-01") + pd.to_timedelta(rng.integers(0, 90, rows), unit="D"),
        "region": pd.Categorical(rng.choice(["north", "south", "east", "west"], rows)),
        "sales": rng.gamma(2.0, 50.0, rows),
    }
)
daily = df.groupby("day")["sales"].mean()

plt.figure(figsize=(8, 4))
plt.plot(daily.index, daily.values)
plt.title("Mean sales per day")
plt.xlabel("day")
plt.ylabel("mean sales (EUR)")
plt.show()

{
    "days": int(daily.size),
    "rows": len(df),
    "mean_sales": round(float(df["sales"].mean()), 3),
    "by_region": {str(k): round(float(v), 3) for k, v in df.groupby("region", observed=True)["sales"].mean().items()},
}
