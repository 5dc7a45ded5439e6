//! What each sandbox layer costs on the trivial run (`1+1`): p50 wall time of runs with every layer
//! off, each layer alone, and all layers on, interleaved so that machine noise hits all alike.
//! `namespaces` includes the filesystem view and its scratch (they need the mount namespace);
//! `cgroup` is the run's cgroup alone (where the host offers one).
//!
//! Usage: `cargo run --release -p runpython-tests --bin runpython-layer-cost [ROUNDS]`

use std::time::{Duration, Instant};

use runpython_core::{RunPython, Sandbox};
use runpython_tests::stats::{floor_ms, p50};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(40);
    let off = Sandbox::off();
    let configs: Vec<(&str, Sandbox)> = vec![
        ("off", off.clone()),
        (
            "rlimits",
            Sandbox {
                rlimits: true,
                ..off.clone()
            },
        ),
        (
            "landlock",
            Sandbox {
                landlock: true,
                ..off.clone()
            },
        ),
        (
            "drop_uid",
            Sandbox {
                drop_privileges: true,
                rlimits: true,
                ..off.clone()
            },
        ),
        (
            "seccomp",
            Sandbox {
                seccomp: true,
                ..off.clone()
            },
        ),
        (
            "cgroup",
            Sandbox {
                cgroups: true,
                ..off.clone()
            },
        ),
        (
            "namespaces_host_net",
            Sandbox {
                namespaces: true,
                network: runpython_core::Network::Host,
                ..off.clone()
            },
        ),
        (
            "namespaces",
            Sandbox {
                namespaces: true,
                ..off.clone()
            },
        ),
        (
            "all_host_net",
            Sandbox {
                network: runpython_core::Network::Host,
                ..Sandbox::default()
            },
        ),
        (
            "all_no_cgroup",
            Sandbox {
                cgroups: false,
                ..Sandbox::default()
            },
        ),
        ("all", Sandbox::default()),
    ];
    let mut engines = Vec::new();
    for (name, sandbox) in &configs {
        let python = RunPython::builder()
            .timeout(Duration::from_secs(30))
            .sandbox(sandbox.clone())
            .build()?;
        python.run("1+1").await?; // warm: interpreter discovery, code dir, probe
        engines.push((*name, python, Vec::new()));
    }
    let mut floor = Vec::new();
    let exe = engines[0].1.interpreter().await?.executable.clone();
    for _ in 0..rounds {
        floor.push(floor_ms(&exe)?);
        for (_, python, samples) in &mut engines {
            let t = Instant::now();
            let e = python.run("1+1").await?;
            assert!(e.is_success(), "{:?}", e.error);
            samples.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    let floor = p50(floor);
    let base = p50(engines[0].2.clone());
    println!("python floor p50: {floor:.2} ms");
    for (name, _, samples) in engines {
        let ms = p50(samples);
        println!(
            "{name:>20}: {ms:7.2} ms  (+{:5.2} ms over off, {:.3} x floor)",
            ms - base,
            ms / floor
        );
    }
    Ok(())
}
