//! Running an installer inside the sandbox (runpython-sandbox), so what a package's build scripts can
//! reach is what a run can reach, plus the index.
//!
//! The installer's view holds the system read-only, the interpreter and the installer read-only, the
//! operator's local index directories read-only, and its scratch: one tmpfs of the policy's
//! `disk_bytes` holding its working directory, where it installs (`work/site`), and its `HOME`, where
//! its cache lives (`home/cache`). Nothing of the host's HOME, `/run`, `/var` or `/tmp`; no other
//! environment and no shared cache. When the installer succeeds, the host copies `work/site` out of
//! the scratch beneath the descriptor it held before the installer started (regular files and
//! directories only, owned by the host, modes 0644/0755, times kept) into the environment's building
//! directory. Everything else the installer and its build backends wrote (its cache, temporary files,
//! whatever a build script planted) goes with the scratch. A timeout or a dropped future kills the
//! whole tree: its PID namespace's init kills the rest.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use runpython_egress::{Egress, Network};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

use crate::job::{installer_env, InstallJob, Progress, ProgressFn};
use crate::Error;

/// Where the installer installs, relative to its working directory (its scratch's `work/`).
pub(crate) const STAGING: &str = "site";
/// Its cache, relative to its working directory: in its scratch, gone with it.
pub(crate) const CACHE: &str = "../home/cache";

const TAIL_LINES: usize = 20;
const MAX_LINE_CHARS: usize = 400;

/// One installer command: `program` with `args`, started in the sandbox of `job`.
#[derive(Debug)]
pub(crate) struct Installer<'a> {
    pub program: &'a Path,
    /// The program is an interpreter (pip): its prefix is read too. uv is one file.
    pub program_prefix: bool,
    pub args: Vec<OsString>,
}

/// Runs `installer` to completion within `job.deadline` in `job`'s sandbox, reporting its progress
/// and keeping the tail of its output for the error; on success, copies what it installed into
/// `job.target`.
pub(crate) async fn run(installer: Installer<'_>, job: &InstallJob<'_>) -> Result<(), Error> {
    let packages = || job.specs.to_vec();
    let program_text = installer.program.display().to_string();
    let failed = |status: String, output: String| Error::Install {
        packages: packages(),
        program: program_text.clone(),
        status,
        output,
    };
    let mut command = runpython_sandbox::Command::new(installer.program)
        .program_prefix(installer.program_prefix)
        .args(&installer.args)
        .read_program(&job.interpreter.executable)
        .timeout(
            job.deadline
                .saturating_duration_since(tokio::time::Instant::now()),
        );
    for path in job.reads {
        command = command.read(path);
    }
    // Under a network policy the host's relay takes the host's proxy itself: the installer connects
    // as if direct, and its hosts are the policy's to decide.
    let relayed = matches!(job.sandbox.network, Network::Policy(_));
    for (name, value) in installer_env() {
        // The installer's HOME is its scratch's (the sandbox sets it), never the host's.
        if name == "HOME" {
            continue;
        }
        if relayed
            && name
                .to_str()
                .is_some_and(|n| n.to_ascii_lowercase().ends_with("_proxy"))
        {
            continue;
        }
        if let (Some(name), Some(value)) = (name.to_str(), value.to_str()) {
            command = command.env(name, value);
        }
    }
    let mut child = command
        .spawn(&job.sandbox.map_network(Network::mechanism))
        .map_err(|e| {
            failed(
                format!("could not be started in its sandbox: {e}"),
                String::new(),
            )
        })?;
    // The sandbox hands the install's network out; the host serves it with the install's policy
    // until the installer is done (dropped before the child, whose drop kills what is left).
    let _egress =
        match (child.take_egress(), job.sandbox.network.policy()) {
            (None, _) => None,
            (Some(channel), Some(policy)) => Some(Egress::start(channel, Arc::new(policy.clone()))),
            (Some(_), None) => return Err(failed(
                "could not be started: its sandbox mediates its network, and no policy was given"
                    .into(),
                String::new(),
            )),
        };
    let (Some(stdout), Some(stderr)) = (child.take_stdout(), child.take_stderr()) else {
        return Err(failed(
            "started without its output pipes".into(),
            String::new(),
        ));
    };
    let mut tail = VecDeque::with_capacity(TAIL_LINES);
    let run = async {
        let (mut out_lines, mut err_lines) = (BufReader::new(stdout), BufReader::new(stderr));
        let (mut out_open, mut err_open) = (true, true);
        while out_open || err_open {
            let line = tokio::select! {
                line = next_line(&mut out_lines), if out_open => line.or_else(|| { out_open = false; None }),
                line = next_line(&mut err_lines), if err_open => line.or_else(|| { err_open = false; None }),
            };
            if let Some(line) = line {
                report(&line, job.progress);
                if tail.len() == TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        }
        child.wait().await
    };
    let finished = tokio::time::timeout_at(job.deadline, run).await;
    let output = Vec::from(tail).join("\n");
    let status = match finished {
        Ok(status) => status,
        Err(_) => {
            child.kill();
            return Err(Error::InstallTimeout {
                packages: packages(),
                program: program_text,
                output,
            });
        }
    };
    match status {
        Ok(status) if status.success() => {}
        Ok(status) => {
            let mut status = status.to_string();
            if child.oom_killed() {
                status.push_str(&format!(
                    ", killed at the install's memory limit ({} bytes: raise it with --install-memory, \
                     the builder's install_sandbox)",
                    job.sandbox.run_memory_bytes
                ));
            } else if output.contains("No space left on device") {
                status.push_str(&format!(
                    ", out of the install's disk ({} bytes: raise it with --install-disk, the \
                     builder's install_sandbox)",
                    job.sandbox.disk_bytes
                ));
            }
            return Err(failed(status, output));
        }
        Err(e) => return Err(failed(format!("could not be waited for: {e}"), output)),
    }
    let staging = Path::new("work").join(STAGING);
    if !child.scratch().has_dir(&staging) {
        // Nothing to install (every spec's marker excluded it): an empty environment.
        return Ok(());
    }
    let target: PathBuf = job.target.to_owned();
    let max = job.sandbox.disk_bytes;
    // The target is an empty directory the caller made: the copy makes it anew.
    let _ = std::fs::remove_dir(&target);
    let scratch = child.scratch().try_clone().map_err(|e| {
        failed(
            format!("succeeded, but its scratch is gone: {e}"),
            output.clone(),
        )
    })?;
    let copied = tokio::task::spawn_blocking(move || scratch.copy_out(&staging, &target, max))
        .await
        .unwrap_or_else(|e| Err(runpython_sandbox::Error::Internal(e.to_string())));
    copied.map(|_| ()).map_err(|e| {
        failed(
            format!("succeeded, but what it installed could not be taken out of its sandbox: {e}"),
            output,
        )
    })
}

/// The package the installer would have had to build from source, from its words: uv's
/// "Wheels are required for `X` because building from source is disabled", pip's "Could not find a
/// version that satisfies the requirement X" under `--only-binary :all:`.
pub(crate) fn needs_source_build(output: &str) -> Option<String> {
    if let Some(rest) = output.split("Wheels are required for `").nth(1) {
        return rest
            .split('`')
            .next()
            .map(crate::requirement::normalize_name);
    }
    if let Some(rest) = output.split("satisfies the requirement ").nth(1) {
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            .collect();
        return (!name.is_empty()).then(|| crate::requirement::normalize_name(&name));
    }
    None
}

/// The next line, lossily decoded and cut to a sane length; `None` at end of stream or on a read error.
async fn next_line<R: AsyncRead + Unpin>(reader: &mut BufReader<R>) -> Option<String> {
    let mut bytes = Vec::new();
    match reader.read_until(b'\n', &mut bytes).await {
        Ok(0) | Err(_) => None,
        Ok(_) => {
            let text = String::from_utf8_lossy(&bytes);
            let text = text.trim_end();
            Some(match text.char_indices().nth(MAX_LINE_CHARS) {
                Some((cut, _)) => format!("{}…", &text[..cut]),
                None => text.to_owned(),
            })
        }
    }
}

/// Turns an installer's output line into a progress event: uv's and pip's wording.
fn report(line: &str, progress: &ProgressFn<'_>) {
    let trimmed = line.trim();
    if trimmed.starts_with("Downloading") || trimmed.starts_with("Downloaded") {
        progress(Progress::Downloading {
            detail: trimmed.to_owned(),
        });
    } else if trimmed.starts_with("Prepared")
        || trimmed.starts_with("Installing")
        || trimmed.starts_with("Installed")
        || trimmed.starts_with("Successfully installed")
    {
        progress(Progress::Installing {
            detail: trimmed.to_owned(),
        });
    }
}

impl InstallJob<'_> {
    /// Runs an installer whose arguments `args` makes (given the packages to build from source, none
    /// at first) in the job's sandbox, and takes what it installed out into `target`. When it fails
    /// for want of a wheel, the package is built from source if the job allows it (the installer runs
    /// again with `args` naming it), else the install fails with [`Error::SourceBuildRefused`]; no
    /// build script ran.
    pub(crate) async fn run_sandboxed(
        &self,
        program: &Path,
        program_prefix: bool,
        args: impl Fn(&[String]) -> Vec<OsString>,
    ) -> Result<(), Error> {
        let mut build: Vec<String> = Vec::new();
        loop {
            let installer = Installer {
                program,
                program_prefix,
                args: args(&build),
            };
            let err = match run(installer, self).await {
                Ok(()) => return Ok(()),
                Err(err) => err,
            };
            let Error::Install { output, .. } = &err else {
                return Err(err);
            };
            let Some(package) = needs_source_build(output) else {
                return Err(err);
            };
            if build.contains(&package) {
                // Allowed to build and still wanting a wheel: the installer's own failure.
                return Err(err);
            }
            if !self.source_builds.allows(&package) {
                return Err(Error::SourceBuildRefused {
                    package,
                    asked_by: None,
                });
            }
            build.push(package);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_package_needing_a_build_is_read_from_either_installer() {
        let uv = "  × No solution found when resolving dependencies:\n  ╰─▶ Because srconly==1.0 has no usable wheels and you require srconly, we can conclude that your requirements are unsatisfiable.\n\n      hint: Wheels are required for `Src_Only` because building from source is disabled for all packages (i.e., with `--no-build`)";
        assert_eq!(needs_source_build(uv).as_deref(), Some("src-only"));
        let pip = "ERROR: Could not find a version that satisfies the requirement srconly (from versions: none)";
        assert_eq!(needs_source_build(pip).as_deref(), Some("srconly"));
        assert_eq!(needs_source_build("error: network unreachable"), None);
    }
}
