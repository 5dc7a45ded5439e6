//! What a run with secrets gets from the runner: each secret's placeholder in its environment, and
//! the trust bundle (the host's roots and the run's own CA) written where its TLS clients look.

use std::collections::BTreeMap;

use crate::child::protocol::TrustBundle;

/// The run's or cell's environment for the runner (its request's variables, then each secret's
/// placeholder and the trust variables), and the trust bundle to write (none without secrets).
pub(crate) fn runner_env(
    request_env: &BTreeMap<String, String>,
    egress: Option<&runpython_sandbox::Egress>,
) -> (BTreeMap<String, String>, Option<TrustBundle>) {
    let mut env = request_env.clone();
    let Some(egress) = egress else {
        return (env, None);
    };
    let Some(pem) = egress.trust_bundle() else {
        return (env, None);
    };
    env.extend(egress.secret_env());
    (
        env,
        Some(TrustBundle {
            path: runpython_sandbox::TRUST_BUNDLE_PATH,
            pem,
        }),
    )
}
