//! runpython-egress: the network a sandboxed run needs, decided and served by the host. It owns the
//! network policy ([`NetworkPolicy`]: host patterns, the ranges that are never public, name pins,
//! [`Secret`]s and the hosts they are for) and, for each run whose network the sandbox mediates, the
//! host's side of it ([`Egress`]): the run's resolver, the answer to each of its `connect(2)`s (seccomp
//! user notifications), the socket it connects and hands to the run in place of the run's own (or the
//! relay that joins an allowed connection to the destination, through the host's `HTTPS_PROXY` when it
//! has one), the report and log of what the run did, and the proxy that fills a secret's value into
//! requests to its hosts. Secrets live here alone: their configuration,
//! the placeholders and trust bundle a run's runner gets ([`runner_env`]), and their substitution.
//!
//! It depends on runpython-sandbox only for the mechanism: the sandbox makes the run's endpoints in
//! its empty network namespace and installs the connect notifier ([`runpython_sandbox::Network`]'s
//! `Mediated`), and hands their descriptors out; this crate serves them. runpython-core and
//! runpython-deps start an [`Egress`] for each mediated run with their policy.
//!
//! It must never let anything through that the policy did not decide: a connection is the host's own,
//! made only after [`NetworkPolicy::decide`] allowed it, and either joined to the run's socket through
//! the relay in the run's namespace or, only where the sandbox's guard is in force, handed to the run
//! in its socket's place (a socket of the host's that can then carry nothing but that connection:
//! every bind, connect and listen of the run is the host's to perform, and refused on it). A secret's value is only ever written into a request to one of its hosts,
//! never into a log, an error or the run. It never decides what a sandbox is: it says what the sandbox
//! is asked for ([`Network::mechanism`]) and names the policy in its report ([`Network::describe`]).
//!
//! ```
//! use std::net::IpAddr;
//! use runpython_egress::{HostAddrs, Network, NetworkPolicy};
//!
//! // What a run may reach: hosts under example.com on 443, never a private address.
//! let policy = NetworkPolicy::allowing(["*.example.com:443"])?;
//! let host = HostAddrs::from_list(vec![]);
//! let public: IpAddr = "93.184.215.14".parse()?;
//! assert!(policy.decide(public, 443, &["www.example.com"], &host).is_allowed());
//! let private: IpAddr = "10.0.0.5".parse()?;
//! assert!(!policy.decide(private, 443, &["www.example.com"], &host).is_allowed());
//!
//! // The sandbox is asked to mediate the run's network; the policy stays with its caller, which
//! // serves the run's descriptors with it (`Egress::start`).
//! let network = Network::Policy(policy);
//! assert_eq!(network.mechanism(), runpython_sandbox::Network::Mediated);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod policy;
mod run;

pub use error::Error;
pub use policy::{HostAddrs, HostPattern, Network, NetworkPolicy, Sandbox, Secret, Verdict};
pub use run::credentials::{runner_env, TrustBundle};
pub use run::{Egress, Mark, NetworkReport, Refusal};
