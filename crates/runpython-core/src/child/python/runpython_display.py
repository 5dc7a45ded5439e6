"""The display protocol in the child: `display(obj)` (a builtin, and `from runpython_display import
display`), the last value's rich forms and matplotlib's figures become the envelope's `displays`: each
object's formats as IPython asks for them (`_repr_mimebundle_`, the `_repr_*_` methods), text inline
within bounds, images and specs as files, and a matplotlib figure's chart as data.

Standard library only (built-in modules), imported by the runner from runpython's code directory.
"""

import posix
import sys

from runpython_json import _iso_or_base64, json_dumps

# Displays: what `display(obj)` showed, the last expression's rich forms and matplotlib's figures, for
# the envelope's `displays`. Text forms stay inline within these bounds; binary ones become files in
# the working directory (and so artifacts of a kept run), named by the entry.
_DISPLAYS = []
_IMAGES = {"budget": 0, "used": 0}  # bytes of images handed back inline, per run or cell
DISPLAY_TEXT = {"text/plain": 500, "text/markdown": 1500, "text/html": 1500, "text/latex": 1000, "application/json": 1500}
DISPLAY_FILES = {"image/png": "png", "image/jpeg": "jpg", "image/svg+xml": "svg", "application/pdf": "pdf",
                 "application/vnd.plotly.v1+json": "plotly.json", "application/vnd.vegalite.v5+json": "vl.json",
                 "application/vnd.vegalite.v4+json": "vl.json"}
# File forms that are JSON: written as their UTF-8 text (a dict is encoded first).
_JSON_FILES = ("application/vnd.plotly.v1+json", "application/vnd.vegalite.v5+json", "application/vnd.vegalite.v4+json")
DISPLAY_TEXT_TOTAL = 4000  # inline text over every display of a run or cell
MAX_DISPLAYS = 50
_REPR_METHODS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_pdf_", "application/pdf"),
)


def _mime_bundle(obj):
    """The object's formats by MIME type, as IPython asks for them: `_repr_mimebundle_`, then each
    `_repr_*_` method, matplotlib figures as PNG, and `repr` as text/plain."""
    data = {}
    if isinstance(obj, type):
        return {"text/plain": repr(obj)}
    module = type(obj).__module__ or ""
    if module.startswith("plotly") and hasattr(obj, "to_json"):
        return _plotly_bundle(obj)
    if module.startswith("altair") and hasattr(obj, "to_dict"):
        try:
            data[_VEGA_LITE] = obj.to_dict()
        except Exception:
            pass  # a chart altair cannot validate: its repr stands
        data["text/plain"] = repr(obj)
        return data
    method = getattr(obj, "_repr_mimebundle_", None)
    if callable(method):
        try:
            got = method(include=None, exclude=None)
        except TypeError:
            got = method()
        if isinstance(got, tuple):
            got = got[0]
        if isinstance(got, dict):
            data.update(got)
    for name, mime in _REPR_METHODS:
        if mime in data:
            continue
        method = getattr(obj, name, None)
        if callable(method):
            got = method()
            if isinstance(got, tuple):
                got = got[0]
            if got is not None:
                data[mime] = got
    module = type(obj).__module__ or ""
    if module.startswith("pandas") and "text/markdown" not in data:
        try:
            data["text/markdown"] = _markdown_table(obj)
        except Exception:
            pass  # not a table after all: its other forms stand
    if "image/png" not in data and module.startswith("matplotlib") and hasattr(obj, "savefig"):
        import io

        buffer = io.BytesIO()
        obj.savefig(buffer, format="png")
        data["image/png"] = buffer.getvalue()
    if "text/plain" not in data:
        data["text/plain"] = repr(obj)
    return data


_PLOTLY = "application/vnd.plotly.v1+json"
_VEGA_LITE = "application/vnd.vegalite.v5+json"
MARKDOWN_ROWS = 10
MARKDOWN_COLUMNS = 12


def _plotly_bundle(fig):
    """A plotly figure: its JSON (data and layout) as a file, a PNG when kaleido can draw one, and
    what it shows as text; never plotly's renderers, which may open a browser."""
    data = {_PLOTLY: fig.to_json().encode("utf-8")}
    try:
        data["image/png"] = fig.to_image(format="png")
    except Exception:
        pass  # no kaleido (or no browser for it): the figure's JSON says what it shows
    try:
        layout = fig.layout
        title = layout.title.text if layout.title is not None else None
        kinds = sorted({getattr(trace, "type", "?") for trace in fig.data})
        data["text/plain"] = "plotly Figure%s: %d trace(s) (%s)" % (
            " %r" % title if title else "", len(fig.data), ", ".join(kinds))
    except Exception:
        data["text/plain"] = repr(fig)[:500]
    return data


def _markdown_table(table):
    """A pandas DataFrame or Series as a Markdown table: its first rows and columns, then its shape."""
    frame = table.to_frame() if hasattr(table, "to_frame") and not hasattr(table, "columns") else table
    rows, cols = frame.shape
    shown = frame.iloc[:MARKDOWN_ROWS, :MARKDOWN_COLUMNS]

    def cell(v):
        return str(v).replace("|", "\\|").replace("\n", " ")[:40]

    lines = ["| %s |" % " | ".join([cell(frame.index.name or "")] + [cell(c) for c in shown.columns])]
    lines.append("|" + "---|" * (len(shown.columns) + 1))
    for index, row in zip(shown.index, shown.itertuples(index=False)):
        lines.append("| %s |" % " | ".join([cell(index)] + [cell(v) for v in row]))
    if rows > MARKDOWN_ROWS or cols > MARKDOWN_COLUMNS:
        lines.append("")
        lines.append("%d rows × %d columns" % (rows, cols))
    return "\n".join(lines)


def _display_cut(text, limit):
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return text[:head] + "\n[... %d characters cut ...]\n" % (len(text) - limit) + text[len(text) - (limit - head):]


def _png_size(data):
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    return None


def _display_file(stem, ext, payload):
    name = "%s.%s" % (stem, ext)
    n = 1
    while True:
        try:
            fd = posix.open(name, posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_CLOEXEC, 0o644)
            break
        except FileExistsError:
            n += 1
            name = "%s_%d.%s" % (stem, n, ext)
    try:
        view = memoryview(payload).cast("B")
        while view:
            view = view[posix.write(fd, view):]
    finally:
        posix.close(fd)
    return name


CHART_POINTS = 20  # points listed per series; past them, a summary


def _num(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if f != f or f in (float("inf"), float("-inf")):
        return None
    return int(f) if f.is_integer() and abs(f) < 2**53 else round(f, 6)


def _series(xs, ys):
    """Points of a series, all of them when few, else a summary a model can read."""
    pts = [[_num(x), _num(y)] for x, y in zip(xs, ys)]
    if len(pts) <= CHART_POINTS:
        return {"points": pts}
    values = [p[1] for p in pts if isinstance(p[1], (int, float))]
    out = {"count": len(pts), "first": pts[0], "last": pts[-1]}
    if values:
        out["min"], out["max"] = min(values), max(values)
    step = max(1, len(pts) // 10)
    out["sample"] = pts[::step][:10]
    return out


def _axes_chart(ax):
    """One axes as data: its kind, title, labels, scales and elements."""
    from matplotlib.container import BarContainer
    from matplotlib.collections import PathCollection
    from matplotlib.patches import Wedge

    elements, kinds = [], []
    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    if wedges:
        kinds.append("pie")
        total = sum(abs(w.theta2 - w.theta1) for w in wedges) or 1.0
        labels = [t.get_text() for t in ax.texts]
        for i, w in enumerate(wedges):
            elements.append({"type": "slice", "label": w.get_label() if not w.get_label().startswith("_") else (labels[i] if i < len(labels) else None), "fraction": round(abs(w.theta2 - w.theta1) / total, 4)})
    ticks = {round(float(t), 6): l.get_text() for t, l in zip(ax.get_xticks(), ax.get_xticklabels())}
    histograms = ax.__dict__.get("_runpython_hist", set())
    for stats in ax.__dict__.get("_runpython_boxes", []):
        kinds.append("box")
        item = {"type": "box", "label": stats.get("label")}
        for key, name in (("whislo", "min"), ("q1", "q1"), ("med", "median"), ("q3", "q3"), ("whishi", "max"), ("mean", "mean")):
            if key in stats:
                item[name] = _num(stats[key])
        fliers = list(stats.get("fliers", []))
        item["outliers"] = [_num(f) for f in fliers[:CHART_POINTS]]
        if len(fliers) > CHART_POINTS:
            item["outliers_total"] = len(fliers)
        if item["label"] is None:
            item.pop("label")
        elements.append(item)
    boxed = ax.__dict__.get("_runpython_box_artists", set())
    for container in ax.containers:
        if isinstance(container, BarContainer) and id(container) in histograms:
            kinds.append("histogram")
            group = container.get_label()
            for patch in container.patches:
                start = patch.get_x()
                elements.append({"type": "bin", "group": None if str(group).startswith("_") else group,
                                 "start": _num(start), "end": _num(start + patch.get_width()),
                                 "count": _num(patch.get_height())})
            continue
        if isinstance(container, BarContainer):
            kinds.append("bar")
            group = container.get_label()
            for patch in container.patches:
                x = round(patch.get_x() + patch.get_width() / 2, 6)
                elements.append({"type": "bar", "label": ticks.get(x) or _num(x), "group": None if str(group).startswith("_") else group, "value": _num(patch.get_height())})
    for collection in ax.collections:
        if isinstance(collection, PathCollection):
            kinds.append("scatter")
            offsets = collection.get_offsets()
            label = collection.get_label()
            item = {"type": "scatter", "label": None if str(label).startswith("_") else label}
            item.update(_series([o[0] for o in offsets], [o[1] for o in offsets]))
            elements.append(item)
    for line in ax.get_lines():
        if id(line) in boxed:
            continue  # a box plot's whiskers, caps and medians: its statistics say them
        label = line.get_label()
        xs, ys = line.get_xdata(), line.get_ydata()
        if len(xs) < 2 and not wedges:
            continue
        kinds.append("line")
        item = {"type": "line", "label": None if str(label).startswith("_") else label}
        item.update(_series(list(xs), list(ys)))
        elements.append(item)
    kind = kinds[0] if len(set(kinds)) == 1 else ("composite" if kinds else "empty")
    return {
        "type": kind,
        "title": ax.get_title() or None,
        "x_label": ax.get_xlabel() or None,
        "y_label": ax.get_ylabel() or None,
        "x_scale": ax.get_xscale(),
        "y_scale": ax.get_yscale(),
        "elements": elements[:50],
        "elements_total": len(elements),
    }


def _chart(fig):
    """A matplotlib figure as data: one axes' chart, or a composite of several."""
    axes = [_axes_chart(ax) for ax in fig.get_axes()]
    title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else None
    if len(axes) == 1:
        chart = axes[0]
        if title and not chart["title"]:
            chart["title"] = title
        return chart
    return {"type": "composite", "title": title, "axes": axes[:8]}


# The last expression's value is already in the envelope (its value or preview): its automatic display
# adds only what that lacks, an HTML form as long as this at most (a DataFrame's table markup would
# cost a model kilobytes for what the preview says), and no text/plain.
LAST_VALUE_HTML = 500


def _add_display(obj, stem=None, last_value=False):
    """One entry of `displays` for `obj`; for the last expression's value (`last_value`), only the
    forms its return value lacks, and nothing when none remains."""
    if len(_DISPLAYS) >= MAX_DISPLAYS:
        return
    import binascii

    bundle = _mime_bundle(obj)
    if last_value:
        bundle.pop("text/plain", None)
        if (type(obj).__module__ or "").startswith("pandas"):
            bundle.pop("text/markdown", None)  # the value's preview already shows the table
        html = bundle.get("text/html")
        if isinstance(html, str) and len(html) > LAST_VALUE_HTML:
            del bundle["text/html"]
        if not bundle:
            return
    used = sum(len(v) for d in _DISPLAYS for v in d["formats"].values() if isinstance(v, str))
    formats = {}
    for mime, value in bundle.items():
        if mime in DISPLAY_FILES:
            if mime in _JSON_FILES and not isinstance(value, (bytes, bytearray, str)):
                value = json_dumps(value, _iso_or_base64)
            if isinstance(value, str):
                text_form = mime == "image/svg+xml" or mime in _JSON_FILES
                value = value.encode("utf-8") if text_form else binascii.a2b_base64(value)
            if not isinstance(value, (bytes, bytearray)):
                continue
            file = _display_file(stem or "display_%d" % (len(_DISPLAYS) + 1), DISPLAY_FILES[mime], value)
            entry = {"file": file, "bytes": len(value)}
            if mime in ("image/png", "image/jpeg") and _IMAGES["used"] + len(value) <= _IMAGES["budget"]:
                _IMAGES["used"] += len(value)
                entry["data"] = binascii.b2a_base64(value, newline=False).decode("ascii")
            size = _png_size(value) if mime == "image/png" else None
            if size:
                entry["width"], entry["height"] = size
            formats[mime] = entry
        elif mime in DISPLAY_TEXT:
            text = value if isinstance(value, str) else json_dumps(value)
            room = max(0, min(DISPLAY_TEXT[mime], DISPLAY_TEXT_TOTAL - used))
            if room < 40 and mime != "text/plain":
                continue
            text = _display_cut(text, max(room, 40))
            used += len(text)
            formats[mime] = text
    entry = {"formats": formats}
    if (type(obj).__module__ or "").startswith("matplotlib") and hasattr(obj, "get_axes"):
        try:
            entry["chart"] = _chart(obj)
        except Exception:
            pass  # a figure this cannot read is still shown
    _DISPLAYS.append(entry)


def display(*objs, **kwargs):
    """Shows each object in the run's envelope (`displays`), as IPython's display() does: its richest
    forms (html, markdown, images, ...) and its text."""
    for obj in objs:
        _add_display(obj)


def _rich(value):
    """Whether the last expression's value has forms beyond its repr (then it is displayed too)."""
    if isinstance(value, type):
        return False
    if any(callable(getattr(value, name, None)) for name, _ in _REPR_METHODS) or callable(
        getattr(value, "_repr_mimebundle_", None)
    ):
        return True
    return (type(value).__module__ or "").startswith("matplotlib") and hasattr(value, "savefig")


class _PyplotHook:
    """Patches `matplotlib.pyplot.show` when the code imports pyplot: it displays the open figures
    and closes them, as a notebook's inline backend does."""

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.pyplot":
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            module.show = _pyplot_show
            _record_chart_calls()
            loader.exec_module = original

        loader.exec_module = exec_module
        return spec


def _pyplot_show(*args, **kwargs):
    _show_open_figures()


def _record_chart_calls():
    """Wraps `Axes.hist` and `Axes.bxp` (behind `boxplot`) so a chart knows its histograms' bars
    and its boxes' statistics exactly, instead of guessing them from the drawn shapes."""
    axes = sys.modules.get("matplotlib.axes")
    cls = getattr(axes, "Axes", None)
    if cls is None or getattr(cls, "_runpython_wrapped", False):
        return
    hist, bxp = cls.hist, cls.bxp

    def recording_hist(self, *args, **kwargs):
        result = hist(self, *args, **kwargs)
        patches = result[2]
        containers = patches if isinstance(patches, list) else [patches]
        self.__dict__.setdefault("_runpython_hist", set()).update(id(c) for c in containers)
        return result

    def recording_bxp(self, bxpstats, *args, **kwargs):
        artists = bxp(self, bxpstats, *args, **kwargs)
        boxes = self.__dict__.setdefault("_runpython_boxes", [])
        boxes.extend(dict(stats) for stats in bxpstats)
        drawn = self.__dict__.setdefault("_runpython_box_artists", set())
        for group in artists.values():
            drawn.update(id(a) for a in group)
        return artists

    cls.hist, cls.bxp, cls._runpython_wrapped = recording_hist, recording_bxp, True


def _show_open_figures():
    """Every open figure displayed (as figure_N.png), in order, then closed."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for number in plt.get_fignums():
        try:
            _add_display(plt.figure(number), stem="figure_%d" % number)
        except Exception:
            pass  # a figure that cannot be drawn is the code's problem, not the run's
    plt.close("all")


def _install_display():
    import builtins

    builtins.display = display
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:  # imported ahead (a template's warm imports)
        plt.show = _pyplot_show
        _record_chart_calls()
    else:
        sys.meta_path.insert(0, _PyplotHook())


def _save_open_figures():
    """Figures the code drew but did not close are displayed, and so become PNG files in the run
    directory (and artifacts)."""
    _show_open_figures()
