//! A payload's attempts to reach anything but airlock's proxy from an allowlisted gVisor
//! sandbox, one-shot (gvisor.rs) or in a session (gvisor_sessions.rs): the upstream
//! directly, the host's addresses, UDP (a DNS server on port 53 and a host listener), a
//! host unix socket under a bind; then, optionally, killing the egress forwarder, and the
//! proxy's address once it is dead. Every attempt that succeeds prints BREACH and makes
//! the script exit 0; the host side checks that nothing arrived at its listeners.

use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

pub struct RouteProbe {
    raw: TcpListener,
    udp: UdpSocket,
    unix: UnixListener,
    /// Outside /tmp, which is a writable path of the sandbox.
    inputs: tempfile::TempDir,
    socket: PathBuf,
    addresses: Vec<String>,
    upstream_port: u16,
}

impl RouteProbe {
    /// Host listeners on every address (TCP, UDP) and a world-writable unix socket; the
    /// addresses tried are the upstream's, loopback's and the host's own.
    pub fn new(upstream_ip: &str, upstream_port: u16) -> RouteProbe {
        use std::os::unix::fs::PermissionsExt;
        let raw = TcpListener::bind("0.0.0.0:0").unwrap();
        raw.set_nonblocking(true).unwrap();
        let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
        udp.set_nonblocking(true).unwrap();
        let inputs = tempfile::tempdir_in("/var/tmp").unwrap();
        let socket = inputs.path().join("host.sock");
        let unix = UnixListener::bind(&socket).unwrap();
        unix.set_nonblocking(true).unwrap();
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
        let mut addresses = vec![upstream_ip.to_string()];
        addresses.extend(super::host::ipv4_addresses());
        RouteProbe {
            raw,
            udp,
            unix,
            inputs,
            socket,
            addresses,
            upstream_port,
        }
    }

    /// The contract lines that bind the unix socket's directory into the sandbox.
    pub fn contract_inputs(&self) -> String {
        format!(
            "filesystem:\n  readonly_inputs:\n    - {}\n",
            self.inputs.path().display()
        )
    }

    /// The python3 script: every attempt, then (with `kill_forwarder`) the forwarder
    /// killed, then the proxy's address and every attempt again. It exits 1 when nothing
    /// got through, 0 on a breach.
    pub fn script(&self, kill_forwarder: bool) -> String {
        let kill = if kill_forwarder { "True" } else { "False" };
        format!(
            r#"
import os, signal, socket, sys, time
breach = False
def attempts(when):
    global breach
    for a in {addresses:?}:
        for p in ({port}, {raw_port}):
            try:
                socket.create_connection((a, p), timeout=2).send(b'breach')
                print('BREACH tcp', when, a, p); breach = True
            except OSError as e:
                print('refused tcp', when, a, p, e)
        for p in (53, {udp_port}):
            try:
                u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(1)
                u.sendto(b'\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03api\x04test\x00\x00\x01\x00\x01', (a, p))
                u.recvfrom(512); print('BREACH udp', when, a, p); breach = True
            except OSError as e:
                print('no udp', when, a, p, e)
    try:
        s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect('{sock}')
        print('BREACH unix', when); breach = True
    except OSError as e:
        print('refused unix', when, e)
attempts('before')
if {kill}:
    pids = [p for p in os.listdir('/proc') if p.isdigit()
            and open('/proc/%s/cmdline' % p, 'rb').read().split(b'\0')[1:2] == [b'--airlock-gvisor-forward']]
    print('forwarders', pids)
    if not pids:
        print('BREACH no forwarder found'); sys.exit(0)
    for p in pids:
        os.kill(int(p), signal.SIGKILL)
    time.sleep(1)
try:
    socket.create_connection(('127.0.0.1', 3128), timeout=2)
    print('BREACH proxy after kill'); breach = True
except OSError as e:
    print('refused proxy after kill', e)
attempts('after-kill')
sys.exit(0 if breach else 1)
"#,
            addresses = self.addresses,
            port = self.upstream_port,
            raw_port = self.raw.local_addr().unwrap().port(),
            udp_port = self.udp.local_addr().unwrap().port(),
            sock = self.socket.display(),
        )
    }

    /// Nothing arrived at the host's listeners.
    pub fn assert_nothing_arrived(&self) {
        assert_no_connection_arrived(&self.raw);
        let mut buf = [0u8; 16];
        assert!(self.udp.recv_from(&mut buf).is_err(), "a datagram arrived");
        assert!(self.unix.accept().is_err(), "a unix connection arrived");
    }
}

/// Nothing connected to `listener` (non-blocking): a connection is a breach.
pub fn assert_no_connection_arrived(listener: &TcpListener) {
    match listener.accept() {
        Ok((mut stream, from)) => {
            let mut buf = [0u8; 16];
            let n = stream.read(&mut buf).unwrap_or(0);
            panic!("a connection from {from} arrived ({:?})", &buf[..n]);
        }
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock),
    }
}
