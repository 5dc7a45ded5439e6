//! The hostile-install suite: what the model imports is installed inside the boundary. Through the
//! CLI, as a user would, against a package index built by `hostile_install/index.py` and served on
//! loopback. CI runs it as root and as an unprivileged user with HOME under /tmp.
//!
//! Each case shows the host untouched: no file outside the new environment (HOME, the index and the
//! environments' root are listed before and after), no process left behind (a marker in the argv of
//! what the build starts), and a later run of another package unaffected.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use common::{envelope, text};
use serde_json::{json, Value};

/// Built once per process: the index directory and the server in front of it.
struct Index {
    index_dir: tempfile::TempDir,
    dir: PathBuf,
    port: u16,
    log: PathBuf,
    _server: ServerGuard,
    /// What the build backends were told (paths, markers), shared by every case.
    config: Value,
    /// Where the backends look for the host's secret and try to write: a HOME of the suite's own.
    home: PathBuf,
    home_dir: tempfile::TempDir,
    socket: PathBuf,
    _listeners: (UnixListener, UnixListener),
    /// Another server on the host's loopback, not the index: no install may reach it.
    exfil: std::net::TcpListener,
}

struct ServerGuard(Child);

impl Drop for ServerGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const SECRET: &str = "runpython-hostile-install-secret-7f3a";
const DAEMON_MARKER: &str = "4242.4242";
const SLOW_MARKER: &str = "4343.4343";

/// A Python 3 to build and serve the index with: `RUNPYTHON_PYTHON`, else `python3` on `PATH`.
fn python3() -> PathBuf {
    std::env::var_os("RUNPYTHON_PYTHON").map_or_else(|| PathBuf::from("python3"), PathBuf::from)
}

static INDEX: OnceLock<Index> = OnceLock::new();

/// Removes the suite's two directories when the test process exits: [`INDEX`] is a static, which is
/// never dropped, so its `TempDir`s would stay in the temp directory after every run of the suite.
extern "C" fn remove_index_dirs() {
    if let Some(index) = INDEX.get() {
        let _ = std::fs::remove_dir_all(index.index_dir.path());
        let _ = std::fs::remove_dir_all(index.home_dir.path());
    }
}

fn index() -> &'static Index {
    INDEX.get_or_init(|| {
        // SAFETY: registers a function of this file that only removes two directories.
        unsafe { libc::atexit(remove_index_dirs) };
        let home_dir = tempfile::Builder::new()
            .prefix("runpython-hostile-home-")
            .tempdir_in(std::env::temp_dir())
            .unwrap();
        let home = home_dir.path().to_owned();
        std::fs::write(home.join("secret.txt"), SECRET).unwrap();
        let socket = home.join("host.sock");
        let abstract_name = format!("runpython-hostile-{}", std::process::id());
        let path_listener = UnixListener::bind(&socket).unwrap();
        let abstract_listener = {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(&abstract_name).unwrap();
            UnixListener::bind_addr(&addr).unwrap()
        };
        for l in [&path_listener, &abstract_listener] {
            l.set_nonblocking(true).unwrap();
        }
        let dir = tempfile::Builder::new()
            .prefix("runpython-hostile-index-")
            .tempdir_in(std::env::temp_dir())
            .unwrap();
        let files = dir.path().join("files");
        let log = dir.path().join("requests.log");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile_install/index.py");
        // The server first: the backends phone home to it.
        let mut server = Command::new(python3())
            .arg(&script)
            .arg("serve")
            .arg(&files)
            .arg(&log)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(server.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port: u16 = line.trim().parse().unwrap();
        let exfil = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        exfil.set_nonblocking(true).unwrap();
        let exfil_port = exfil.local_addr().unwrap().port();
        let tmp = std::env::temp_dir();
        let config = json!({
            "secret": home.join("secret.txt"),
            "home": home,
            // Every case's environments: the build looks for them all.
            "env_root": tmp.join("runpython-hostile-cache-*").join("runpython/envs"),
            "targets": [
                home.join("pwned"),
                home.with_extension("pwned-beside"),
                files.join("pwned"),
                tmp.join(format!("runpython-pwned-{}", std::process::id())),
            ],
            "pth_marker": tmp.join(format!("runpython-pth-ran-{}", std::process::id())),
            "socket": socket,
            "abstract": abstract_name,
            "daemon_marker": DAEMON_MARKER,
            "slow_marker": SLOW_MARKER,
            "phone_home": format!("http://127.0.0.1:{port}/phone-home"),
            "exfiltrate": format!("http://127.0.0.1:{exfil_port}/steal"),
            "bomb_bytes": 256 << 20,
            "traversal_name": format!("runpython-traversal-{}", std::process::id()),
        });
        let built = Command::new(python3())
            .arg(&script)
            .arg("build")
            .arg(&files)
            .arg(config.to_string())
            .status()
            .unwrap();
        assert!(built.success(), "the index was not built");
        Index {
            dir: files,
            index_dir: dir,
            port,
            log,
            _server: ServerGuard(server),
            config,
            home,
            home_dir,
            socket,
            _listeners: (path_listener, abstract_listener),
            exfil,
        }
    })
}

/// One case's own environments root, and the CLI pointed at the index with it.
struct Case {
    cache: tempfile::TempDir,
}

impl Case {
    /// A case whose runpython files (its interpreter cache, its code dir) exist already: one run that
    /// needs nothing installed.
    fn new() -> Self {
        let case = Self {
            cache: tempfile::Builder::new()
                .prefix("runpython-hostile-cache-")
                .tempdir_in(std::env::temp_dir())
                .unwrap(),
        };
        success(&case.run(&[], "1"));
        case
    }

    fn env_root(&self) -> PathBuf {
        self.cache.path().join("runpython/envs")
    }

    /// `runpython run --json --no-store ARGS -c CODE` with HOME the suite's, the index the only one.
    fn run(&self, args: &[&str], code: &str) -> Output {
        let ix = index();
        let mut command = Command::new(env!("CARGO_BIN_EXE_runpython"));
        command
            .args(["run", "--json", "--no-store"])
            .args(args)
            .args(["-c", code])
            .env_clear()
            .env("HOME", &ix.home)
            .env("XDG_CACHE_HOME", self.cache.path())
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env(
                "UV_INDEX_URL",
                format!("http://127.0.0.1:{}/simple/", ix.port),
            )
            .env(
                "PIP_INDEX_URL",
                format!("http://127.0.0.1:{}/simple/", ix.port),
            )
            .stdin(Stdio::null());
        for name in ["RUNPYTHON_TOOLS_BIN", "RUNPYTHON_PYTHON", "RUNPYTHON_UV"] {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
        command.output().unwrap()
    }
}

/// Every path under `dir` with its size and modification time (links not followed).
fn listing(dir: &Path) -> BTreeMap<PathBuf, (u64, SystemTime)> {
    let mut out = BTreeMap::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(d) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = path.symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                pending.push(path.clone());
            }
            out.insert(path, (meta.len(), meta.modified().unwrap()));
        }
    }
    out
}

/// What changed between two listings: added, removed or modified paths.
fn changed(
    before: &BTreeMap<PathBuf, (u64, SystemTime)>,
    after: &BTreeMap<PathBuf, (u64, SystemTime)>,
) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = after
        .iter()
        .filter(|(p, v)| before.get(*p) != Some(v))
        .map(|(p, _)| p.clone())
        .collect();
    paths.extend(before.keys().filter(|p| !after.contains_key(*p)).cloned());
    paths
}

/// The host's paths the suite watches: HOME, the index, beside HOME, /tmp's top level.
fn host_listing(case: &Case) -> BTreeMap<PathBuf, (u64, SystemTime)> {
    let ix = index();
    let mut all = listing(&ix.home);
    all.extend(listing(&ix.dir));
    all.extend(listing(case.cache.path()));
    all
}

/// Processes whose argv holds `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(marker) {
                found.push(format!("{pid}: {cmdline}"));
            }
        }
    }
    found
}

fn no_process_with(marker: &str) {
    // Nothing should be left at once; allow the kernel a moment to finish reaping.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let left = processes_with(marker);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "left running: {left:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn requests(path: &str) -> usize {
    std::fs::read_to_string(&index().log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(path))
        .count()
}

fn accepted(listener: &UnixListener) -> bool {
    listener.accept().is_ok()
}

fn success(out: &Output) -> Value {
    let e = envelope(out);
    assert_eq!(e["status"], "success", "{e}\nstderr: {}", text(&out.stderr));
    e
}

fn dependency_error(out: &Output) -> Value {
    let e = envelope(out);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert_eq!(e["error"]["type"], "DependencyError", "{e}");
    e
}

/// Only the new environment (and its lock) may have appeared under the environments' root.
fn only_new_environment(changes: &[PathBuf], case: &Case) {
    let root = case.env_root();
    let unexpected: Vec<&PathBuf> = changes
        .iter()
        .filter(|p| {
            !(p.starts_with(root.join("envs"))
                || p.starts_with(root.join("locks"))
                || p.starts_with(root.join("building"))
                // Directories whose entries changed: any new entry is listed on its own.
                || *p == &root
                || Some(p.as_path()) == root.parent())
        })
        .collect();
    assert!(unexpected.is_empty(), "the host changed: {unexpected:?}");
}

#[test]
fn a_hostile_build_backend_reaches_nothing_of_the_host() {
    let ix = index();
    let case = Case::new();
    // An environment of another package, prepared first: the build will look for it.
    let good = success(&case.run(&[], "import goodpkg\ngoodpkg.VALUE"));
    assert_eq!(good["return_value"], "good");
    let before = host_listing(&case);
    let phoned = requests("/phone-home/evilbuild");

    let out = case.run(
        &["--dep", "evilbuild"],
        "import evilbuild, json\njson.dumps(evilbuild.RESULTS)",
    );
    let e = success(&out);
    let results: Value = serde_json::from_str(e["return_value"].as_str().unwrap()).unwrap();
    // The build ran (it phoned home through the index), inside the sandbox.
    assert!(requests("/phone-home/evilbuild") > phoned, "{results}");
    assert!(
        results["secret"].as_str().unwrap().starts_with("refused"),
        "{results}"
    );
    assert!(!out
        .stdout
        .windows(SECRET.len())
        .any(|w| w == SECRET.as_bytes()));
    assert!(!out
        .stderr
        .windows(SECRET.len())
        .any(|w| w == SECRET.as_bytes()));
    assert!(
        results["home_listing"]
            .as_str()
            .is_some_and(|s| s.starts_with("refused")),
        "{results}"
    );
    for kind in ["socket_path", "socket_abstract"] {
        assert!(
            results[kind].as_str().unwrap().starts_with("refused"),
            "{results}"
        );
    }
    assert!(!accepted(&ix._listeners.0) && !accepted(&ix._listeners.1));
    // Its network is the index's alone: another server of the host's was not reached.
    assert!(
        results["exfiltrated"]
            .as_str()
            .is_some_and(|s| s.starts_with("refused")),
        "{results}"
    );
    assert!(
        ix.exfil.accept().is_err(),
        "the install reached a host server beside the index"
    );
    // Whatever it wrote stayed in its sandbox: nothing on the host but the new environment.
    for target in ix.config["targets"].as_array().unwrap() {
        assert!(!Path::new(target.as_str().unwrap()).exists(), "{target}");
    }
    only_new_environment(&changed(&before, &host_listing(&case)), &case);
    let good_site = std::fs::read_dir(case.env_root().join("envs"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("site"))
        .filter(|site| site.join("goodpkg.py").exists())
        .collect::<Vec<_>>();
    assert_eq!(good_site.len(), 1);
    assert!(!good_site[0].join("evil.pth").exists());
    // The daemon it started did not outlive the install.
    no_process_with(DAEMON_MARKER);

    // A later run of another package is unaffected: no planted .pth ran.
    let later = success(&case.run(
        &[],
        "import goodpkg, otherpkg\n(goodpkg.VALUE, otherpkg.VALUE)",
    ));
    assert_eq!(later["return_value"], json!(["good", "other"]));
    assert!(!Path::new(ix.config["pth_marker"].as_str().unwrap()).exists());
    let _ = &ix.socket;
}

#[test]
fn importing_a_source_only_package_is_refused_without_a_build_and_the_operator_may_build_it() {
    let case = Case::new();
    let phoned = requests("/phone-home/srconly");
    let out = case.run(&[], "import srconly");
    let e = dependency_error(&out);
    let message = e["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("srconly has no wheel") && message.contains("--dep srconly"),
        "{message}"
    );
    assert_eq!(
        e["dependencies"]["refused"],
        json!([{"name": "srconly", "source": "import", "reason": "source build"}])
    );
    assert_eq!(requests("/phone-home/srconly"), phoned, "a build ran");
    assert!(
        !case.env_root().join("envs").exists() || listing(&case.env_root().join("envs")).is_empty()
    );

    // Named by the operator, it builds (inside the sandbox) and imports.
    let built = success(&case.run(&["--dep", "srconly"], "import srconly\n'ok'"));
    assert_eq!(built["return_value"], "ok");
    let after_dep = requests("/phone-home/srconly");
    assert!(after_dep > phoned, "no build ran");
    let sources: Vec<&Value> = built["dependencies"]["installed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| &d["source"])
        .collect();
    assert_eq!(sources, [&json!("operator")]);

    // So does any package with --allow-source-builds (a fresh environments' root: no cached env).
    let other = Case::new();
    let out = other.run(&["--allow-source-builds"], "import srconly\n'ok'");
    assert_eq!(success(&out)["return_value"], "ok");
    assert!(requests("/phone-home/srconly") > after_dep, "no build ran");
    no_process_with(DAEMON_MARKER);
}

#[test]
fn a_zip_bomb_stops_at_the_install_disk_cap_and_leaves_nothing() {
    let case = Case::new();
    let before = host_listing(&case);
    let started = Instant::now();
    let out = case.run(&["--install-disk", "64M"], "import zipbomb");
    let e = dependency_error(&out);
    let message = e["error"]["message"].as_str().unwrap();
    eprintln!("the zip bomb: {message}");
    assert!(message.contains("out of the install's disk"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(60));
    let changes = changed(&before, &host_listing(&case));
    only_new_environment(&changes, &case);
    // No environment was made, and nothing half-built is left.
    let envs = case.env_root().join("envs");
    assert!(!envs.exists() || listing(&envs).is_empty(), "{changes:?}");
    let building = case.env_root().join("building");
    assert!(!building.exists() || listing(&building).is_empty());
    // A later run of another package is unaffected.
    let later = success(&case.run(&[], "import otherpkg\notherpkg.VALUE"));
    assert_eq!(later["return_value"], "other");
}

#[test]
fn a_wheel_whose_members_climb_out_writes_nothing_outside_its_environment() {
    let ix = index();
    let case = Case::new();
    let before = host_listing(&case);
    let out = case.run(&[], "import traversal\ntraversal.VALUE");
    let name = ix.config["traversal_name"].as_str().unwrap();
    let tmp = std::env::temp_dir();
    for planted in [
        tmp.join(name),
        tmp.join(format!("{name}-abs")),
        Path::new("/tmp").join(name),
    ] {
        assert!(!planted.exists(), "{} was written", planted.display());
    }
    only_new_environment(&changed(&before, &host_listing(&case)), &case);
    // uv refuses such a wheel; if an installer took it, the members stayed inside the environment.
    let e = envelope(&out);
    eprintln!("the traversing wheel: {e}");
    if e["status"] != "success" {
        assert_eq!(e["error"]["type"], "DependencyError", "{e}");
    }
    let later = success(&case.run(&[], "import otherpkg\notherpkg.VALUE"));
    assert_eq!(later["return_value"], "other");
}

#[test]
fn an_install_past_its_deadline_is_killed_with_everything_it_started() {
    let case = Case::new();
    let before = host_listing(&case);
    let started = Instant::now();
    let out = case.run(
        &["--dep", "slowbuild", "--install-timeout", "3"],
        "import slowbuild",
    );
    let e = dependency_error(&out);
    let message = e["error"]["message"].as_str().unwrap();
    assert!(message.contains("did not finish"), "{message}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    no_process_with(SLOW_MARKER);
    let changes = changed(&before, &host_listing(&case));
    only_new_environment(&changes, &case);
    let envs = case.env_root().join("envs");
    assert!(!envs.exists() || listing(&envs).is_empty(), "{changes:?}");
}
