//! What the suites that check a property of every way a run is served share: the ways themselves, the
//! engine setting that forks runs from a template, and a loopback server that counts who reached it
//! (a refusal is proven by a server that saw nothing).

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use runpython_core::{Envelope, Error, PoolConfig, RunPython, RunPythonBuilder, RunRequest};

/// The ways a run is served: a run of its own, a session cell, a run forked from a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    Fresh,
    Cell,
    Forked,
}

impl Way {
    /// Every way, in that order.
    pub const ALL: [Way; 3] = [Way::Fresh, Way::Cell, Way::Forked];

    /// `builder` serving runs this way: for `Forked`, with [`forking_pool`].
    pub fn serve(self, builder: RunPythonBuilder) -> RunPythonBuilder {
        match self {
            Way::Forked => builder.pool(forking_pool()),
            Way::Fresh | Way::Cell => builder,
        }
    }

    /// `request` run this way on `engine`: for `Cell`, the first cell of a new session.
    pub async fn run(
        self,
        engine: &RunPython,
        request: impl Into<RunRequest>,
    ) -> Result<Envelope, Error> {
        match self {
            Way::Cell => engine.session().run(request).await,
            Way::Fresh | Way::Forked => engine.run(request).await,
        }
    }
}

/// One template kept for forked runs, none made ahead and nothing warm: runs that can be forked are.
pub fn forking_pool() -> PoolConfig {
    PoolConfig {
        size: 1,
        idle: Duration::from_secs(300),
        warm_imports: Vec::new(),
        prestart: false,
        templates: true,
    }
}

/// A loopback server of the host's that counts the connections it accepts and gives each to
/// `serve` on a thread of its own.
#[derive(Debug)]
pub struct CountingServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    seen: Arc<AtomicUsize>,
}

impl CountingServer {
    /// Binds a free loopback port and starts accepting.
    pub fn start(serve: fn(TcpStream)) -> std::io::Result<CountingServer> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let port = listener.local_addr()?.port();
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                counter.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || serve(stream));
            }
        });
        Ok(CountingServer { port, seen })
    }

    /// The connections it accepted. A connection made on a run's behalf is counted by the time the
    /// run's envelope is back; a stray one is given a moment to show up before none is believed.
    pub fn seen(&self) -> usize {
        std::thread::sleep(Duration::from_millis(100));
        self.seen.load(Ordering::SeqCst)
    }
}
