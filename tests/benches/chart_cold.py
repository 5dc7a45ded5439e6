"""`python chart_cold.py CELL OUT_DIR`: the chart cell as a plain Python process (`chart_cold_process_ms`),
doing the work the other paths do: with `MPLBACKEND=Agg` `plt.show()` draws nothing, so here it saves
each open figure as a PNG in OUT_DIR (as a notebook's inline backend and runpython's display do), and
the last expression's value is printed as JSON. Nothing is imported before the cell: the cell's own
`import matplotlib.pyplot` is what loads pyplot, and `show` is replaced the moment it is.
"""

import json
import sys


class _ShowSaves:
    """Replaces `matplotlib.pyplot.show` as soon as the cell imports pyplot."""

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.pyplot":
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        original = spec.loader.exec_module

        def exec_module(module):
            original(module)
            module.show = lambda *args, **kwargs: _save(module)

        spec.loader.exec_module = exec_module
        sys.meta_path.remove(self)
        return spec


def _save(plt):
    for number in plt.get_fignums():
        plt.figure(number).savefig("%s/figure_%d.png" % (sys.argv[2], number), format="png")
    plt.close("all")


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        source = f.read()
    import ast

    tree = ast.parse(source, sys.argv[1])
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    namespace = {"__name__": "__main__"}
    sys.meta_path.insert(0, _ShowSaves())
    exec(compile(tree, sys.argv[1], "exec"), namespace)
    value = eval(compile(ast.Expression(last.value), sys.argv[1], "eval"), namespace) if last else None
    print(json.dumps(value))


if __name__ == "__main__":
    main()
