//! airlock-server: `airlock serve`, the execution service over the engine. An HTTP `/v1`
//! API (docs/api.md, docs/openapi.json) on a unix socket (peer uid -> tenant) and
//! optionally TCP (API key -> tenant): one-shot runs streamed as NDJSON, sessions with
//! their commands and files, records and the audit chain, health and metrics. Every cell
//! is cloned by the engine's cell factory; the service itself never forks.

pub mod agent_gate;
pub mod api;
pub mod approvals;
mod body_deadline;
pub mod config;
pub mod error;
mod files;
mod handoff;
mod health;
pub mod listen;
mod metrics;
pub mod openapi;
pub mod output;
mod page;
mod plans;
pub mod quota;
mod runs;
mod sessions;
mod state;
mod stdin_stream;
pub mod tenants;
mod tls;
pub mod verification;

pub use config::ServerConfig;
pub use error::ServerError;
pub use plans::{ImageLease, ImageResolver, LeasedImage};

use airlock_engine::{Engine, EngineConfig, PlanShape};
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post, put, MethodRouter};
use axum::Router;
use state::{AppState, Shared};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What `airlock serve` starts the service with.
pub struct ServeOptions {
    pub server: ServerConfig,
    /// Relative contract paths of `[server.contracts]` are taken from here.
    pub config_dir: PathBuf,
    pub engine: EngineConfig,
    pub euid_is_root: bool,
    /// The agent's routes (`/mcp` and `POST /v1/tools/{name}/call`: the binary builds
    /// them from the tool registry, on the service's own engine), behind the tenants'
    /// API keys.
    pub mcp: Option<McpMount>,
    /// The workload classes and approvals (`POST /v1/runs` with a `class`, `/v1/approvals`).
    pub policy: Option<Arc<dyn approvals::ClassPolicy>>,
    /// The last periodic verification of each class of `[server.verify]`, which the binary
    /// runs and records here (crates/airlock/src/serve.rs).
    pub verifications: Arc<verification::Verifications>,
    /// The host's OCI image store, for contracts with an `image`.
    pub images: Option<Arc<dyn ImageResolver>>,
}

/// Builds the agent's routes, merged into the service's, from its engine and the
/// service's authentication of a request (its tenant and that tenant's quotas).
pub type McpMount =
    Box<dyn FnOnce(Arc<Engine>, agent_gate::Authenticate) -> Result<Router, String> + Send>;

/// The part of `drain_grace_ms` kept, at the end of a drain, for ending the sessions and
/// the connections (at most half the grace).
const END_RESERVE: Duration = Duration::from_secs(5);

/// How long the runtime waits, once the drain is over, for blocking threads still at work
/// (a store call, a session's end past its time): the process ends anyway.
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(1);

/// Runs the service until SIGTERM or SIGINT, then drains within `drain_grace_ms`: no new
/// work, running commands finish (or are killed at their deadline) while the grace
/// allows, then every session is ended and recorded as ended by the operator, and the
/// process ends even if some operation is stuck.
pub fn serve(options: ServeOptions) -> Result<(), ServerError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(options.server.blocking_pool_size())
        .thread_name("airlock-serve")
        .build()
        .map_err(|source| ServerError::Io {
            context: "starting the runtime".into(),
            source,
        })?;
    let served = runtime.block_on(serve_async(options));
    // Dropping a runtime waits for every blocking thread without bound: one stuck in a
    // syscall must not keep the drained service alive.
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
    served
}

fn build_state(options: ServeOptions) -> Result<Shared, ServerError> {
    let ServeOptions {
        server,
        config_dir,
        engine,
        policy,
        verifications,
        images,
        ..
    } = options;
    server.check().map_err(ServerError::Config)?;
    // The service's one connection; opening it also records the runs and sessions of a
    // previous service that died (SIGKILL, a crash) as aborted.
    let store = airlock_store::Store::open_at(&engine.store_location())?;
    store.reap_aborted()?;
    let contracts = plans::Contracts::load(&server, &config_dir, images)?;
    let engine = Arc::new(Engine::new(engine));
    // The service's own connection too: no record of a request waits for a checkpoint.
    engine.checkpoint_in_background()?;
    // Finishes spooled while the store was unavailable are written once it is back (a
    // previous process's were written by `reap_aborted` above, before it reaped).
    engine.replay_spool_in_background()?;
    store.leave_checkpoints_to_caller()?;
    let mut pools = BTreeMap::new();
    for (name, size) in &server.pools {
        let template = contracts.template(name).ok_or_else(|| {
            ServerError::Config(format!(
                "server.pools.{name}: its contract does not compile without a command"
            ))
        })?;
        pools.insert(name.clone(), PlanShape::of(&template));
        engine.keep_warm(template, *size)?;
    }
    let vocabulary = metrics_vocabulary(&server, policy.as_deref());
    Ok(Arc::new(AppState {
        engine,
        store: Mutex::new(store),
        tenants: tenants::Tenants::of(&server),
        quotas: Arc::default(),
        contracts,
        sessions: Mutex::default(),
        metrics: metrics::Metrics::new(vocabulary),
        draining: Default::default(),
        work: Arc::default(),
        pools,
        config: server,
        policy,
        verifications,
    }))
}

/// The names `/metrics` may show: the configuration's contracts, classes and tenants.
fn metrics_vocabulary(
    server: &ServerConfig,
    policy: Option<&dyn approvals::ClassPolicy>,
) -> metrics::Vocabulary {
    let mut classes: std::collections::BTreeSet<String> =
        server.contracts.keys().cloned().collect();
    classes.extend(policy.map(|p| p.class_names()).unwrap_or_default());
    let mut tenants: std::collections::BTreeSet<String> = server.tenants.keys().cloned().collect();
    tenants.insert(server.operator_tenant.clone());
    metrics::Vocabulary {
        classes,
        tenants,
        max_series: server.metrics_max_series,
    }
}

/// The `/v1` API and the health endpoints: every route the service itself serves, an
/// unknown route 404 and a wrong method 405 (with `Allow`), both as `ErrorBody`.
pub fn router(state: Shared) -> Router {
    let routes = api_routes(state.config.max_file_bytes);
    routes
        .into_iter()
        .fold(Router::new(), |router, (path, methods)| {
            router.route(path, methods)
        })
        .fallback(error::no_such_route)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .with_state(state)
}

/// Each path of the API and its handlers: one list, so that a test holds it against
/// docs/openapi.json (src/openapi.rs).
fn api_routes(max_file: usize) -> Vec<(&'static str, MethodRouter<Shared>)> {
    vec![
        ("/v1/runs", post(runs::create_run).get(runs::list_runs)),
        (stdin_stream::PATH, post(runs::create_streamed_run)),
        ("/v1/runs/{id}", get(runs::get_run)),
        ("/v1/audit/verify", get(runs::verify)),
        ("/v1/approvals", get(approvals::list_approvals)),
        ("/v1/approvals/{id}", post(approvals::decide_approval)),
        ("/v1/verify/{class}/ack", post(verification::acknowledge)),
        (
            "/v1/sessions",
            post(sessions::create_session).get(sessions::list_sessions),
        ),
        (
            "/v1/sessions/{id}",
            get(sessions::get_session).delete(sessions::delete_session),
        ),
        ("/v1/sessions/{id}/exec", post(sessions::exec)),
        (
            "/v1/sessions/{id}/commands/{cid}",
            get(sessions::get_command),
        ),
        (
            "/v1/sessions/{id}/commands/{cid}/output",
            get(sessions::command_output),
        ),
        (
            "/v1/sessions/{id}/commands/{cid}/signal",
            post(sessions::signal),
        ),
        ("/v1/sessions/{id}/timeout", post(sessions::set_timeout)),
        ("/v1/sessions/{id}/network", post(sessions::change_network)),
        ("/v1/sessions/{id}/files", get(sessions::list_files)),
        (
            "/v1/sessions/{id}/files/{*path}",
            put(sessions::put_file)
                .get(sessions::get_file)
                .layer(DefaultBodyLimit::max(max_file)),
        ),
        ("/healthz", get(health::healthz)),
        ("/readyz", get(health::readyz)),
        ("/metrics", get(health::metrics)),
    ]
}

/// The paths of the agent's routes ([`McpMount`]: `/mcp` and the tool calls), as
/// docs/openapi.json describes them.
pub const AGENT_PATHS: &[&str] = &["/mcp", "/v1/tools/{name}/call"];

/// The paths [`router`] serves, as docs/openapi.json spells them (`{*path}` is `{path}`).
pub fn api_paths() -> Vec<String> {
    api_routes(0)
        .into_iter()
        .map(|(path, _)| path.replace("{*", "{"))
        .collect()
}

async fn serve_async(mut options: ServeOptions) -> Result<(), ServerError> {
    let euid_is_root = options.euid_is_root;
    let mcp = options.mcp.take();
    let tls = tls_acceptor(&options.server, &options.config_dir)?;
    let state = build_state(options)?;
    let mut routes = router(Arc::clone(&state));
    if let Some(mount) = mcp {
        let authenticate = agent_gate::authenticate(&state);
        let mcp = mount(Arc::clone(&state.engine), authenticate).map_err(ServerError::Config)?;
        routes = routes.merge(mcp);
    }
    // After the merge: the agent's routes answer their errors as ErrorBody too.
    let routes = routes.layer(axum::middleware::from_fn(error::json_errors));
    let bound = listen::bind(&state.config, euid_is_root, tls).await?;
    let graceful = Arc::new(hyper_util::server::graceful::GracefulShutdown::new());
    let app = listen::App {
        state: Arc::clone(&state),
        router: routes,
        graceful: Arc::clone(&graceful),
        max_header_bytes: state.config.max_header_bytes,
        header_timeout: Duration::from_millis(state.config.header_timeout_ms),
        body_timeout: Duration::from_millis(state.config.body_timeout_ms),
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let accepting = tokio::spawn(listen::accept_all(app, bound, stopped));
    let reaper = {
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                sessions::reap(&state).await;
            }
        })
    };
    eprintln!("airlock serve: ready");
    wait_for_signal().await?;
    eprintln!("airlock serve: draining");
    state.draining.store(true, Ordering::SeqCst);
    let _ = stop.send(true);
    let _ = accepting.await;
    reaper.abort();
    drain(&state, graceful).await;
    eprintln!("airlock serve: stopped");
    Ok(())
}

/// Ends what is in flight within `drain_grace_ms` from now: work gets the grace (less
/// the reserve) to end by itself, then every session is ended by the operator (its
/// commands still running with it) and the connections are closed, each step bounded by
/// what is left of the grace.
async fn drain(state: &Shared, graceful: Arc<hyper_util::server::graceful::GracefulShutdown>) {
    let grace = Duration::from_millis(state.config.drain_grace_ms);
    let until = tokio::time::Instant::now() + grace;
    let reserve = END_RESERVE.min(grace / 2);
    if tokio::time::timeout_at(until - reserve, state.work.wait_idle())
        .await
        .is_err()
    {
        eprintln!(
            "airlock serve: {} still in flight after the drain grace: ending it",
            state.work.count()
        );
    }
    let left = sessions::end_all(state, until).await;
    if left > 0 {
        eprintln!("airlock serve: {left} sessions did not end within the drain grace");
    }
    if let Ok(graceful) = Arc::try_unwrap(graceful) {
        let _ = tokio::time::timeout_at(until, graceful.shutdown()).await;
    }
}

/// The acceptor of the `tls:` listeners, when the configuration names a certificate and
/// key (relative paths from the configuration file's directory). Loaded before anything
/// else starts, so a bad pair is a start-up error, not a failed first handshake.
fn tls_acceptor(
    server: &ServerConfig,
    config_dir: &std::path::Path,
) -> Result<Option<tokio_rustls::TlsAcceptor>, ServerError> {
    match (&server.tls_cert_file, &server.tls_key_file) {
        (Some(cert), Some(key)) => Ok(Some(tls::acceptor(
            &config_dir.join(cert),
            &config_dir.join(key),
        )?)),
        _ => Ok(None),
    }
}

async fn wait_for_signal() -> Result<(), ServerError> {
    use tokio::signal::unix::{signal, SignalKind};
    let io = |source| ServerError::Io {
        context: "installing the signal handlers".into(),
        source,
    };
    let mut term = signal(SignalKind::terminate()).map_err(io)?;
    let mut int = signal(SignalKind::interrupt()).map_err(io)?;
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    Ok(())
}
