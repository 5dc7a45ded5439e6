"""Temporary profiling primer: a throwaway chart drawn in the template, as a warm environment could."""
import io
import matplotlib.pyplot as plt
import pandas as pd
import matplotlib.backends.backend_agg  # noqa: F401
from PIL import Image

Image.preinit()
fig = plt.figure(figsize=(2, 1))
plt.plot(pd.date_range("2026-01-01", periods=3), [1, 2, 3])
plt.title("t")
plt.xlabel("x")
plt.ylabel("y")
fig.savefig(io.BytesIO(), format="png")
plt.close("all")
