//! Hosts `airlock_engine::handoff::serve_connection` on a unix socket, with a warm pool
//! of the default contract's shape, the way `airlock serve` routes hand-off clients to
//! it: for scripts/bench.sh (`airlock run -- /bin/true` handed to a running service).
//!
//! Usage: `handoff_host SOCKET STATE_DIR [WARM]`. Prints `ready` on stdout once the pool
//! is full; serves until killed. This binary is also its own cell factory.

use airlock_contract::{compile, default_contract, CompileInput};
use airlock_engine::handoff::{serve_connection, AdmitEveryone};
use airlock_engine::{Engine, EngineConfig};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn main() {
    airlock_engine::factory::run_factory_if_requested();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(socket), Some(state)) = (args.first(), args.get(1)) else {
        eprintln!("usage: handoff_host SOCKET STATE_DIR [WARM]");
        std::process::exit(2);
    };
    let warm: usize = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(4);
    let mut config = EngineConfig::new(PathBuf::from(state), Default::default());
    config.program = std::env::current_exe().expect("own path");
    config.max_cells = 256;
    let engine = Engine::new(config);
    // As `airlock serve` does (crates/server/src/lib.rs).
    engine
        .checkpoint_in_background()
        .expect("the checkpoint thread");
    let template = compile(
        &default_contract(),
        &CompileInput::new(Path::new("/"), &["/bin/true".to_string()]),
    )
    .expect("the default contract compiles");
    if warm > 0 {
        engine.keep_warm(template, warm).expect("the cell factory");
        let until = Instant::now() + Duration::from_secs(60);
        while engine.pool_status().iter().map(|p| p.parked).sum::<usize>() < warm {
            assert!(Instant::now() < until, "the pool did not fill");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket).expect("binding the socket");
    // Any local user may hand runs over; the service checks their paths as them.
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    println!("ready");
    let _ = std::io::stdout().flush();
    std::thread::scope(|scope| {
        for stream in listener.incoming().flatten() {
            let engine = &engine;
            scope.spawn(move || {
                if let Err(err) = serve_connection(stream, engine, &AdmitEveryone) {
                    eprintln!("handoff_host: {err}");
                }
            });
        }
    });
}
