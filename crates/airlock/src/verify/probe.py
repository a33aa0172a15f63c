# The payload of `airlock verify` (crates/airlock/src/verify/mod.rs): it runs inside the
# cell under test and tries the forbidden thing its mode names. Every attempt prints one
# JSON line {"attempt", "outcome": "reached" | "refused", "detail"}; the last line is
# {"probe": "done"}, so that a probe that could not run is never read as "nothing got
# through". The verdicts do not trust these lines alone: each check also looks at what the
# host saw (connections to its endpoint, its marker process, its socket, the exports).
import json, os, signal, socket, sys, time


def say(attempt, outcome, detail=""):
    if isinstance(detail, OSError) and detail.strerror:
        detail = detail.strerror
    print(json.dumps({"attempt": attempt, "outcome": outcome, "detail": str(detail)}), flush=True)


def done():
    print(json.dumps({"probe": "done"}), flush=True)


def read(path):
    try:
        with open(path, "rb") as f:
            data = f.read(4096)
        say("read " + path, "reached", data.decode("utf-8", "replace"))
    except OSError as e:
        say("read " + path, "refused", e)


def write(path):
    try:
        with open(path, "xb") as f:
            f.write(b"written by airlock verify\n")
        say("write " + path, "reached")
    except OSError as e:
        say("write " + path, "refused", e)


BANNER = b"airlock-verify-endpoint"


def answered(s):
    """Whether the other end is verify's endpoint (it greets every connection)."""
    try:
        s.settimeout(2)
        return s.recv(len(BANNER)) == BANNER
    except OSError:
        return False


def connect(host, port, attempt):
    try:
        with socket.create_connection((host, port), timeout=2) as s:
            if answered(s):
                say(attempt, "reached")
            else:
                say(attempt, "refused", "connected, but the endpoint did not answer")
    except OSError as e:
        say(attempt, "refused", e)


def proxy():
    url = os.environ.get("HTTPS_PROXY") or os.environ.get("HTTP_PROXY")
    if not url:
        return None
    hostport = url.split("://", 1)[-1].rstrip("/")
    host, port = hostport.rsplit(":", 1)
    return host, int(port)


def via_proxy(target, attempt):
    """CONNECT through the cell's egress proxy, if the contract gave it one."""
    where = proxy()
    if where is None:
        say(attempt + " via proxy", "refused", "no proxy in this cell (network: deny)")
        return
    try:
        with socket.create_connection(where, timeout=5) as s:
            s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
            head = b""
            # Byte by byte: what follows the proxy's answer is the endpoint's.
            while b"\r\n\r\n" not in head and len(head) < 4096:
                byte = s.recv(1)
                if not byte:
                    break
                head += byte
            status = head.split(b"\r\n", 1)[0].decode("latin-1")
            if " 200" in status and answered(s):
                say(attempt + " via proxy", "reached", status)
            else:
                say(attempt + " via proxy", "refused", status)
    except OSError as e:
        say(attempt + " via proxy", "refused", e)


def resolve_and_connect(name, port):
    """The transparent path: the cell's own resolver, then a direct connection."""
    try:
        addrs = sorted({a[4][0] for a in socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)})
    except OSError as e:
        say("resolve " + name, "refused", e)
        return
    # Resolving is not reaching: an allowlisted name resolves to the cell's own proxy.
    say("resolve " + name, "noted", ",".join(addrs))
    for addr in addrs:
        connect(addr, port, "connect %s (%s):%d" % (name, addr, port))


def egress_name(name, port):
    via_proxy("%s:%d" % (name, port), "connect %s:%d" % (name, port))
    resolve_and_connect(name, port)


PRIVATE = ["169.254.169.254", "10.0.0.1", "172.16.0.1", "192.168.0.1", "100.64.0.1", "fd00::1"]


def egress_addresses(port):
    connect("127.0.0.1", port, "connect 127.0.0.1:%d" % port)
    via_proxy("127.0.0.1:%d" % port, "connect 127.0.0.1:%d" % port)
    for addr in PRIVATE:
        target = "[%s]:80" % addr if ":" in addr else "%s:80" % addr
        connect(addr, 80, "connect " + target)
        via_proxy(target, "connect " + target)


def processes(reversed_marker, host_pid, host_pidns, host_netns):
    marker = reversed_marker[::-1]
    seen = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                if marker.encode() in f.read():
                    seen.append(entry)
        except OSError:
            pass
    say("find the marker process in /proc", "reached" if seen else "refused", ",".join(seen))
    try:
        os.kill(int(host_pid), signal.SIGTERM)
        say("signal host pid %s" % host_pid, "reached")
    except OSError as e:
        say("signal host pid %s" % host_pid, "refused", e)
    for ns, host in (("pid", host_pidns), ("net", host_netns)):
        try:
            mine = os.readlink("/proc/self/ns/" + ns)
            say("share the host's %s namespace" % ns, "reached" if mine == host else "refused", mine)
        except OSError as e:
            say("share the host's %s namespace" % ns, "refused", e)


def runtime_socket(path):
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(path)
            s.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
            say("connect " + path, "reached")
    except OSError as e:
        say("connect " + path, "refused", e)


def writable(paths):
    return [p for p in paths if os.path.isdir(p)]


def plant(name, paths):
    for p in writable(paths):
        write(os.path.join(p, name))


def find(name, paths):
    for p in paths:
        path = os.path.join(p, name)
        say("find " + path, "reached" if os.path.lexists(path) else "refused")


def memory(mib):
    chunks = []
    for _ in range(mib):
        chunk = bytearray(1 << 20)
        for i in range(0, len(chunk), 4096):
            chunk[i] = 1
        chunks.append(chunk)
    say("allocate %d MiB" % mib, "reached")


def processes_beyond(count):
    children = []
    for _ in range(count):
        try:
            pid = os.fork()
        except OSError as e:
            say("fork process %d" % (len(children) + 1), "refused", e)
            break
        if pid == 0:
            time.sleep(3)
            os._exit(0)
        children.append(pid)
    else:
        say("fork %d processes" % count, "reached")
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    # Exit non-zero when a fork was refused: the ceiling decided this run.
    sys.exit(0 if len(children) == count else 1)


def fill(path):
    try:
        with open(os.path.join(path, "airlock-verify-fill"), "wb") as f:
            block = b"\0" * (1 << 16)
            while True:
                f.write(block)
                f.flush()
    except OSError as e:
        say("fill " + path, "refused", e)
        sys.exit(1)


def flood(count):
    out = sys.stdout.buffer
    block = b"x" * 65536
    written = 0
    while written < count:
        out.write(block)
        written += len(block)
    out.flush()


def credential(var):
    value = os.environ.get(var, "")
    say("print the injected credential", "reached" if value else "refused", value)
    print("credential on stderr: " + value, file=sys.stderr, flush=True)


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "read":
        for path in args:
            read(path)
    elif mode == "write":
        for path in args:
            write(path)
    elif mode == "egress-name":
        egress_name(args[0], int(args[1]))
    elif mode == "egress-private":
        egress_addresses(int(args[0]))
        egress_name(args[1], int(args[0]))
    elif mode == "processes":
        processes(*args)
    elif mode == "socket":
        for path in args:
            runtime_socket(path)
    elif mode == "plant":
        plant(args[0], args[1:])
    elif mode == "find":
        find(args[0], args[1:])
    elif mode == "exercise":
        for path in args[1:]:
            read(path)
        egress_addresses(int(args[0]))
    elif mode == "credential":
        credential(args[0])
    elif mode == "memory":
        memory(int(args[0]))
    elif mode == "processes-beyond":
        processes_beyond(int(args[0]))
    elif mode == "fill":
        fill(args[0])
    elif mode == "flood":
        flood(int(args[0]))
    elif mode == "sleep":
        time.sleep(float(args[0]))
    else:
        raise SystemExit("unknown mode " + mode)
    done()


main()
