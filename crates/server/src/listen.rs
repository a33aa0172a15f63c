//! The listeners and their accept loops. The unix socket's loop is written here (not
//! axum::serve) so each connection's peer credentials (SO_PEERCRED) are known and handed
//! to its requests; [`App::serve_unix_connection`] is the one place a unix connection is
//! served, so another protocol can be routed from there by peeking its first bytes.

use crate::config::{Listen, ServerConfig};
use crate::error::ServerError;
use crate::tenants::Peer;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio_rustls::TlsAcceptor;

/// What serving a connection needs.
#[derive(Clone)]
pub struct App {
    /// For hand-off clients (`airlock run`), served by the engine, not the router.
    pub state: crate::state::Shared,
    pub router: Router,
    pub graceful: Arc<GracefulShutdown>,
    pub max_header_bytes: usize,
    pub header_timeout: Duration,
    /// How long after its head a request's body may take to arrive whole.
    pub body_timeout: Duration,
}

pub enum Bound {
    Unix(UnixListener, std::path::PathBuf),
    Tcp(TcpListener),
    Tls(TcpListener, TlsAcceptor),
}

/// Binds a unix socket: its directory is created (0755), a stale socket nobody listens on
/// is replaced, a live one is an error (another service runs); the socket's mode is 0660
/// as root (the group may be given access) and 0600 otherwise.
fn bind_unix(path: &Path, euid_is_root: bool) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            "another service is listening on this socket",
        ));
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) => {
            std::fs::remove_file(path)?
        }
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "exists and is not a socket",
            ))
        }
        Err(_) => {}
    }
    let listener = UnixListener::bind(path)?;
    let mode = if euid_is_root { 0o660 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
}

/// Binds every listener of the configuration; `tls` is the acceptor of its `tls:` ones.
pub async fn bind(
    config: &ServerConfig,
    euid_is_root: bool,
    tls: Option<TlsAcceptor>,
) -> Result<Vec<Bound>, ServerError> {
    let listen: Vec<String> = if config.listen.is_empty() {
        vec![format!(
            "unix:{}",
            crate::config::default_socket(euid_is_root).display()
        )]
    } else {
        config.listen.clone()
    };
    let mut bound = Vec::new();
    for text in listen {
        let err = |source| ServerError::Listen {
            listen: text.clone(),
            source,
        };
        match Listen::parse(&text).map_err(ServerError::Config)? {
            Listen::Unix(path) => {
                let listener = bind_unix(&path, euid_is_root).map_err(err)?;
                bound.push(Bound::Unix(listener, path));
            }
            Listen::Tcp(addr) => {
                let listener = TcpListener::bind(addr).await.map_err(err)?;
                bound.push(Bound::Tcp(listener));
            }
            Listen::Tls(addr) => {
                // ServerConfig::check refuses a tls: listener without the pair.
                let acceptor = tls.clone().ok_or_else(|| {
                    ServerError::Config(format!("server.listen: {text}: no certificate"))
                })?;
                let listener = TcpListener::bind(addr).await.map_err(err)?;
                bound.push(Bound::Tls(listener, acceptor));
            }
        }
    }
    Ok(bound)
}

impl App {
    /// Serves one unix socket connection whose peer is `peer`: a hand-off client
    /// (`airlock run`, recognised by its first bytes) or HTTP.
    pub fn serve_unix_connection(&self, stream: UnixStream, peer: Peer) {
        let app = self.clone();
        tokio::spawn(async move {
            match crate::handoff::sniff(&stream, app.header_timeout).await {
                crate::handoff::Protocol::Handoff => {
                    crate::handoff::serve(stream, std::sync::Arc::clone(&app.state))
                }
                crate::handoff::Protocol::Http => app.serve(TokioIo::new(stream), peer),
            }
        });
    }

    fn serve_tcp_connection(&self, stream: TcpStream) {
        self.serve(TokioIo::new(stream), Peer::Tcp);
    }

    /// The handshake is bounded like a request head: a client that never finishes it
    /// holds a task until `header_timeout`, never a worker or a cell.
    fn serve_tls_connection(&self, stream: TcpStream, acceptor: TlsAcceptor) {
        let app = self.clone();
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(app.header_timeout, acceptor.accept(stream));
            if let Ok(Ok(stream)) = handshake.await {
                app.serve(TokioIo::new(stream), Peer::Tcp);
            }
        });
    }

    fn serve<I>(&self, io: I, peer: Peer)
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let body_timeout = self.body_timeout;
        let router = self
            .router
            .clone()
            .layer(axum::middleware::from_fn(move |request, next| {
                crate::body_deadline::bound_body(body_timeout, request, next)
            }))
            .layer(axum::Extension(peer));
        let service = hyper_util::service::TowerToHyperService::new(router);
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .max_buf_size(self.max_header_bytes)
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_timeout);
        let connection = builder.serve_connection(io, service);
        let watched = self.graceful.watch(connection);
        tokio::spawn(async move {
            let _ = watched.await;
        });
    }
}

/// Accepts connections on every listener until `stop` fires.
pub async fn accept_all(app: App, bound: Vec<Bound>, stop: tokio::sync::watch::Receiver<bool>) {
    let mut loops = Vec::new();
    for listener in bound {
        let app = app.clone();
        let mut stop = stop.clone();
        loops.push(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.changed() => break,
                    accepted = accept(&listener) => match accepted {
                        Ok(Accepted::Unix(stream)) => {
                            // No credentials, no service: the peer cannot be told apart.
                            let Ok(cred) = stream.peer_cred() else { continue };
                            let peer = Peer::Unix { uid: cred.uid(), pid: cred.pid() };
                            app.serve_unix_connection(stream, peer);
                        }
                        Ok(Accepted::Tcp(stream)) => app.serve_tcp_connection(stream),
                        Ok(Accepted::Tls(stream, acceptor)) => {
                            app.serve_tls_connection(stream, acceptor)
                        }
                        // Out of descriptors and the like: let it pass, do not spin.
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    },
                }
            }
            if let Bound::Unix(_, path) = &listener {
                let _ = std::fs::remove_file(path);
            }
        }));
    }
    for handle in loops {
        let _ = handle.await;
    }
}

enum Accepted {
    Unix(UnixStream),
    Tcp(TcpStream),
    Tls(TcpStream, TlsAcceptor),
}

async fn accept(listener: &Bound) -> std::io::Result<Accepted> {
    match listener {
        Bound::Unix(l, _) => l.accept().await.map(|(s, _)| Accepted::Unix(s)),
        Bound::Tcp(l) => l.accept().await.map(|(s, _)| Accepted::Tcp(s)),
        Bound::Tls(l, acceptor) => l
            .accept()
            .await
            .map(|(s, _)| Accepted::Tls(s, acceptor.clone())),
    }
}
