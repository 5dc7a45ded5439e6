"""One typical first use of a package (`python first_use.py numpy|pandas|matplotlib|mathtext|scipy|sklearn|seaborn|plotly|PIL`), run with a fresh HOME to see what it writes."""
import sys, time
which = sys.argv[1]
t = time.perf_counter()
if which == "numpy":
    import numpy as np; np.random.default_rng(1).random(10).sum(); np.linalg.inv(np.eye(3))
elif which == "pandas":
    import pandas as pd, numpy as np
    df = pd.DataFrame({"a": np.arange(1000), "d": pd.date_range("2026-01-01", periods=1000, freq="h", tz="Europe/Berlin")})
    df.groupby(df.a % 7).mean(); df.to_csv("/tmp/x.csv"); df.to_html(); str(df)
elif which == "matplotlib":
    import matplotlib.pyplot as plt
    plt.plot([1, 2]); plt.title("t"); plt.savefig("/tmp/x.png")
elif which == "mathtext":
    import matplotlib.pyplot as plt
    plt.plot([1, 2]); plt.title(r"$\alpha^2$"); plt.savefig("/tmp/x.png")
elif which == "scipy":
    import scipy.stats, scipy.optimize, scipy.signal, scipy.sparse.linalg
    scipy.stats.norm.cdf(1.0); scipy.optimize.minimize(lambda x: (x - 1) ** 2, 0.0)
elif which == "sklearn":
    from sklearn.linear_model import LogisticRegression
    from sklearn.datasets import load_iris
    X, y = load_iris(return_X_y=True); LogisticRegression(max_iter=200).fit(X, y)
elif which == "seaborn":
    import seaborn as sns, pandas as pd, numpy as np, matplotlib.pyplot as plt
    sns.set_theme(); sns.lineplot(data=pd.DataFrame({"x": np.arange(10), "y": np.arange(10)}), x="x", y="y"); plt.savefig("/tmp/x.png")
elif which == "plotly":
    import plotly.express as px, pandas as pd
    fig = px.line(pd.DataFrame({"x": [1, 2], "y": [3, 4]}), x="x", y="y"); fig.to_json(); fig.to_html()
elif which == "PIL":
    from PIL import Image, ImageDraw, ImageFont
    im = Image.new("RGB", (64, 64)); d = ImageDraw.Draw(im); d.text((1, 1), "hi", font=ImageFont.load_default()); im.save("/tmp/x.png")
print(which, round((time.perf_counter() - t) * 1000), "ms")
