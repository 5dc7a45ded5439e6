//! The CLI contract: exit statuses, human output, bad arguments.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{envelope, runpython, text};

#[test]
fn human_mode_prints_output_then_the_value() {
    let out = runpython(&["run", "-c", "print('hello')\n6 * 7"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "hello\n42\n");
}

#[test]
fn human_mode_prints_the_traceback_and_exits_1() {
    let out = runpython(&["run", "-c", "1/0"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("ZeroDivisionError"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn json_mode_prints_exactly_one_envelope() {
    let out = runpython(&["run", "--json", "-c", "print('x')\n1"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stdout"], "x\n");
    assert_eq!(v["return_value"], 1);
}

#[test]
fn code_from_a_file_and_from_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.py");
    std::fs::write(&file, "sum(range(5))").unwrap();
    let out = runpython(&["run", "--json", file.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["return_value"], 10);

    let mut child = Command::new(env!("CARGO_BIN_EXE_runpython"))
        .args(["run", "--json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"'from stdin'")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["return_value"], "from stdin");
}

fn assert_usage_error(args: &[&str], needle: &str) {
    let out = runpython(args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.stdout.is_empty(), "nothing on stdout for a usage error");
}

#[test]
fn bad_arguments_exit_2_with_a_reason() {
    assert_usage_error(
        &["run", "--timeout", "-1", "-c", "1"],
        "positive number of seconds",
    );
    assert_usage_error(&["run", "--timeout", "soon", "-c", "1"], "not a number");
    assert_usage_error(
        &["run", "/nonexistent/job.py"],
        "cannot read /nonexistent/job.py",
    );
    assert_usage_error(&["run", "--input", "novalue", "-c", "1"], "NAME=JSON");
    assert_usage_error(&["run", "--input", "x={bad", "-c", "1"], "not JSON");
    assert_usage_error(
        &["run", "--input", "1x=1", "-c", "1"],
        "not a Python identifier",
    );
    assert_usage_error(&["run", "--tool", "nocommand", "-c", "1"], "NAME=COMMAND");
    assert_usage_error(
        &["run", "--max-output-chars", "0", "-c", "1"],
        "max-output-chars",
    );
    assert_usage_error(&["run"], "no code given");
    assert_usage_error(
        &["run", "--python", "/nonexistent/python3", "-c", "1"],
        "/nonexistent/python3",
    );
    assert_usage_error(&["frobnicate"], "unrecognized subcommand");
}

#[test]
fn memo_with_a_file_store_serves_the_second_run_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let args = [
        "run",
        "--json",
        "--memo",
        "--store",
        &store,
        "-c",
        "import time\ntime.time_ns()",
    ];
    let first = envelope(&runpython(&args));
    let second = envelope(&runpython(&args));
    assert_eq!(
        (first["cached"].as_bool(), second["cached"].as_bool()),
        (Some(false), Some(true))
    );
    assert_eq!(first["return_value"], second["return_value"]);
}

#[test]
fn a_file_the_code_wrote_is_listed_and_returned_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let code = "open('data.bin', 'wb').write(bytes([0, 255, 10, 13]) * 1000)";
    let e = envelope(&runpython(&[
        "run", "--json", "--store", &store, "-c", code,
    ]));
    let run_id = e["run_id"].as_str().unwrap();
    let listed = runpython(&[
        "artifacts",
        "list",
        "--run",
        run_id,
        "--json",
        "--store",
        &store,
    ]);
    assert_eq!(listed.status.code(), Some(0), "{}", text(&listed.stderr));
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let file = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "data.bin")
        .unwrap();
    assert_eq!(file["kind"], "file");
    let got = runpython(&[
        "artifacts",
        "get",
        file["id"].as_str().unwrap(),
        "--store",
        &store,
    ]);
    assert_eq!(got.status.code(), Some(0));
    assert_eq!(got.stdout, [0u8, 255, 10, 13].repeat(1000));
    let table = text(&runpython(&["artifacts", "list", "--store", &store]).stdout);
    assert!(
        table.contains("data.bin") && table.contains(run_id),
        "{table}"
    );
    // A manifest that cannot be read is skipped with a warning, not a failed listing.
    std::fs::write(dir.path().join("v1/runs/torn"), b"not a record").unwrap();
    let listed = runpython(&["artifacts", "list", "--store", &store]);
    assert_eq!(listed.status.code(), Some(0), "{}", text(&listed.stderr));
    assert!(text(&listed.stdout).contains("data.bin"));
    assert!(
        text(&listed.stderr).contains("skipped the run manifest v1/runs/torn"),
        "{}",
        text(&listed.stderr)
    );
}

#[test]
fn a_passed_through_secret_is_stored_masked() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let out = Command::new(env!("CARGO_BIN_EXE_runpython"))
        .args([
            "run",
            "--json",
            "--store",
            &store,
            "--env-passthrough",
            "RP_CLI_API_KEY",
        ])
        .args(["-c", "import os\nprint(os.environ['RP_CLI_API_KEY'])"])
        .env("RP_CLI_API_KEY", "sk-live-abcdef123456")
        .output()
        .unwrap();
    let e = envelope(&out);
    // The envelope carries the output itself; the run's listing names the kept copy.
    let listed = runpython(&[
        "artifacts",
        "list",
        "--run",
        e["run_id"].as_str().unwrap(),
        "--json",
        "--store",
        &store,
    ]);
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let stdout = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["kind"] == "stdout")
        .unwrap();
    let kept = runpython(&[
        "artifacts",
        "get",
        stdout["id"].as_str().unwrap(),
        "--store",
        &store,
    ]);
    assert_eq!(text(&kept.stdout), "[REDACTED:RP_CLI_API_KEY]\n");
}

#[test]
fn store_errors_exit_2_with_the_url() {
    let out = runpython(&["artifacts", "get", "0000", "--store", "nope://x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("nope://x"),
        "{}",
        text(&out.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let out = runpython(&["artifacts", "get", &"ab".repeat(32), "--store", &store]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a missing artifact is a clear error"
    );
    let out = runpython(&["gc", "--store", &store]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn run_then_resume_in_fresh_processes_calls_the_side_effect_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let log = dir.path().join("pay.log");
    let tool = format!("pay=cat >> {}; echo '\"paid\"'", log.display());
    let code = "r = pay(10)\nok = request_approval('more?')\n[r, ok, pay(20) if ok else None]";
    let engine = [
        "--store",
        &store,
        "--tool",
        &tool,
        "--approval",
        "request_approval",
    ];
    let mut args = vec!["run", "--json", "-c", code];
    args.extend(engine);
    let out = runpython(&args);
    assert_eq!(out.status.code(), Some(1), "suspended is not success");
    let e = envelope(&out);
    assert_eq!(e["status"], "suspended");
    let run_id = e["run_id"].as_str().unwrap().to_owned();
    let mut args = vec!["resume", &run_id, "--decision", "true", "--json"];
    args.extend(engine);
    let out = runpython(&args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        envelope(&out)["return_value"],
        serde_json::json!(["paid", true, "paid"])
    );
    let calls = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        calls.matches("\"args\"").count(),
        2,
        "each payment exactly once: {calls}"
    );
    let out = runpython(&args);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("already finished"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_host_killed_mid_call_is_resumed_and_only_that_call_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let log = dir.path().join("calls.log");
    let step = format!("step=echo step >> {}; echo 1", log.display());
    let slow = format!(
        "slow=echo slow-start >> {0}; sleep 2; echo slow-end >> {0}; echo 2",
        log.display()
    );
    let code = "a = step()\nb = slow()\nok = request_approval('done?')\n[a, b, ok]";
    let engine = [
        "--store",
        &store,
        "--tool",
        &step,
        "--tool",
        &slow,
        "--approval",
        "request_approval",
    ];
    let mut args = vec!["run", "--json", "-c", code];
    args.extend(engine);
    let mut host = Command::new(env!("CARGO_BIN_EXE_runpython"))
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("slow-start")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the slow tool never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    host.kill().unwrap(); // SIGKILL: the host dies between `executing` and `applied`
    host.wait().unwrap();
    // The run is found through the listing: the one run there, interrupted.
    let listed = envelope(&runpython(&["runs", "--json", "--store", &store]));
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["state"], "running");
    let run_id = listed[0]["run_id"].as_str().unwrap().to_owned();
    let mut resume = vec!["resume", &run_id, "--json"];
    resume.extend(engine);
    let e = envelope(&runpython(&resume));
    assert_eq!(e["status"], "suspended", "{e}");
    let calls = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        calls.matches("step").count(),
        1,
        "the applied call was replayed: {calls}"
    );
    assert_eq!(
        calls.matches("slow-start").count(),
        2,
        "the unfinished call ran again: {calls}"
    );
    assert_eq!(
        calls.matches("slow-end").count(),
        1,
        "the first attempt's tool died with its host: {calls}"
    );
    let mut finish = vec!["resume", &run_id, "--decision", "\"ok\"", "--json"];
    finish.extend(engine);
    let e = envelope(&runpython(&finish));
    assert_eq!(e["return_value"], serde_json::json!([1, 2, "ok"]), "{e}");
}

#[test]
fn the_hosts_loopback_takes_an_explicit_flag() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let code = format!(
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n    r = 'connected'\nexcept OSError as e:\n    r = type(e).__name__\nr"
    );
    let off = envelope(&runpython(&["run", "--json", "--no-store", "-c", &code]));
    assert_ne!(off["return_value"], "connected", "{off}");
    // The public internet is never the host's loopback.
    let public = envelope(&runpython(&[
        "run",
        "--json",
        "--no-store",
        "--allow-network",
        "-c",
        &code,
    ]));
    assert_ne!(public["return_value"], "connected", "{public}");
    // Naming it, or sharing the host's network, reaches it.
    let named = format!("127.0.0.1:{port}");
    for flags in [
        vec!["--allow-host", named.as_str()],
        vec!["--network", "host"],
    ] {
        let mut args = vec!["run", "--json", "--no-store"];
        args.extend(flags.iter().copied());
        args.extend(["-c", code.as_str()]);
        let on = envelope(&runpython(&args));
        assert_eq!(on["return_value"], "connected", "{flags:?}: {on}");
        // Every requested layer was in force: the JSON envelope spends nothing on the report.
        assert!(on.get("isolation").is_none(), "{on}");
    }
    // Contradictory flags are the caller's error.
    let out = runpython(&[
        "run",
        "--no-store",
        "--network",
        "host",
        "--allow-network",
        "-c",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let out = runpython(&["run", "--no-store", "--allow-host", "*.com", "-c", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("public suffix"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn tool_spec_in_mcps_shape_marks_session_ids_for_a_header_and_the_providers_do_not() {
    let spec = |format: &str| {
        let out = runpython(&["tool-spec", "--format", format, "--no-store"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let mcp = spec("mcp");
    assert_eq!(mcp[0]["name"], "run_python");
    assert_eq!(
        mcp[0]["inputSchema"]["properties"]["session_id"]["x-mcp-header"],
        "Session-Id"
    );
    for format in ["anthropic", "openai"] {
        let text = spec(format).to_string();
        assert!(
            text.contains("session_id") && !text.contains("x-mcp-header"),
            "{text}"
        );
    }
}

#[test]
fn a_reader_that_goes_away_is_not_a_panic() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_runpython"))
        .args(["tool-spec", "--format", "mcp", "--no-store"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // like `| head -c 0`: stdout is closed before anything is written
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn human_mode_escapes_the_control_characters_the_code_chose() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    // A file name holding ESC (a terminal escape) and a newline (a forged line), and an exception
    // whose message holds an escape too.
    let code = "open('a\\x1b[31mred\\nforged.txt', 'w').write('x')\nraise ValueError('\\x1b]0;title\\x07 boom')";
    let out = runpython(&["run", "-c", code, "--store", &store]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(!err.contains('\x1b') && !err.contains('\x07'), "{err:?}");
    assert!(err.contains("\\u{1b}]0;title"), "{err:?}");
    let out = runpython(&["artifacts", "list", "--store", &store]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    assert!(!listed.contains('\x1b'), "{listed:?}");
    let line = listed
        .lines()
        .find(|l| l.contains("red"))
        .unwrap_or_else(|| panic!("{listed:?}"));
    assert!(line.ends_with("a\\u{1b}[31mred\\nforged.txt"), "{line:?}");
}

#[test]
fn the_repl_keeps_state_across_inputs_and_shows_values_as_python_does() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_runpython"))
        .arg("repl")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"x = 2\ndef f(v):\n    return {'v': v * 21, 'ok': True}\n\nf(x)\n1/0\nx\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "{'v': 42, 'ok': True}\n2\n");
    assert!(
        text(&out.stderr).contains("ZeroDivisionError"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn human_mode_says_what_a_suspended_run_waits_for_and_resume_prints_its_output() {
    // Both were silent: a suspended run printed nothing, and a resumed run's output (not streamed)
    // never reached the terminal.
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let code = "answer = ask('deploy?')\nprint('the person said', answer)";
    let out = runpython(&["run", "--approval", "ask", "--store", &store, "-c", code]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("waits for a decision on ask("), "{err}");
    assert!(
        err.contains("deploy?") && err.contains("suspension s0"),
        "{err}"
    );
    let run_id = err
        .split("runpython resume ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .to_owned();
    let resumed = runpython(&[
        "resume",
        &run_id,
        "--approval",
        "ask",
        "--store",
        &store,
        "--decision",
        "\"yes\"",
    ]);
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed.stderr));
    assert_eq!(text(&resumed.stdout), "the person said yes\n");
}

/// Two callers with different `PATH`s (a terminal and an MCP client, say), each finding `python3`
/// through a shim: each shim is asked what it starts once, not again on every run after the other.
#[test]
fn runs_from_two_paths_ask_each_shim_once() {
    let t = tempfile::tempdir().unwrap();
    let real = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    let real = text(&real.stdout).trim().to_owned();
    let shims: Vec<_> = ["a", "b"]
        .iter()
        .map(|name| {
            use std::os::unix::fs::PermissionsExt;
            let dir = t.path().join(name);
            std::fs::create_dir(&dir).unwrap();
            let shim = dir.join("python3");
            let log = dir.join("asked");
            std::fs::write(
                &shim,
                format!(
                    "#!/bin/sh\necho asked >> '{}'\nexec '{real}' \"$@\"\n",
                    log.display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
            (dir, log)
        })
        .collect();
    for (dir, _) in [&shims[0], &shims[1], &shims[0], &shims[1]] {
        let out = Command::new(env!("CARGO_BIN_EXE_runpython"))
            .args(["run", "--no-store", "--json", "-c", "1+1"])
            .env("PATH", format!("{}:/usr/bin:/bin", dir.display()))
            .env("XDG_CACHE_HOME", t.path().join("cache"))
            .env_remove("RUNPYTHON_PYTHON")
            .output()
            .unwrap();
        let e = envelope(&out);
        assert_eq!(e["return_value"], 2, "{e}");
    }
    for (dir, log) in &shims {
        let asked = std::fs::read_to_string(log).unwrap_or_default();
        assert_eq!(asked.lines().count(), 1, "{}: {asked:?}", dir.display());
    }
}
