"""Tenants in the Python package: `RunPython.tenant(name)` gives an engine whose runs, artifacts,
memo entries and sessions are the tenant's own; another tenant's ids read like missing ones."""

from __future__ import annotations

import pytest

from runpython import RunPython, StoreError


def test_a_tenant_sees_only_its_own(tmp_path):
    base = RunPython(store=f"file://{tmp_path}", memo=True, pool=False)
    alice, bob = base.tenant("alice"), base.tenant("bob")
    assert (alice.tenant_name, bob.tenant_name, base.tenant_name) == ("alice", "bob", None)

    written = alice.run("open('secret.txt', 'w').write('alice only'); 1")
    artifact = next(a for a in written.artifacts if a.name.endswith("secret.txt"))
    assert alice.get_run_artifact(artifact.id) == b"alice only"
    missing = artifact.id[:-1] + ("0" if artifact.id[-1] != "0" else "1")
    with pytest.raises(StoreError) as theirs:
        bob.get_run_artifact(artifact.id)
    with pytest.raises(StoreError) as nobody:
        bob.get_run_artifact(missing)
    assert str(theirs.value).replace(artifact.id, "<id>") == str(nobody.value).replace(missing, "<id>")
    in_code = bob.run(f"read_artifact({artifact.id!r})")
    assert in_code.status == "error" and in_code.error.type == "KeyError", in_code

    code = "sum(range(12345))"
    assert alice.run(code).cached is False
    assert alice.run(code).cached is True
    assert bob.run(code).cached is False

    alice.session("s").run("x = 1")
    assert bob.session("s").run("'x' in globals()").return_value is False


def test_a_tenant_over_its_quota_runs_and_keeps_nothing(tmp_path):
    base = RunPython(store=f"file://{tmp_path}", pool=False)
    # The quota is held at every write: the first run fits, the second would pass it.
    carol = base.tenant("carol", max_stored_bytes=100_000)
    big = "import os; open('big.bin', 'wb').write(os.urandom(60_000)); 'done'"
    assert carol.run(big).kept is True
    over = carol.run(big)
    assert over.return_value == "done" and over.kept is False, over
    assert "quota" in over.store_error, over
    assert base.tenant("dave", max_stored_bytes=100_000).run(big).kept is True
