"""Warm environments from Python: `warm=` declares them, `warm_up()` prepares them, and a run within one
is forked from its template (pandas from the index through runpython's own dependency path)."""

from __future__ import annotations

import pytest

from runpython import ConfigError, RunPython


def test_a_run_within_a_warm_environment_is_forked_from_its_template() -> None:
    rp = RunPython(timeout=300, warm=["numpy,pandas"])
    rp.warm_up()
    e = rp.run("import pandas as pd\nint(pd.DataFrame({'a': [1, 2, 3]})['a'].sum())")
    assert e.status == "success", e.error
    assert e.return_value == 6
    assert e.isolation is not None and e.isolation["start"] == "template", e.isolation
    # Nothing to install: not the warm template's.
    plain = rp.run("1 + 1")
    assert plain.isolation is not None and plain.isolation["start"] != "template"


@pytest.mark.parametrize("warm", ["numpy", [1], [["numpy", 2]]])
def test_warm_takes_a_list_of_environments(warm: object) -> None:
    with pytest.raises(ConfigError, match="warm"):
        RunPython(warm=warm)  # type: ignore[arg-type]
