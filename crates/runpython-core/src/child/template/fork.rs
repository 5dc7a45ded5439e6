//! A run forked from its template: made ahead of the run (its init in its cgroup, its interpreter in its
//! sandbox, waiting), handed the run's five descriptors when it comes, and held by the host until it
//! ends (its init's pidfd to kill it, the pipe its init reports the interpreter's status on).

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runpython_sandbox::BeneathDir;
use serde_json::Value;
use tokio::io::unix::AsyncFd;

use super::super::forked::{ForkedRun, Init};
use super::super::protocol::TemplateCommand;
use super::super::spawn::{RunProcess, Spawned};
use super::super::{code_dir, Slot};
use super::{async_fd, receive_raw, Template};
use crate::error::Error;
use crate::protocol::envelope::Isolation;
use runpython_egress::{Egress, Network, NetworkPolicy, Sandbox};
use runpython_sandbox::{self as sandbox, RunCgroup, Step, StepError};

/// How long a forked run may take to set itself up (mounts and namespaces on a busy machine).
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);

impl Template {
    /// A run for `timeout` on a fork made ahead of it (or made now, when none is ready), sent its
    /// pipes; replacements are made in the background.
    pub(super) async fn run(
        self: &Arc<Self>,
        timeout: Duration,
        idle: Duration,
    ) -> Result<Slot, Error> {
        if let Ok(mut used) = self.last_used.lock() {
            *used = Instant::now();
        }
        let config = &self.sandbox;
        if let Some(ready) = self.take_ready(timeout, idle) {
            // Its replacement is made when this run ends: not now, competing with it for the CPU.
            match self.hand_over(ready, timeout) {
                Ok(slot) => return Ok(slot),
                Err(e) => tracing::debug!("a ready fork could not take its run ({e})"),
            }
        }
        // None ready (a burst): make one for this run, and the rest in the background.
        let ready = self.fork(config, timeout).await?;
        self.refill(timeout);
        self.hand_over(ready, timeout)
    }

    /// A ready fork for `timeout`, if one is there (older ones are dropped, which kills them).
    fn take_ready(&self, timeout: Duration, idle: Duration) -> Option<ReadyRun> {
        let mut ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(run) = ready.pop_front() {
            if run.timeout == timeout && run.born.elapsed() < idle && run.init.alive() {
                return Some(run);
            }
        }
        None
    }

    /// Makes forks for runs of `timeout` in the background until the template's target are ready or
    /// being made (nothing outside a Tokio runtime).
    pub(super) fn refill(self: &Arc<Self>, timeout: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let target = self.target;
        let have = self.ready.lock().map_or(target, |r| r.len());
        let making = self.making.load(Ordering::SeqCst);
        for _ in 0..target.saturating_sub(have + making) {
            self.making.fetch_add(1, Ordering::SeqCst);
            let (this, config) = (Arc::clone(self), self.sandbox.clone());
            runtime.spawn(async move {
                let made = this.fork(&config, timeout).await;
                match made {
                    Ok(run) => {
                        if let Ok(mut ready) = this.ready.lock() {
                            ready.push_back(run);
                        }
                    }
                    Err(e) => {
                        // The next run finds no fork ready, makes one itself and sees why.
                        tracing::debug!("a fork made ahead of its run failed: {e}");
                        this.fork_failed(&e);
                    }
                }
                this.making.fetch_sub(1, Ordering::SeqCst);
            });
        }
    }

    /// Forks a run ahead of time: its share of the sandbox prepared and sent with the command, its
    /// setup awaited.
    async fn fork(
        self: &Arc<Self>,
        config: &Sandbox,
        timeout: Duration,
    ) -> Result<ReadyRun, Error> {
        let code_dir = code_dir()?;
        let mut reads: Vec<&Path> = vec![code_dir];
        reads.extend(self.key.1.as_deref());
        let mut plan = sandbox::prepare_fork(
            &config.map_network(Network::mechanism),
            &self.key.0,
            &reads,
            timeout,
        )?;
        config.network.describe(&mut plan.report);
        // The run hands its network out with its scratch; the host serves it with the policy.
        let policy =
            match (plan.egress, config.network.policy()) {
                (false, _) => None,
                (true, Some(policy)) => Some((Arc::new(policy.clone()), plan.egress_guarded)),
                (true, None) => return Err(Error::Internal(
                    "the sandbox mediates a forked run's network, and no policy was given for it"
                        .into(),
                )),
            };
        let (status, status_w) = runpython_sandbox::fd::pipe()
            .map_err(|e| Error::io_pathless("creating a run's status pipe", e))?;
        let mut named: Vec<(&str, RawFd)> = vec![("status", status_w.as_raw_fd())];
        named.extend(plan.fds());
        let command = TemplateCommand::Fork {
            fds: named.iter().map(|(n, _)| *n).collect(),
            command: &plan.command,
        };
        let fds: Vec<RawFd> = named.iter().map(|(_, fd)| *fd).collect();
        let (reply, mut got) = self.command(&command, &fds).await?;
        // The run holds the only copies of its ends now.
        drop(status_w);
        if let Some(error) = reply["error"].as_str() {
            self.failed.store(true, Ordering::SeqCst);
            return Err(Error::SandboxSetup {
                step: Step::ForkRun.describe(),
                source: std::io::Error::other(error.to_owned()),
            });
        }
        // [pidfd of the init, when it was still there to open; the socket to the interpreter]
        let socket = got.pop().ok_or_else(|| {
            Error::Internal("the template answered a fork without the run's socket".into())
        })?;
        let init = Init(got.pop());
        self.forks.fetch_add(1, Ordering::Relaxed);
        // The kernel names the sender of the run's word (the template set this too, before the run
        // could speak): the process the host checks is the one that said it was ready.
        sandbox::fd::pass_credentials(socket.as_raw_fd())
            .map_err(|e| Error::io_pathless("asking for the run's credentials", e))?;
        let mut socket = async_fd(socket).map_err(|e| Error::io_pathless("the run's socket", e))?;
        // A failure from here on drops `init`, which kills what was forked.
        let (scratch, egress, sender) =
            match tokio::time::timeout(SETUP_TIMEOUT, setup_result(&mut socket, policy)).await {
                Ok(result) => result?,
                Err(_) => {
                    return Err(Error::SandboxSetup {
                        step: Step::ForkedSetup.describe(),
                        source: std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("the run did not finish its setup within {SETUP_TIMEOUT:?}"),
                        ),
                    })
                }
            };
        let verified = self.verify(&plan, &init, sender)?;
        Ok(ReadyRun {
            init,
            verified,
            socket,
            status,
            scratch,
            egress,
            cgroup: plan.cgroup,
            isolation: plan.report,
            timeout,
            born: Instant::now(),
        })
    }

    /// The host's check of a run that says it is ready, from outside ([`sandbox::ForkCheck`]): a run
    /// that fails it is dropped (killed) and its template discarded.
    fn verify(
        &self,
        plan: &sandbox::ForkPlan,
        init: &Init,
        sender: Option<libc::pid_t>,
    ) -> Result<sandbox::VerifiedRun, Error> {
        let unverified = |why: &str| Error::ForkUnverified(why.to_owned());
        let pid = sender
            .ok_or_else(|| unverified("the run's word came without its sender's credentials"))?;
        let init_pid = init
            .pid()
            .ok_or_else(|| unverified("the run's init is gone"))?;
        let dirs = plan.cgroup.as_ref().map_or(&[][..], |c| c.dirs());
        plan.check.verify(pid, init_pid, dirs).map_err(|e| {
            self.failed.store(true, Ordering::SeqCst);
            Error::from(e)
        })
    }

    /// Starts the run on `ready`: its pipes made and sent; the slot drives it like any other.
    fn hand_over(self: &Arc<Self>, ready: ReadyRun, timeout: Duration) -> Result<Slot, Error> {
        let pipe = || {
            runpython_sandbox::fd::pipe()
                .map_err(|e| Error::io_pathless("creating a run's pipes", e))
        };
        let (stdin_r, stdin_w) = pipe()?;
        let (stdout_r, stdout_w) = pipe()?;
        let (stderr_r, stderr_w) = pipe()?;
        let (result_r, result_w) = pipe()?;
        let (bridge, bridge_child) = runpython_bridge::socket_pair()?;
        let ReadyRun {
            init,
            verified,
            socket,
            status,
            scratch,
            egress,
            cgroup,
            isolation,
            ..
        } = ready;
        // Its five descriptors in the order it places them (0-4); the socket has room for them (one
        // small message on an otherwise unused socket), so this does not wait.
        let fds = [
            stdin_r.as_raw_fd(),
            stdout_w.as_raw_fd(),
            stderr_w.as_raw_fd(),
            result_w.as_raw_fd(),
            bridge_child.as_raw_fd(),
        ];
        runpython_sandbox::fd::send_with_fds(socket.as_raw_fd(), b"G", &fds)
            .map_err(|e| Error::io_pathless("handing a run its descriptors", e))?;
        drop((stdin_r, stdout_w, stderr_w, result_w, bridge_child, socket));
        let io = |what: &'static str| move |e: std::io::Error| Error::io_pathless(what, e);
        Ok(Slot {
            run_dir: None,
            spawned: Spawned {
                process: RunProcess::Forked(ForkedRun::new(
                    init,
                    verified,
                    tokio::net::unix::pipe::Receiver::from_owned_fd(status)
                        .map_err(io("reading the run's status pipe"))?,
                    // The template lives as long as its runs; when one ends, a fork replaces it.
                    {
                        let template = Arc::clone(self);
                        Box::new(move || template.refill(timeout))
                    },
                )),
                stdin: Some(
                    tokio::net::unix::pipe::Sender::from_owned_fd(stdin_w)
                        .map_err(io("writing the run's request"))?,
                ),
                stdout: Some(
                    tokio::net::unix::pipe::Receiver::from_owned_fd(stdout_r)
                        .map_err(io("reading the run's output"))?,
                ),
                stderr: Some(
                    tokio::net::unix::pipe::Receiver::from_owned_fd(stderr_r)
                        .map_err(io("reading the run's output"))?,
                ),
                result: tokio::net::unix::pipe::Receiver::from_owned_fd(result_r)
                    .map_err(io("reading the result pipe"))?,
                cgroup,
                handoff: None,
                egress,
            },
            scratch: Arc::new(scratch),
            saved_dir: Path::new(runpython_sandbox::SCRATCH).join("saved"),
            bridge,
            control: None,
            isolation,
            born: Instant::now(),
        })
    }
}

/// A run forked ahead of time: its init in its cgroup, its interpreter in its sandbox, waiting on
/// `socket` for the run's descriptors. Dropped unused, it is killed.
#[derive(Debug)]
pub(super) struct ReadyRun {
    init: Init,
    /// It passed the host's check; held while it lives.
    verified: sandbox::VerifiedRun,
    socket: AsyncFd<OwnedFd>,
    status: OwnedFd,
    scratch: BeneathDir,
    /// With a network policy: the host's side of the run's network, serving from the fork on.
    egress: Option<Egress>,
    cgroup: Option<RunCgroup>,
    isolation: Isolation,
    /// The run's timeout its CPU limit was set for.
    timeout: Duration,
    born: Instant,
}

/// Waits for the run's word on its socket: ready with its scratch's descriptor (and with `egress`, its
/// network's descriptors, whose host side starts now), or the step that failed.
async fn setup_result(
    socket: &mut AsyncFd<OwnedFd>,
    egress: Option<(Arc<NetworkPolicy>, bool)>,
) -> Result<(BeneathDir, Option<Egress>, Option<libc::pid_t>), Error> {
    let failed = |step: Step, source: std::io::Error| Error::SandboxSetup {
        step: step.describe(),
        source,
    };
    let (message, fds, sender) = receive_raw(socket)
        .await
        .map_err(|e| failed(Step::HandOverScratch, e))?;
    match message.first() {
        Some(b'R') => {
            let mut fds = fds.into_iter();
            let fd = fds.next().ok_or_else(|| {
                failed(
                    Step::HandOverScratch,
                    std::io::Error::other("the run sent no descriptor of its scratch"),
                )
            })?;
            let scratch =
                BeneathDir::from_fd(fd.as_fd()).map_err(|e| failed(Step::HandOverScratch, e))?;
            let egress = match egress {
                None => None,
                Some((policy, guarded)) => {
                    // The resolver's two sockets, the relay's one or two listeners, the listener.
                    let mut rest: Vec<OwnedFd> = fds.collect();
                    if !(4..=5).contains(&rest.len()) {
                        return Err(failed(
                            Step::EgressSockets,
                            std::io::Error::other(
                                "the run sent the wrong descriptors for its network",
                            ),
                        ));
                    }
                    let listener = rest.remove(rest.len() - 1);
                    let relay6 = (rest.len() == 4).then(|| rest.remove(3));
                    let relay4 = rest.remove(2);
                    let dns_tcp = rest.remove(1);
                    let dns_udp = rest.remove(0);
                    Some(Egress::start_with(
                        sandbox::EgressFds {
                            dns_udp,
                            dns_tcp,
                            relay4,
                            relay6,
                            listener,
                            guarded,
                        },
                        policy,
                    ))
                }
            };
            Ok((scratch, egress, sender))
        }
        Some(b'E') => {
            let report: Value = serde_json::from_slice(&message[1..]).unwrap_or(Value::Null);
            let step = Step::from_name(report["step"].as_str().unwrap_or(""));
            let errno = report["errno"]
                .as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .unwrap_or(libc::EIO);
            let error = StepError::new(step, errno);
            tracing::debug!(
                "a forked run's setup failed: {error} ({})",
                report["message"].as_str().unwrap_or("")
            );
            Err(failed(step, error.source()))
        }
        _ => Err(failed(
            Step::ForkedSetup,
            std::io::Error::other("the run ended before it was set up"),
        )),
    }
}
