//! What each sandbox layer costs on the trivial run (`1+1`): p50 wall time of runs with every layer
//! off, each layer alone, and all layers on, interleaved so that machine noise hits all alike.
//! `namespaces` includes the filesystem view and its scratch (they need the mount namespace);
//! `cgroup` is the run's cgroup alone (where the host offers one).
//!
//! With `forked` first, the same for runs forked from a template, as throughput: forked runs per
//! second, 16 at a time, with every layer on and with each layer off in turn (the runs' own work
//! beside what `runs_per_s_vs_python_ceiling` compares them with), alternating.
//!
//! Usage: `cargo run --release -p runpython-tests --bin runpython-layer-cost [forked] [ROUNDS]`

use std::time::{Duration, Instant};

use runpython_core::{PoolConfig, RunPython, Sandbox};
use runpython_tests::stats::{floor_ms, p50};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::args().nth(1).as_deref() == Some("forked") {
        return forked().await;
    }
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

/// Forked runs per second, 16 at a time, with each layer off in turn.
async fn forked() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(4);
    let on = Sandbox::default();
    let configs: Vec<(&str, Sandbox)> = vec![
        ("all", on.clone()),
        (
            "no_landlock",
            Sandbox {
                landlock: false,
                ..on.clone()
            },
        ),
        (
            "no_seccomp",
            Sandbox {
                seccomp: false,
                ..on.clone()
            },
        ),
        (
            "no_cgroups",
            Sandbox {
                cgroups: false,
                ..on.clone()
            },
        ),
        (
            "no_rlimits",
            Sandbox {
                rlimits: false,
                ..on.clone()
            },
        ),
        (
            "host_net",
            Sandbox {
                network: runpython_core::Network::Host,
                ..on.clone()
            },
        ),
    ];
    let mut engines = Vec::new();
    for (name, sandbox) in &configs {
        let python = RunPython::builder()
            .timeout(Duration::from_secs(60))
            .sandbox(sandbox.clone())
            .pool(PoolConfig {
                size: 1,
                idle: Duration::from_secs(600),
                warm_imports: Vec::new(),
                prestart: false,
                templates: true,
            })
            .build()?;
        let e = python.run("1+1").await?;
        let start = e.isolation.as_ref().map(|i| i.start.clone());
        println!("{name:>12}: forked runs start as {start:?}");
        engines.push((*name, python, Vec::new()));
    }
    for round in 0..rounds {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..engines.len()).collect()
        } else {
            (0..engines.len()).rev().collect()
        };
        for i in order {
            let (_, python, samples) = &mut engines[i];
            let per_s = runpython_tests::template_bench::runs_per_s_16(python, "sum(range(1000))")
                .await
                .map_err(|e| e.to_string())?;
            samples.push(per_s);
        }
    }
    for (name, _, samples) in engines {
        println!(
            "{name:>12}: {:7.1} runs/s (p50 of {samples:.0?})",
            p50(samples.clone())
        );
    }
    Ok(())
}
