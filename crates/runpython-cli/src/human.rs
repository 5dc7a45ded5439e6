//! What a person sees in human mode: dependency progress on one status line, the outcome of a run,
//! and every text the code chose with its control characters escaped.

use std::borrow::Cow;
use std::process::ExitCode;

use runpython_core::{DepsProgress, Doctor, Envelope, Isolation, Status};
use serde_json::Value;

/// A one-line dependency progress display on stderr, only when stderr is a terminal.
pub(crate) struct StatusLine {
    tty: bool,
    shown: bool,
    frame: usize,
}

impl StatusLine {
    pub(crate) fn new() -> Self {
        use std::io::IsTerminal;
        Self {
            tty: std::io::stderr().is_terminal(),
            shown: false,
            frame: 0,
        }
    }

    pub(crate) fn show(&mut self, step: &DepsProgress) {
        if let Some(text) = step.message() {
            self.show_text(&text);
        }
    }

    /// A step as [`DepsProgress::message`] put it (here, or in the host that ran the code).
    pub(crate) fn show_text(&mut self, text: &str) {
        if !self.tty {
            return;
        }
        const SPINNER: [char; 4] = ['|', '/', '-', '\\'];
        // Package names come from the code's imports and its PEP 723 block: shown escaped.
        let text: String = escape_controls(text).chars().take(100).collect();
        self.frame += 1;
        say_err_raw!("\r\x1b[2K{} {text}", SPINNER[self.frame % SPINNER.len()]);
        self.shown = true;
    }

    pub(crate) fn clear(&mut self) {
        if self.shown {
            say_err_raw!("\r\x1b[2K");
            self.shown = false;
        }
    }
}

/// After the live output: the return value, or what went wrong.
pub(crate) fn print_human(envelope: &Envelope) {
    if let Some(truncated) = &envelope.truncated {
        for (name, t) in [("stdout", &truncated.stdout), ("stderr", &truncated.stderr)] {
            if let Some(t) = t {
                let whole = match (&t.artifact, t.artifact_truncated) {
                    (Some(id), false) => format!("; all of it: runpython artifacts get {id}"),
                    (Some(id), true) => {
                        format!("; its first 64 MiB: runpython artifacts get {id}")
                    }
                    (None, _) => String::new(),
                };
                say_err!(
                    "[runpython: the envelope keeps {} of {} characters of {name}{whole}]",
                    t.total_chars - t.omitted_chars,
                    t.total_chars
                );
            }
        }
    }
    if let Some(network) = &envelope.network {
        // One line: what the policy refused and why (each reason names the flag that would allow it).
        if let Some(first) = network.refused.first() {
            let more = network.refused.len() as u64 - 1 + network.refused_more;
            let target = match first.port {
                Some(port) => format!("{}:{port}", first.host),
                None => first.host.clone(),
            };
            let others = if more > 0 {
                format!(" (and {more} more: the run's network-log.jsonl lists them)")
            } else {
                String::new()
            };
            say_err!(
                "[runpython: the network policy refused {}: {}{others}]",
                escape_controls(&target),
                escape_controls(&first.reason)
            );
        }
    }
    if let Some(suspension) = &envelope.suspension {
        // The run waits for a person: say on what, and the command that answers.
        let tool = suspension
            .get("tool")
            .and_then(Value::as_str)
            .unwrap_or("?");
        let id = suspension.get("id").and_then(Value::as_str).unwrap_or("?");
        let args = suspension
            .get("args")
            .map(Value::to_string)
            .unwrap_or_default();
        say_err!(
            "[runpython: the run waits for a decision on {}({}) (suspension {}): `runpython resume {} \
             --decision JSON` with this run's store and tool flags continues it]",
            escape_controls(tool),
            escape_controls(&args),
            escape_controls(id),
            escape_controls(&envelope.run_id)
        );
    }
    // Everything below is what the code chose: no control character reaches the terminal raw.
    match &envelope.error {
        Some(error) => match &error.traceback {
            Some(tb) if !tb.is_empty() => say_err_raw!("{}", keep_lines(tb)),
            _ => say_err!(
                "{}: {}",
                escape_controls(&error.kind),
                keep_lines(&error.message)
            ),
        },
        None if !envelope.return_value.is_null() => match &envelope.return_value {
            Value::String(s) if envelope.return_type.as_deref() != Some("str") => {
                say!("{}", keep_lines(s))
            }
            value => say!("{value}"),
        },
        None => {}
    }
}

/// The envelope's stdout and stderr, for a run whose output was not printed as it came (a resumed
/// run's, as kept within the budget), escaped where they reach a terminal.
pub(crate) fn print_streams(envelope: &Envelope) {
    use std::io::{IsTerminal, Write as _};
    let terminal = std::io::stdout().is_terminal();
    let _ = write!(
        std::io::stdout(),
        "{}",
        for_terminal(&envelope.stdout, terminal)
    );
    let terminal = std::io::stderr().is_terminal();
    let _ = write!(
        std::io::stderr(),
        "{}",
        for_terminal(&envelope.stderr, terminal)
    );
}

/// The end of a run or resume: the envelope (as JSON, or for a person), and the exit status its
/// status gives (0 for success, 1 otherwise).
pub(crate) fn finish(envelope: &Envelope, json: bool) -> anyhow::Result<ExitCode> {
    if json {
        say!("{}", serde_json::to_string(envelope)?);
    } else {
        print_human(envelope);
        if let Some(error) = envelope.store_error.as_deref().filter(|_| !envelope.kept) {
            say_err!("runpython: the code ran, but the run was not kept: {error}");
        }
    }
    Ok(if envelope.status == Status::Success {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `runpython doctor` for a person: one fact per line.
/// The layers of a run's or an install's sandbox, one per line.
fn print_isolation(i: &Isolation) {
    let list = |items: &[String]| match items.is_empty() {
        true => "none".to_owned(),
        false => items.join(", "),
    };
    say!("  namespaces      {}", list(&i.namespaces));
    say!("  filesystem      {}", i.filesystem);
    say!("  landlock        {}", i.landlock);
    say!("  seccomp         {}", i.seccomp);
    match i.network_rules {
        Some(n) => say!("  network         {} ({n} rules)", i.network),
        None => say!("  network         {}", i.network),
    }
    say!("  uid             {}", i.uid);
    say!("  processes end   {}", i.kill);
    let limit = |bytes: Option<u64>, by: &str| match bytes {
        Some(b) => format!("{} MiB ({by})", b >> 20),
        None => format!("no limit ({by})"),
    };
    say!(
        "  memory          {}",
        limit(i.memory.bytes, &i.memory.enforced_by)
    );
    say!(
        "  disk            {}",
        limit(i.disk.bytes, &i.disk.enforced_by)
    );
    match i.cpu.cpus {
        Some(cpus) => say!("  cpu             {cpus} CPUs ({})", i.cpu.enforced_by),
        None => say!("  cpu             no limit ({})", i.cpu.enforced_by),
    }
    if let Some(n) = i.rlimits.processes {
        say!("  processes       {n}");
    }
    for missing in &i.missing {
        say!("  missing         {missing}");
    }
}

pub(crate) fn print_doctor(report: &Doctor) {
    let k = &report.kernel;
    let list = |items: &[String]| {
        if items.is_empty() {
            "none".to_owned()
        } else {
            items.join(", ")
        }
    };
    say!("kernel");
    say!("  namespaces      {}", list(&k.namespaces));
    for refused in &k.refused {
        say!("  refused         {refused}");
    }
    say!("  /proc mount     {}", k.proc_mount);
    say!("  nested userns   {}", k.nested_userns_limit);
    say!("  seccomp         {}", k.seccomp);
    let landlock = k
        .landlock_abi
        .map_or("unavailable".into(), |abi| format!("abi-{abi}"));
    say!("  landlock        {landlock}");
    say!("  cgroup          {}", k.cgroup);
    say!("  cgroup cpu      {}", k.cgroup_cpu);
    say!("  network policy  {}", k.network_policy);
    say!("a run gets");
    match (&report.isolation, &report.isolation_error) {
        (Some(i), _) => print_isolation(i),
        (None, Some(why)) => say!("  nothing: {why}"),
        (None, None) => {}
    }
    say!("an install gets");
    match &report.install_isolation {
        Ok(i) => print_isolation(i),
        Err(why) => say!("  nothing: {why}"),
    }
    let builds = match report.source_builds {
        true => "any package",
        false => "the operator's --dep specs only; the code's imports install wheels",
    };
    say!("  source builds   {builds}");
    let allowed = report
        .allowed_packages
        .as_ref()
        .map_or("any".into(), |names| list(names));
    say!("  packages        {allowed}");
    say!("where");
    say!("  python          {}", report.python);
    let cache = report
        .cache_dir
        .as_ref()
        .map_or("none (set XDG_CACHE_HOME or HOME)".into(), |d| {
            d.display().to_string()
        });
    say!("  cache           {cache}");
    say!("  environments    {}", report.environments.display());
    say!("  installer       {}", report.installer);
    let uv = report.uv.as_ref().map_or(
        "not found (RUNPYTHON_UV, RUNPYTHON_TOOLS_BIN, PATH)".into(),
        |p| p.display().to_string(),
    );
    say!("  uv              {uv}");
    say!(
        "  store           {}",
        report.store.as_deref().unwrap_or("none: runs are not kept")
    );
    let (soft, hard) = report.open_files;
    say!("  open files      {soft} (hard {hard}; serve raises it to the hard limit)");
}

/// `text` with every control character shown escaped (`\x1b`, `\n`): for one-line fields a terminal
/// prints, where the code chose the text (a file name holding ESC and a newline must not rewrite the
/// screen or forge a line).
pub(crate) fn escape_controls(text: &str) -> Cow<'_, str> {
    escape_controls_but(text, &[])
}

/// [`escape_controls`] that keeps newlines and tabs: for multi-line text (messages, tracebacks).
pub(crate) fn keep_lines(text: &str) -> Cow<'_, str> {
    escape_controls_but(text, &['\n', '\t'])
}

fn escape_controls_but<'a>(text: &'a str, keep: &[char]) -> Cow<'a, str> {
    let bad = |c: char| c.is_control() && !keep.contains(&c);
    if !text.chars().any(bad) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if bad(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// The code's own output as it goes to a terminal: control characters other than newlines and tabs
/// escaped, so it cannot move the cursor, retitle the window or write the clipboard. Piped output is
/// passed through exactly.
pub(crate) fn for_terminal(text: &str, terminal: bool) -> Cow<'_, str> {
    if terminal {
        keep_lines(text)
    } else {
        Cow::Borrowed(text)
    }
}
