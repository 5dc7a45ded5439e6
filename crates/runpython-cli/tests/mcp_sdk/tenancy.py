"""Tenants apart in `runpython serve`, driven by the official MCP Python SDK client: two tokens (alice
and bob) on a file store and on S3 (moto on loopback), then two OAuth tenants (JWTs signed by test
keys, checked against a JWKS file and a JWKS served on loopback). Every read path refuses the other
tenant's ids exactly as it refuses missing ones and lists only the caller's own; the owner still reads
and resumes her own; a memo entry never crosses tenants; session ids come back as passed; a tenant
over its stored-bytes quota gets `kept: false`; the operator's CLI sees every tenant or one; refused
tokens get 401 with `WWW-Authenticate`; the resource metadata is where MCP clients look for it."""

import base64
import http.server
import json
import os
import re
import socket
import subprocess
import tempfile
import threading
import time

import anyio
import httpx2
import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from mcp.shared.exceptions import MCPError
from moto.server import ThreadedMotoServer

from common import BIN, Serve, envelope_of, http_client, new_token, ok, rpc_error, wait_for

SSN = "078-05-1120"
CSV_CODE = (
    "with open('people.csv', 'w') as f:\n"
    f"    f.write('name,ssn\\nAlice Example,{SSN}\\n')\n"
    "'written'"
)
APPROVAL_CODE = "ok = request_approval('pay 100 EUR to ACME?')\n'paid' if ok else 'held'"
MEMO_CODE = "sum(i * i for i in range(2000))"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def another_id(id_):
    """An id of the same shape that no one has: its last character changed."""
    last = id_[-1]
    swap = "0" if last != "0" else "1"
    return id_[:-1] + swap


def error_of(result):
    assert result.is_error, result
    return result.structured_content["error"]


def same_but_id(a, b, id_a, id_b):
    """Two error messages are the same once each names its own id."""
    return a.replace(id_a, "<id>") == b.replace(id_b, "<id>")


def cli(*args, check=True):
    out = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120)
    if check:
        assert out.returncode == 0, (args, out.returncode, out.stdout, out.stderr)
    return out


async def refused_like_missing(bob, artifact_id, run_id, label):
    """Every read path bob has refuses alice's ids exactly as ids no one has."""
    missing_artifact, missing_run = another_id(artifact_id), another_id(run_id)

    theirs = error_of(await bob.call_tool("get_run_artifact", {"id": artifact_id}))
    nobody = error_of(await bob.call_tool("get_run_artifact", {"id": missing_artifact}))
    assert theirs["code"] == nobody["code"] == "not_found", (theirs, nobody)
    assert same_but_id(theirs["message"], nobody["message"], artifact_id, missing_artifact), (theirs, nobody)
    assert SSN not in json.dumps(theirs)
    ok(f"{label}: get_run_artifact of another tenant's id answers exactly like a missing id")

    answers = []
    for uri_id in (artifact_id, missing_artifact):
        try:
            await bob.read_resource(f"runpython://artifact/{uri_id}")
            raise AssertionError("resources/read of another tenant's artifact succeeded")
        except MCPError as e:
            answers.append(rpc_error(e))
    (code_a, msg_a, _), (code_b, msg_b, _) = answers
    assert code_a == code_b and same_but_id(msg_a, msg_b, artifact_id, missing_artifact), answers
    ok(f"{label}: resources/read of another tenant's artifact answers exactly like a missing one")

    reads = []
    for read_id in (artifact_id, missing_artifact):
        code = (
            "out = {}\n"
            f"for f in (read_artifact, load_artifact):\n"
            "    try:\n"
            f"        f({read_id!r})\n"
            "        out[f.__name__] = 'read'\n"
            "    except Exception as e:\n"
            f"        out[f.__name__] = type(e).__name__ + ': ' + str(e).replace({read_id!r}, '<id>')\n"
            "out"
        )
        envelope = envelope_of(await bob.call_tool("run_python", {"code": code}))
        assert envelope["status"] == "success", envelope
        reads.append(envelope["return_value"])
    assert reads[0] == reads[1] and "read" not in reads[0].values(), reads
    ok(f"{label}: read_artifact and load_artifact in bob's code refuse alice's id like a missing one")

    resumed = error_of(await bob.call_tool("resume", {"run_id": run_id, "decisions": {"s0": True}}))
    nothing = error_of(await bob.call_tool("resume", {"run_id": missing_run, "decisions": {"s0": True}}))
    assert resumed["code"] == nothing["code"], (resumed, nothing)
    assert same_but_id(resumed["message"], nothing["message"], run_id, missing_run), (resumed, nothing)
    ok(f"{label}: resume of another tenant's suspended run answers exactly like a missing run")

    listed = await bob.list_resources()
    uris = [r.uri for r in listed.resources]
    assert not any(artifact_id in str(u) for u in uris), uris
    assert SSN not in json.dumps([r.model_dump(mode="json") for r in listed.resources])
    ok(f"{label}: resources/list shows bob none of alice's artifacts nor their previews")


async def two_tokens(store, label, tmp):
    tokens = {"alice": new_token(), "bob": new_token()}
    args = ["--store", store, "--approval", "request_approval", "--memo", "--timeout", "60"]
    with Serve(*args, tokens=tokens) as serve:
        async with serve.client("alice") as alice, serve.client("bob") as bob:
            written = envelope_of(await alice.call_tool("run_python", {"code": CSV_CODE}))
            assert written["status"] == "success", written
            csv = next(a for a in written["artifacts"] if a["name"].endswith("people.csv"))
            suspended = envelope_of(await alice.call_tool("run_python", {"code": APPROVAL_CODE}))
            assert suspended["status"] == "suspended", suspended
            suspension = suspended["suspension"]["id"]

            mine = envelope_of(await bob.call_tool("run_python", {"code": "open('bob.txt', 'w').write('bob'); 1"}))
            assert mine.get("kept", True) is True, mine

            await refused_like_missing(bob, csv["id"], suspended["run_id"], label)

            bob_uris = {str(r.uri) for r in (await bob.list_resources()).resources}
            assert any(a["id"] in u for a in mine["artifacts"] for u in bob_uris), (bob_uris, mine)
            alice_uris = {str(r.uri) for r in (await alice.list_resources()).resources}
            assert any(csv["id"] in u for u in alice_uris), alice_uris
            assert not any(a["id"] in u for a in mine["artifacts"] for u in alice_uris), alice_uris
            ok(f"{label}: each tenant's resources/list shows its own")

            own = await alice.call_tool("get_run_artifact", {"id": csv["id"]})
            assert not own.is_error and SSN in json.dumps(own.structured_content), own
            read = await alice.read_resource(f"runpython://artifact/{csv['id']}")
            assert SSN in read.contents[0].text, read
            code = f"read_artifact({csv['id']!r}).decode()"
            in_code = envelope_of(await alice.call_tool("run_python", {"code": code}))
            assert SSN in in_code["return_value"], in_code
            resumed = envelope_of(await alice.call_tool(
                "resume", {"run_id": suspended["run_id"], "decisions": {suspension: True}}))
            assert resumed["status"] == "success" and resumed["return_value"] == "paid", resumed
            ok(f"{label}: the owner still reads her artifact (tool, resource, code) and resumes her run")

            first = envelope_of(await alice.call_tool("run_python", {"code": MEMO_CODE}))
            hit = envelope_of(await alice.call_tool("run_python", {"code": MEMO_CODE}))
            assert first["cached"] is False and hit["cached"] is True, (first, hit)
            other = envelope_of(await bob.call_tool("run_python", {"code": MEMO_CODE}))
            assert other["cached"] is False and other["run_id"] != first["run_id"], other
            ok(f"{label}: alice's memoized run is a hit for alice and not for bob")

            cell = envelope_of(await alice.call_tool("run_python", {"code": "secret = 42", "session_id": "s"}))
            assert cell["session_id"] == "s", cell
            theirs = envelope_of(await bob.call_tool("run_python", {"code": "'secret' in globals()", "session_id": "s"}))
            assert theirs["return_value"] is False and theirs["session_id"] == "s", theirs
            again = envelope_of(await alice.call_tool("run_python", {"code": "secret", "session_id": "s"}))
            assert again["return_value"] == 42, again
            ok(f"{label}: two tenants' sessions of one id are two sessions, each named as passed")

        log = await wait_for(lambda: "refused a cross-tenant read" in serve.read_log(), 10)
        text = serve.read_log()
        assert log, text
        refusals = [l for l in text.splitlines() if "refused a cross-tenant read" in l]
        assert all("tenant=bob" in l and "owners=alice" in l for l in refusals), refusals
        assert {a for l in refusals for a in re.findall(r'access=([a-z_]+) ', l)} >= {"get_run_artifact", "resume", "read_artifact"}, refusals
        assert SSN not in text, "the serve log holds the artifact's data"
        calls = [l for l in text.splitlines() if " call" in l and "tool=" in l]
        assert calls and all("tenant=alice" in l or "tenant=bob" in l for l in calls), calls
        ok(f"{label}: each call's log line names its tenant; refused cross-tenant reads are logged as such, without the data")

    # The operator's tools see every tenant, or the one named.
    listed = json.loads(cli("artifacts", "list", "--json", "--store", store).stdout)
    tenants = {item["tenant"] for item in listed}
    assert {"alice", "bob"} <= tenants, tenants
    only = json.loads(cli("artifacts", "list", "--json", "--store", store, "--tenant", "bob").stdout)
    assert only and {item["tenant"] for item in only} == {"bob"}, only
    got = cli("artifacts", "get", csv["id"], "--store", store)
    assert SSN in got.stdout, got
    refused = cli("artifacts", "get", csv["id"], "--store", store, "--tenant", "bob", check=False)
    assert refused.returncode == 2 and "not found in store" in refused.stderr, refused
    usage = json.loads(cli("runs", "--json", "--store", store, "--tenant", "alice").stdout)
    assert usage["tenant"] == "alice" and usage["stored_bytes"] > 0, usage
    table = cli("runs", "--store", store).stdout
    assert "tenant alice:" in table and "tenant bob:" in table, table
    as_bob = cli("run", "--store", store, "--tenant", "bob", "--json", "--input", f"data=@{csv['id']}",
                 "-c", "len(data)", check=False)
    assert as_bob.returncode == 2 and "no artifact" in as_bob.stderr, as_bob
    as_alice = cli("run", "--store", store, "--tenant", "alice", "--json", "--input", f"data=@{csv['id']}",
                   "-c", "str(data)")
    assert SSN in json.loads(as_alice.stdout)["return_value"], as_alice.stdout
    swept = cli("gc", "--store", store, "--tenant", "bob").stdout
    assert swept.startswith("tenant bob: removed"), swept
    ok(f"{label}: runs, artifacts and gc act on every tenant, or on --tenant's only, with its usage")


async def quota(tmp):
    store = f"file://{tmp}/quota"
    tokens = {"alice": new_token(), "bob": new_token()}
    # Held at every write: the first run's 200 kB fit under 300 kB, the second's would pass it.
    with Serve("--store", store, "--max-stored-bytes-per-token", "300000", "--timeout", "60", tokens=tokens) as serve:
        async with serve.client("alice") as alice, serve.client("bob") as bob:
            big = "import os\nopen('big.bin', 'wb').write(os.urandom(200_000))\n'big'"
            first = envelope_of(await alice.call_tool("run_python", {"code": big}))
            assert first.get("kept", True) is True, first
            over = envelope_of(await alice.call_tool("run_python", {"code": big}))
            assert over["status"] == "success" and over["return_value"] == "big", over
            assert over["kept"] is False and "over its stored-bytes quota" in over["store_error"], over
            for artifact in over["artifacts"]:
                if artifact.get("id"):
                    missing = await alice.call_tool("get_run_artifact", {"id": artifact["id"]})
                    assert missing.is_error, (artifact, missing)
            theirs = envelope_of(await bob.call_tool("run_python", {"code": big}))
            assert theirs.get("kept", True) is True, theirs
    runs = json.loads(cli("artifacts", "list", "--json", "--store", store, "--tenant", "alice").stdout)
    assert over["run_id"] not in {r["run_id"] for r in runs}, runs
    assert first["run_id"] in {r["run_id"] for r in runs}, runs
    ok("a run that would take its tenant over its stored-bytes quota runs with kept: false and why, nothing of it kept; the other tenant is unaffected")


def b64(n):
    raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def rsa_jwk(key, kid):
    numbers = key.public_key().public_numbers()
    return {"kty": "RSA", "kid": kid, "alg": "RS256", "use": "sig", "n": b64(numbers.n), "e": b64(numbers.e)}


def ec_jwk(key, kid):
    numbers = key.public_key().public_numbers()
    pad = lambda v: base64.urlsafe_b64encode(v.to_bytes(32, "big")).rstrip(b"=").decode()
    return {"kty": "EC", "kid": kid, "alg": "ES256", "use": "sig", "crv": "P-256", "x": pad(numbers.x), "y": pad(numbers.y)}


ISSUER = "https://auth.example.test"
AUDIENCE = "https://runpython.example.test/mcp"


def token(key, alg, kid, sub, **over):
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": now, "exp": now + 600, **over}
    return jwt.encode(claims, key, algorithm=alg, headers={"kid": kid})


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def jwt_tenants(tmp):
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwks = os.path.join(tmp, "jwks.json")
    with open(jwks, "w") as f:
        json.dump({"keys": [rsa_jwk(rsa_key, "rsa-1"), ec_jwk(ec_key, "ec-1")]}, f)
    store = f"file://{tmp}/jwt"
    args = ["--store", store, "--approval", "request_approval", "--timeout", "60", "--jwks", jwks,
            "--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE]
    with Serve(*args, tokens={"ops": new_token()}) as serve:
        alice_token = token(rsa_key, "RS256", "rsa-1", "alice")
        bob_token = token(ec_key, "ES256", "ec-1", "bob")
        async with http_client(serve.url, alice_token) as alice, http_client(serve.url, bob_token) as bob:
            written = envelope_of(await alice.call_tool("run_python", {"code": CSV_CODE}))
            csv = next(a for a in written["artifacts"] if a["name"].endswith("people.csv"))
            suspended = envelope_of(await alice.call_tool("run_python", {"code": APPROVAL_CODE}))
            assert suspended["status"] == "suspended", suspended
            ok("JWT: an RS256 and an ES256 access token are accepted")
            await refused_like_missing(bob, csv["id"], suspended["run_id"], "JWT")
            own = await alice.call_tool("get_run_artifact", {"id": csv["id"]})
            assert not own.is_error and SSN in json.dumps(own.structured_content), own
            resumed = envelope_of(await alice.call_tool(
                "resume", {"run_id": suspended["run_id"], "decisions": {suspended["suspension"]["id"]: False}}))
            assert resumed["return_value"] == "held", resumed
            ok("JWT: the owner reads and resumes her own")
        assert "tenant=jwt:alice" in serve.read_log() and "tenant=jwt:bob" in serve.read_log()

        now = int(time.time())
        refusals = {
            "an expired token": token(rsa_key, "RS256", "rsa-1", "alice", exp=now - 3600, iat=now - 7200),
            "a token for another audience": token(rsa_key, "RS256", "rsa-1", "alice", aud="https://elsewhere.test"),
            "a token from another issuer": token(rsa_key, "RS256", "rsa-1", "alice", iss="https://evil.test"),
            "a token signed by another key under a known kid": token(stranger, "RS256", "rsa-1", "alice"),
            "a token without exp": jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "sub": "alice"}, rsa_key,
                                              algorithm="RS256", headers={"kid": "rsa-1"}),
            "an HS256 token keyed with the public key": hs256_confusion(rsa_key),
            "an unsigned token": jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "exp": now + 600},
                                            None, algorithm="none"),
        }
        async with httpx2.AsyncClient(timeout=30) as http:
            for what, bad in refusals.items():
                r = await http.post(serve.url, json=INIT, headers={**ACCEPT, "Authorization": f"Bearer {bad}"})
                assert r.status_code == 401, (what, r.status_code, r.text)
                challenge = r.headers["www-authenticate"]
                assert challenge.startswith("Bearer ") and 'error="invalid_token"' in challenge, (what, challenge)
                assert 'resource_metadata="https://runpython.example.test/.well-known/oauth-protected-resource/mcp"' in challenge, challenge
            ok("JWT: an expired token, a wrong audience or issuer, a wrong signature, no exp, HS256 and none each get 401 with WWW-Authenticate")
            r = await http.post(serve.url, json=INIT, headers=ACCEPT)
            assert r.status_code == 401 and "resource_metadata=" in r.headers["www-authenticate"], r.headers
            assert "error=" not in r.headers["www-authenticate"], r.headers
            for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
                meta = (await http.get(serve.base + path)).json()
                assert meta["resource"] == AUDIENCE and meta["authorization_servers"] == [ISSUER], meta
                assert meta["bearer_methods_supported"] == ["header"], meta
            ok("JWT: a request without a token is told where the resource metadata is (RFC 9728), which names the issuer")
        assert serve.stop() == 0


def hs256_confusion(rsa_key):
    """The classic algorithm confusion: HS256 keyed with the server's public key."""
    from cryptography.hazmat.primitives import serialization
    import hashlib
    import hmac

    public = rsa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    now = int(time.time())
    enc = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
    signing = enc({"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}) + "." + enc(
        {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "exp": now + 600})
    signature = hmac.new(public, signing.encode(), hashlib.sha256).digest()
    return signing + "." + base64.urlsafe_b64encode(signature).rstrip(b"=").decode()


async def jwks_by_url(tmp):
    """A JWKS served on loopback: fetched at start, and again when a token names a key it lacks."""
    first = ec.generate_private_key(ec.SECP256R1())
    rotated = ec.generate_private_key(ec.SECP256R1())
    keys = {"keys": [ec_jwk(first, "k1")]}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(keys).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
        args = ["--no-store", "--jwks", url, "--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE]
        with Serve(*args, tokens={}) as serve:
            async with http_client(serve.url, token(first, "ES256", "k1", "carol")) as carol:
                assert envelope_of(await carol.call_tool("run_python", {"code": "1 + 1"}))["return_value"] == 2
            keys["keys"].append(ec_jwk(rotated, "k2"))
            async with http_client(serve.url, token(rotated, "ES256", "k2", "carol")) as carol:
                assert envelope_of(await carol.call_tool("run_python", {"code": "2 + 2"}))["return_value"] == 4
        ok("JWT: a JWKS by URL is fetched at start and again for a key id it lacked (rotation)")
    finally:
        server.shutdown()


async def main():
    with tempfile.TemporaryDirectory() as tmp:
        await two_tokens(f"file://{tmp}/store", "file store", tmp)
        await quota(tmp)
        await jwt_tenants(tmp)
        await jwks_by_url(tmp)
        port = free_port()
        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        moto.start()
        try:
            bucket = "runpython-tenants"
            async with httpx2.AsyncClient() as http:
                r = await http.put(f"http://127.0.0.1:{port}/{bucket}")
                assert r.status_code == 200, r.text
            store = (f"s3://{bucket}/e2e?endpoint=http://127.0.0.1:{port}&allow_http=true&region=us-east-1"
                     "&access_key_id=test&secret_access_key=test")
            await two_tokens(store, "S3 store", tmp)
        finally:
            moto.stop()


if __name__ == "__main__":
    anyio.run(main)
