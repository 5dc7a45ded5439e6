"""`runpython serve` under a hostile tenant, driven by the official MCP Python SDK client (the
connection, body, session and admission findings are raw HTTP in `tests/serve_tenants/`): a tenant's
stored bytes never pass its quota on one host, whatever writes them (resumes, runs at once, one run
writing many files); a numeric JWT tenant claim is refused naming the claim; and no error a tenant
can get (not found, quota, a failing store, a failed install) names a host path or the store's URL."""

import json
import os
import shutil
import subprocess
import tempfile

import anyio
import httpx2
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from mcp.shared.exceptions import MCPError

from common import BIN, Serve, envelope_of, http_client, new_token, ok, rpc_error
from tenancy import ACCEPT, AUDIENCE, INIT, ISSUER, rsa_jwk, token

QUOTA = 1_000_000


def stored_bytes(store, tenant):
    out = subprocess.run([BIN, "runs", "--json", "--store", store, "--tenant", tenant],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["stored_bytes"]


def writes(n, each, name="out"):
    """Code writing `n` files of `each` random bytes (random: content-addressed blobs never dedupe)."""
    return ("import os\n"
            f"for i in range({n}):\n"
            f"    open(f'{name}{{i}}.bin', 'wb').write(os.urandom({each}))\n"
            "'written'")


APPROVED_WRITE = ("import os\n"
                  "ok = request_approval('write it?')\n"
                  "open('after.bin', 'wb').write(os.urandom(300_000)) if ok else None\n"
                  "'wrote' if ok else 'held'")


async def a_tenants_stored_bytes_never_pass_its_quota(tmp):
    store = f"file://{tmp}/quota"
    tokens = {"alice": new_token(), "bob": new_token()}
    args = ["--store", store, "--approval", "request_approval", "--timeout", "60",
            "--max-runs-per-token", "8", "--max-runs-in-flight", "8"]
    with Serve(*args, "--max-stored-bytes-per-token", str(QUOTA), tokens=tokens) as serve:
        async with serve.client("alice") as alice, serve.client("bob") as bob:
            suspended = []
            for _ in range(6):
                run = envelope_of(await alice.call_tool("run_python", {"code": APPROVED_WRITE}))
                assert run["status"] == "suspended", run
                suspended.append(run)
            # Nearly full: three runs of 300 kB fit under 1 MB, a fourth does not.
            for _ in range(3):
                kept = envelope_of(await alice.call_tool("run_python", {"code": writes(1, 300_000)}))
                assert kept.get("kept", True) is True, kept
            for run in suspended[:5]:
                resumed = envelope_of(await alice.call_tool(
                    "resume", {"run_id": run["run_id"], "decisions": {run["suspension"]["id"]: True}}))
                assert resumed["return_value"] == "wrote", resumed
                assert resumed["kept"] is False and "quota" in resumed["store_error"], resumed
            used = stored_bytes(store, "alice")
            assert used <= QUOTA, used
            ok(f"five resumes writing 300 kB each into a nearly full quota are each kept: false ({used} of {QUOTA} bytes)")

            # Eight runs at once, 300 kB each, for a tenant with nothing kept: at most three fit.
            results = [None] * 8

            async def one(i):
                results[i] = envelope_of(await bob.call_tool("run_python", {"code": writes(1, 300_000)}))

            async with anyio.create_task_group() as group:
                for i in range(8):
                    group.start_soon(one, i)
            kept = [r for r in results if r.get("kept", True)]
            assert 1 <= len(kept) <= 3, results
            assert all("quota" in r["store_error"] for r in results if not r.get("kept", True)), results
            used = stored_bytes(store, "bob")
            assert used <= QUOTA, used
            ok(f"eight runs writing at once keep {len(kept)} and refuse the rest: {used} of {QUOTA} bytes")

        carol_token = new_token()
    # One run writing ten files of 500 kB: not kept (nothing of it is listed), the quota held.
    tokens["carol"] = carol_token
    with Serve(*args, "--max-stored-bytes-per-token", str(QUOTA), tokens=tokens) as serve:
        async with serve.client("carol") as carol:
            big = envelope_of(await carol.call_tool("run_python", {"code": writes(10, 500_000)}))
            assert big["status"] == "success" and big["kept"] is False, big
            assert "quota" in big["store_error"], big
            used = stored_bytes(store, "carol")
            # Its files are reserved together: none of them was written (its script was).
            assert used < 10_000, used
            listed = await carol.list_resources()
            assert not any(".bin" in r.name for r in listed.resources), listed
            fits = envelope_of(await carol.call_tool("run_python", {"code": writes(1, 500_000)}))
            assert fits.get("kept", True) is True, fits
        ok(f"one run writing ten 500 kB files is not kept and takes no room ({used} bytes), one of 500 kB then is")

    # The operator lowers the quota under what alice keeps: her runs still run and are not kept, and
    # a resume (which journals as it goes) is refused until she has room.
    with Serve(*args, "--max-stored-bytes-per-token", "100000", tokens=tokens) as serve:
        async with serve.client("alice") as alice:
            over = envelope_of(await alice.call_tool("run_python", {"code": "1 + 1"}))
            assert over["return_value"] == 2 and over["kept"] is False, over
            last = suspended[5]
            refused = await alice.call_tool(
                "resume", {"run_id": last["run_id"], "decisions": {last["suspension"]["id"]: True}})
            assert refused.is_error, refused
            error = refused.structured_content["error"]
            assert error["code"] == "quota_exceeded" and "resume" in error["message"], error
        ok("over a lowered quota a run runs with kept: false and a resume is refused with quota_exceeded")


async def a_numeric_tenant_claim_is_refused_naming_it(tmp):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwks = os.path.join(tmp, "numeric-jwks.json")
    with open(jwks, "w") as f:
        json.dump({"keys": [rsa_jwk(key, "k")]}, f)
    args = ["--no-store", "--jwks", jwks, "--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE]
    with Serve(*args, tokens={}) as serve:
        async with httpx2.AsyncClient(timeout=30) as http:
            number = token(key, "RS256", "k", 123)
            r = await http.post(serve.url, json=INIT, headers={**ACCEPT, "Authorization": f"Bearer {number}"})
            assert r.status_code == 401, (r.status_code, r.text)
            challenge = r.headers["www-authenticate"]
            assert "sub" in challenge and "string" in challenge, challenge
        async with http_client(serve.url, token(key, "RS256", "k", "123")) as digits:
            assert envelope_of(await digits.call_tool("run_python", {"code": "1"}))["return_value"] == 1
        assert "tenant=jwt:123" in serve.read_log()
    ok("a numeric tenant claim is refused naming the claim; the same digits as a string are a tenant")


def no_host_detail(text, secrets, what):
    for secret in secrets:
        assert secret not in text, f"{what} names {secret!r}: {text}"


async def no_error_a_tenant_gets_names_a_host_path(tmp):
    root = os.path.join(tmp, "private-store-root")
    store = f"file://{root}"
    secrets = [root, "file://", "/opt/", "/root/", tempfile.gettempdir() + "/"]
    tokens = {"alice": new_token()}
    args = ["--store", store, "--approval", "request_approval", "--timeout", "60",
            "--max-stored-bytes-per-token", "200000"]
    with Serve(*args, tokens=tokens) as serve:
        async with serve.client("alice") as alice:
            seen = []
            for name, arguments in [
                ("get_run_artifact", {"id": "0" * 64}),
                ("resume", {"run_id": "0" * 28, "decisions": {"s0": True}}),
                ("run_python", {"code": "1", "files": [{"name": "x", "artifact_id": "0" * 64}]}),
            ]:
                result = await alice.call_tool(name, arguments)
                assert result.is_error, result
                seen.append((name, result.structured_content["error"]["message"]))
            try:
                await alice.read_resource("runpython://artifact/" + "0" * 64)
                raise AssertionError("read a missing resource")
            except MCPError as e:
                seen.append(("resources/read", rpc_error(e)[1]))
            over = envelope_of(await alice.call_tool("run_python", {"code": writes(1, 300_000)}))
            assert over["kept"] is False, over
            seen.append(("the quota's store_error", over["store_error"]))
            install = envelope_of(await alice.call_tool(
                "run_python", {"code": "1", "dependencies": ["zzzz-no-such-package-rp==1.0"]}))
            assert install["error"]["type"] == "DependencyError", install
            seen.append(("a failed install", install["error"]["message"]))

            # The store fails under the tenant: its blobs' directory replaced by a file.
            written = envelope_of(await alice.call_tool("run_python", {"code": "open('a.txt', 'w').write('a'); 1"}))
            artifact = next(a for a in written["artifacts"] if a["name"].endswith("a.txt"))
            tenant_root = os.path.join(root, "v1", "t", "alice".encode().hex())
            shutil.rmtree(os.path.join(tenant_root, "blobs"))
            with open(os.path.join(tenant_root, "blobs"), "w") as f:
                f.write("not a directory")
            broken = await alice.call_tool("get_run_artifact", {"id": artifact["id"]})
            assert broken.is_error, broken
            seen.append(("a failing store's read", broken.structured_content["error"]["message"]))
            failing = envelope_of(await alice.call_tool("run_python", {"code": "open('b.txt', 'w').write('b'); 1"}))
            assert failing["kept"] is False, failing
            seen.append(("a failing store's store_error", failing["store_error"]))
        for what, text in seen:
            no_host_detail(text, secrets, what)
        assert root in serve.read_log(), "the operator's log lost the store failure's details"
    ok(f"no error a tenant gets names a host path or the store's URL ({', '.join(w for w, _ in seen)})")


async def main():
    with tempfile.TemporaryDirectory() as tmp:
        await a_tenants_stored_bytes_never_pass_its_quota(tmp)
        await a_numeric_tenant_claim_is_refused_naming_it(tmp)
        await no_error_a_tenant_gets_names_a_host_path(tmp)


if __name__ == "__main__":
    anyio.run(main)
