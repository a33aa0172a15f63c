//! The run's broker socket in a gVisor sandbox (docs/credentials.md, "The broker";
//! docs/threat-model.md, "Tiers"). The native cell binds the host socket into the cell;
//! a gVisor sandbox keeps `--host-uds=none` (with it open, every host socket the
//! sandbox's view holds would be reachable), so the socket is carried the way egress
//! is ([`super::route`]): the unix forwarder ([`super::inside`]) binds
//! [`airlock_contract::BROKER_SOCKET`] inside the sandbox, on a tmpfs of the sandbox's own
//! that belongs to the sandbox's root (the forwarder's user; the payload can connect to
//! the socket but not remove or replace it), and per connection gets a host socket whose
//! other end the supervisor connects to the run's broker socket. The broker sees one
//! connection per request, as natively, and makes the same checks and records.

use super::route::{self, Pending};
use crate::error::CellError;
use airlock_contract::{CellPlan, MountPlan};
use airlock_oci::spec_types::{MountBuilder, Spec};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

/// The control a broker route that cannot be built refuses the run as.
const CONTROL: &str = "gvisor.broker";

/// The plan's broker socket: its host path (bound by the engine for this run) and its
/// path in the sandbox.
pub fn socket_of(plan: &CellPlan) -> Option<(&Path, &Path)> {
    plan.mounts.iter().find_map(|mount| match mount {
        MountPlan::BrokerSocket { source, target } => Some((source.as_path(), target.as_path())),
        _ => None,
    })
}

/// The directory the socket is bound in inside the sandbox.
pub fn socket_dir(target: &Path) -> Result<&Path, CellError> {
    target
        .parent()
        .filter(|dir| *dir != Path::new("/"))
        .ok_or_else(|| route::refused(CONTROL, "the broker socket has no directory of its own"))
}

/// Mounts a tmpfs of the sandbox's own (not a host one: nothing is written there but the
/// socket) at the socket's directory, the sandbox root's and 0755.
pub fn add_socket_dir(spec: &mut Spec, target: &Path) -> Result<(), CellError> {
    let dir = socket_dir(target)?;
    let mount = MountBuilder::default()
        .destination(dir)
        .typ("tmpfs")
        .source("tmpfs")
        .options(vec![
            "nosuid".to_string(),
            "nodev".to_string(),
            "noexec".to_string(),
            "mode=0755".to_string(),
        ])
        .build();
    super::bundle::push_mount(spec, mount)
}

/// The control channel of the unix forwarder: once it is ready, a bridge thread
/// connects one host connection to `host_socket` per request, and ends by itself once
/// the channel closes (the forwarder ended or the sandbox went).
pub fn start_route(host_socket: PathBuf) -> Result<Pending, CellError> {
    let (channel_tx, channel_rx) = mpsc::channel::<UnixStream>();
    std::thread::Builder::new()
        .name("airlock-gvisor-broker".into())
        .spawn(move || {
            if let Ok(channel) = channel_rx.recv() {
                // The forwarder has one socket: request byte 0.
                route::bridge(&channel, |i| {
                    (i == 0)
                        .then(|| UnixStream::connect(&host_socket).ok())
                        .flatten()
                });
            }
        })
        .map_err(|e| CellError::io("the broker bridge's thread", e))?;
    Pending::new(CONTROL, channel_tx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_needs_a_directory_of_its_own() {
        assert_eq!(
            socket_dir(Path::new(airlock_contract::BROKER_SOCKET)).unwrap(),
            Path::new("/run/airlock")
        );
        assert!(socket_dir(Path::new("/broker.sock")).is_err());
    }
}
