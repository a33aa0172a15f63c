//! The bundle's terms: what containerd's default spec gives, and each refusal naming the
//! spec's field and the rule.

use crate::bundle::*;
use airlock_contract::default_contract;
use oci_spec::runtime::Spec;
use serde_json::{json, Value};
use std::path::Path;

/// A spec like the one `ctr run` writes (containerd's default spec, trimmed).
fn base() -> Value {
    json!({
        "ociVersion": "1.1.0",
        "process": {
            "user": {"uid": 0, "gid": 0},
            "args": ["/bin/sh", "-c", "echo hi"],
            "env": ["PATH=/usr/bin:/bin", "A=b=c"],
            "cwd": "/",
            "capabilities": {
                "bounding": ["CAP_CHOWN", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
                "effective": ["CAP_CHOWN", "CAP_KILL"],
                "permitted": ["CAP_CHOWN", "CAP_KILL"]
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": true
        },
        "root": {"path": "rootfs"},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts"},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm"},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue"},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["ro"]},
            {"destination": "/run", "type": "tmpfs", "source": "tmpfs"}
        ],
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "network"}],
            "resources": {
                "memory": {"limit": 64u64 << 20},
                "pids": {"limit": 32},
                "cpu": {"quota": 50000, "period": 100000}
            },
            "maskedPaths": ["/proc/kcore"],
            "readonlyPaths": ["/proc/sys"]
        }
    })
}

fn terms(spec: Value) -> Result<ContainerTerms, SpecRefusal> {
    let spec: Spec = serde_json::from_value(spec).expect("a valid spec");
    container_terms(&spec, "c1", Path::new("/run/bundle/c1"))
}

fn refused(spec: Value) -> SpecRefusal {
    terms(spec).expect_err("refused")
}

#[test]
fn containerds_default_spec_is_accepted_with_the_cells_own_kernel_file_systems() {
    let t = terms(base()).unwrap();
    assert_eq!(t.argv, ["/bin/sh", "-c", "echo hi"]);
    assert_eq!(t.env[1], ("A".to_owned(), "b=c".to_owned()));
    assert_eq!(t.user, None, "uid 0 is the contract's identity");
    assert_eq!(t.rootfs, Path::new("/run/bundle/c1/rootfs"));
    assert!(t.inputs.is_empty());
    assert_eq!(t.memory_bytes, Some(64 << 20));
    assert_eq!(t.pids, Some(32));
    assert_eq!(t.cpu_millis, Some(500));
    assert_eq!(t.open_files, Some(1024));
    assert_eq!(t.selection, Selection::Default);
    assert_eq!(t.identity.id, "c1");
    assert_eq!(t.identity.pod, None);
}

#[test]
fn the_spec_lowers_the_contracts_ceilings_and_never_raises_them() {
    let mut spec = base();
    spec["linux"]["resources"]["memory"]["limit"] = json!(64u64 << 30);
    let t = terms(spec).unwrap();
    let mut contract = default_contract();
    let before = contract.resources;
    apply_terms(&mut contract, &t, "config.json").unwrap();
    assert_eq!(contract.resources.memory_mb, before.memory_mb, "not raised");
    assert_eq!(
        contract.resources.process_limit,
        32.min(before.process_limit)
    );
    assert_eq!(contract.resources.cpu_millis, 500.min(before.cpu_millis));
    assert_eq!(contract.image, "oci-bundle:c1");
    assert_eq!(contract.seccomp_profile, "default");
}

#[test]
fn the_cri_annotations_are_the_containers_identity_and_airlocks_select_its_contract() {
    let mut spec = base();
    spec["annotations"] = json!({
        "io.kubernetes.cri.sandbox-namespace": "team-a",
        "io.kubernetes.cri.sandbox-name": "agent-0",
        "io.kubernetes.cri.container-name": "tool",
        "airlock.dev/contract": "agents-v1"
    });
    let t = terms(spec.clone()).unwrap();
    assert_eq!(t.identity.namespace.as_deref(), Some("team-a"));
    assert_eq!(t.identity.pod.as_deref(), Some("agent-0"));
    assert_eq!(t.identity.container.as_deref(), Some("tool"));
    assert_eq!(t.selection, Selection::Contract("agents-v1".into()));
    spec["annotations"]["airlock.dev/class"] = json!("build");
    let err = refused(spec.clone());
    assert!(err.field.contains("airlock.dev/contract"), "{err}");
    spec["annotations"]["airlock.dev/class"] = json!("");
    spec["annotations"]["airlock.dev/contract"] = json!("../../etc/passwd");
    let err = refused(spec);
    assert!(err.rule.contains("not a name"), "{err}");
}

#[test]
fn a_mapping_onto_host_root_is_refused() {
    let mut spec = base();
    spec["linux"]["uidMappings"] = json!([{"containerID": 0, "hostID": 0, "size": 65536}]);
    let err = refused(spec);
    assert_eq!(err.field, "linux.uidMappings");
    assert!(err.rule.contains("host root"), "{err}");
}

#[test]
fn a_privileged_capability_is_refused_naming_the_set_and_the_capability() {
    for set in [
        "bounding",
        "effective",
        "permitted",
        "ambient",
        "inheritable",
    ] {
        let mut spec = base();
        spec["process"]["capabilities"][set] = json!(["CAP_CHOWN", "CAP_SYS_ADMIN"]);
        let err = refused(spec);
        assert_eq!(err.field, format!("process.capabilities.{set}"));
        assert!(err.rule.contains("CAP_SYS_ADMIN"), "{err}");
    }
}

#[test]
fn sensitive_host_mounts_are_refused() {
    for source in [
        "/",
        "/proc",
        "/sys/fs/cgroup",
        "/dev",
        "/var/run/docker.sock",
        "/run/containerd/containerd.sock",
        "/etc/kubernetes/admin.conf",
    ] {
        let mut spec = base();
        spec["mounts"]
            .as_array_mut()
            .unwrap()
            .push(json!({"destination": "/host", "type": "bind", "source": source, "options": ["rbind", "ro"]}));
        let err = refused(spec);
        assert!(
            err.field.starts_with("mounts[7] (/host)"),
            "{source}: {err}"
        );
        assert!(
            err.rule.contains("never given to a cell"),
            "{source}: {err}"
        );
    }
}

#[test]
fn a_writable_bind_mount_is_refused_and_a_read_only_one_is_an_input() {
    let mut spec = base();
    let mounts = spec["mounts"].as_array_mut().unwrap();
    mounts.push(json!({"destination": "/data", "type": "bind", "source": "/srv/data", "options": ["rbind", "rw"]}));
    let err = refused(spec.clone());
    assert!(err.rule.contains("writable host bind mount"), "{err}");
    spec["mounts"][7]["options"] = json!(["rbind", "ro"]);
    let t = terms(spec).unwrap();
    assert_eq!(t.inputs, [("/srv/data".into(), "/data".into())]);
    let mut contract = default_contract();
    apply_terms(&mut contract, &t, "config.json").unwrap();
    assert_eq!(contract.filesystem.readonly_inputs.len(), 1);
}

#[test]
fn a_kernel_file_system_elsewhere_is_refused() {
    let mut spec = base();
    spec["mounts"][0]["destination"] = json!("/host-proc");
    let err = refused(spec);
    assert!(err.field.starts_with("mounts[0] (/host-proc)"), "{err}");
}

#[test]
fn devices_hooks_and_sysctls_are_refused() {
    let mut spec = base();
    spec["linux"]["devices"] =
        json!([{"path": "/dev/kvm", "type": "c", "major": 10, "minor": 232}]);
    assert_eq!(refused(spec).field, "linux.devices");
    let mut spec = base();
    spec["hooks"] = json!({"prestart": [{"path": "/usr/bin/true"}]});
    assert_eq!(refused(spec).field, "hooks");
    let mut spec = base();
    spec["linux"]["sysctl"] = json!({"net.ipv4.ip_forward": "1"});
    assert_eq!(refused(spec).field, "linux.sysctl");
}

#[test]
fn an_allow_by_default_seccomp_profile_is_refused_and_a_deny_by_default_one_is_the_contracts() {
    let mut spec = base();
    spec["linux"]["seccomp"] = json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
        {"names": ["ptrace"], "action": "SCMP_ACT_ERRNO"}]});
    let err = refused(spec.clone());
    assert_eq!(err.field, "linux.seccomp.defaultAction");
    assert!(err.rule.contains("weaker"), "{err}");
    spec["linux"]["seccomp"]["defaultAction"] = json!("SCMP_ACT_ERRNO");
    spec["linux"]["seccomp"]["syscalls"][0]["names"] = json!(["read", "write"]);
    spec["linux"]["seccomp"]["syscalls"][0]["action"] = json!("SCMP_ACT_ALLOW");
    let t = terms(spec).unwrap();
    let profile: Value = serde_json::from_str(t.seccomp_profile.as_deref().unwrap()).unwrap();
    assert_eq!(profile["defaultAction"], "SCMP_ACT_ERRNO");
    let mut contract = default_contract();
    apply_terms(&mut contract, &t, "config.json#linux.seccomp").unwrap();
    assert_eq!(contract.seccomp_profile, "config.json#linux.seccomp");
    let mut own = default_contract();
    own.seccomp_profile = "profile.json".into();
    assert_eq!(
        apply_terms(&mut own, &t, "x").unwrap_err().field,
        "linux.seccomp"
    );
}

#[test]
fn joining_a_pid_mount_or_user_namespace_is_refused_naming_the_kind() {
    for (at, kind, path, says) in [
        (0, "pid", "/proc/1/ns/pid", "see and signal"),
        (3, "mount", "/proc/1/ns/mnt", "creates its own"),
    ] {
        let mut spec = base();
        spec["linux"]["namespaces"][at] = json!({"type": kind, "path": path});
        let err = refused(spec);
        assert_eq!(
            err.field,
            format!("linux.namespaces[{kind}].path ({path})"),
            "{err}"
        );
        assert!(err.rule.contains(says), "{err}");
    }
    for (kind, path) in [
        ("user", "/proc/1/ns/user"),
        ("cgroup", "/proc/1/ns/cgroup"),
        ("time", "/proc/1/ns/time"),
    ] {
        let mut spec = base();
        spec["linux"]["namespaces"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": kind, "path": path}));
        let field = refused(spec).field;
        assert!(
            field.starts_with(&format!("linux.namespaces[{kind}].path")),
            "{field}"
        );
    }
}

/// An application container of a pod as the CRI plugin makes it: the sandbox's
/// namespaces by path, its annotations, and its standard mounts.
fn application(sandbox: &str) -> Value {
    let ns = |kind: &str| format!("/proc/4242/ns/{kind}");
    let cri = "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes";
    let kubelet = "/var/lib/kubelet/pods/0b5e9a4c-uid";
    let mut spec = base();
    spec["linux"]["namespaces"] = json!([
        {"type": "pid"}, {"type": "mount"},
        {"type": "ipc", "path": ns("ipc")},
        {"type": "uts", "path": ns("uts")},
        {"type": "network", "path": ns("net")},
    ]);
    spec["annotations"] = json!({
        "io.kubernetes.cri.sandbox-id": sandbox,
        "io.kubernetes.cri.container-name": "tools",
    });
    let bind = |src: String, dst: &str, mode: &str| {
        json!({"destination": dst, "type": "bind", "source": src,
               "options": ["rbind", "rprivate", mode]})
    };
    let mounts = spec["mounts"].as_array_mut().unwrap();
    mounts.extend([
        bind(format!("{kubelet}/etc-hosts"), "/etc/hosts", "rw"),
        bind(
            format!("{kubelet}/containers/tools/5d41402a"),
            "/dev/termination-log",
            "rw",
        ),
        bind(format!("{cri}/{sandbox}/hostname"), "/etc/hostname", "rw"),
        bind(
            format!("{cri}/{sandbox}/resolv.conf"),
            "/etc/resolv.conf",
            "rw",
        ),
        bind(
            format!("/run/containerd/io.containerd.grpc.v1.cri/sandboxes/{sandbox}/shm"),
            "/dev/shm",
            "rw",
        ),
        bind(
            format!("{kubelet}/volumes/kubernetes.io~projected/kube-api-access-x"),
            "/var/run/secrets/kubernetes.io/serviceaccount",
            "ro",
        ),
    ]);
    spec
}

#[test]
fn a_pods_application_container_joins_its_ipc_and_uts_and_takes_cris_files_read_only() {
    let t = terms(application("abc123")).unwrap();
    assert_eq!(
        t.network_namespace.as_deref(),
        Some(Path::new("/proc/4242/ns/net"))
    );
    assert_eq!(
        t.ipc_namespace.as_deref(),
        Some(Path::new("/proc/4242/ns/ipc"))
    );
    assert_eq!(
        t.uts_namespace.as_deref(),
        Some(Path::new("/proc/4242/ns/uts"))
    );
    let cri = "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/abc123";
    let etc: Vec<(String, &str)> = t
        .pod_etc_files
        .iter()
        .map(|(source, name)| (source.display().to_string(), name.as_str()))
        .collect();
    assert_eq!(
        etc,
        [
            (
                "/var/lib/kubelet/pods/0b5e9a4c-uid/etc-hosts".to_owned(),
                "hosts"
            ),
            (format!("{cri}/hostname"), "hostname"),
            (format!("{cri}/resolv.conf"), "resolv.conf"),
        ]
    );
    // /dev/shm and the termination log are the cell's own; the token a read-only input.
    assert_eq!(t.inputs.len(), 1, "{:?}", t.inputs);
    assert_eq!(
        t.inputs[0].1,
        Path::new("/var/run/secrets/kubernetes.io/serviceaccount")
    );
    let pod = t.pod_input().unwrap();
    assert_eq!(pod.ipc, Some(Path::new("/proc/4242/ns/ipc")));
    assert_eq!(pod.etc_files.len(), 3);
    apply_terms(&mut pod_contract(), &t, "x").unwrap();
}

#[test]
fn a_pods_sandbox_container_takes_its_shm_and_resolv_conf_binds_as_cri_makes_them() {
    let mut spec = with_network("/var/run/netns/cni-1");
    spec["annotations"] = json!({"io.kubernetes.cri.sandbox-id": "sbx9"});
    let cri = "io.containerd.grpc.v1.cri/sandboxes/sbx9";
    spec["mounts"].as_array_mut().unwrap().extend([
        json!({"destination": "/dev/shm", "type": "bind",
               "source": format!("/run/containerd/{cri}/shm"),
               "options": ["rbind", "ro", "nosuid", "nodev", "noexec"]}),
        json!({"destination": "/etc/resolv.conf", "type": "bind",
               "source": format!("/var/lib/containerd/{cri}/resolv.conf"),
               "options": ["rbind", "ro"]}),
    ]);
    let t = terms(spec).unwrap();
    assert!(t.inputs.is_empty(), "{:?}", t.inputs);
    assert_eq!(t.pod_etc_files.len(), 1);
    assert_eq!(t.pod_etc_files[0].1, "resolv.conf");
    apply_terms(&mut pod_contract(), &t, "x").unwrap();
}

#[test]
fn a_pods_ipc_uts_and_files_are_refused_without_a_pod_contract() {
    let mut spec = application("abc123");
    spec["linux"]["namespaces"][4] = json!({"type": "network"});
    let t = terms(spec).unwrap();
    let err = apply_terms(&mut default_contract(), &t, "x").unwrap_err();
    assert_eq!(err.field, "linux.namespaces[ipc].path (/proc/4242/ns/ipc)");
    assert!(err.rule.contains("network.mode pod"), "{err}");
    let mut spec = base();
    spec["linux"]["namespaces"][2] = json!({"type": "uts", "path": "/proc/1/ns/uts"});
    let err = apply_terms(&mut default_contract(), &terms(spec).unwrap(), "x").unwrap_err();
    assert_eq!(err.field, "linux.namespaces[uts].path (/proc/1/ns/uts)");
    let mut spec = application("abc123");
    spec["linux"]["namespaces"] = json!([{"type": "pid"}, {"type": "network"}]);
    let err = apply_terms(&mut default_contract(), &terms(spec).unwrap(), "x").unwrap_err();
    assert!(err.field.starts_with("mounts (/etc/hosts from "), "{err}");
}

#[test]
fn a_host_name_with_a_joined_uts_namespace_is_refused() {
    let mut spec = application("abc123");
    spec["hostname"] = json!("mine");
    let err = refused(spec);
    assert_eq!(err.field, "hostname");
    assert!(err.rule.contains("pod's host name"), "{err}");
}

#[test]
fn cris_mounts_are_recognised_only_at_their_destinations_from_this_pods_directories() {
    let pod = CriPod {
        sandbox_id: Some("abc123".into()),
        container: Some("tools".into()),
    };
    let cri = "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes";
    let is = |dst: &str, src: &str| cri_mount(Path::new(dst), Path::new(src), &pod);
    assert_eq!(
        is("/etc/resolv.conf", &format!("{cri}/abc123/resolv.conf")),
        Some(CriMount::EtcFile("resolv.conf"))
    );
    // Another pod's files, another destination, another file, `..`, no annotation.
    for (dst, src) in [
        ("/etc/resolv.conf", format!("{cri}/other/resolv.conf")),
        ("/etc/motd", format!("{cri}/abc123/resolv.conf")),
        ("/etc/hosts", format!("{cri}/abc123/resolv.conf")),
        (
            "/etc/hostname",
            format!("{cri}/abc123/../../../../../etc/hostname"),
        ),
        (
            "/etc/hosts",
            "/var/lib/kubelet/pods/u/etc-hosts/../../../pki/x".into(),
        ),
        ("/dev/shm", "/dev/shm".into()),
        (
            "/dev/termination-log",
            "/var/lib/kubelet/pods/u/containers/other/1".into(),
        ),
        ("/etc/hosts", "/etc/hosts".into()),
    ] {
        assert_eq!(is(dst, &src), None, "{dst} from {src}");
    }
    let ctr = CriPod::default();
    assert_eq!(
        cri_mount(
            Path::new("/etc/hosts"),
            Path::new(&format!("{cri}/abc123/hosts")),
            &ctr
        ),
        None
    );
}

#[test]
fn other_writable_binds_to_cris_destinations_and_dotdot_sources_stay_refused() {
    let mut spec = application("abc123");
    // The host's /dev/shm (hostIPC), a host file at /etc/hosts: refused as before.
    spec["mounts"][11]["source"] = json!("/dev/shm");
    let err = refused(spec);
    assert!(err.field.contains("(/dev/shm)"), "{err}");
    let mut spec = base();
    spec["mounts"].as_array_mut().unwrap().push(json!({
        "destination": "/etc/hosts", "type": "bind", "source": "/srv/hosts",
        "options": ["rbind", "rw"]}));
    assert!(refused(spec).rule.contains("writable host bind mount"));
    let mut spec = base();
    spec["mounts"].as_array_mut().unwrap().push(json!({
        "destination": "/data", "type": "bind", "source": "/srv/../var/lib/containerd",
        "options": ["rbind", "ro"]}));
    assert!(refused(spec).rule.contains("`..`"));
}

fn with_network(path: &str) -> Value {
    let mut spec = base();
    spec["linux"]["namespaces"][4] = json!({"type": "network", "path": path});
    spec
}

fn pod_contract() -> airlock_contract::Contract {
    let mut contract = default_contract();
    contract.network.mode = airlock_contract::NetworkMode::Pod;
    contract
}

#[test]
fn a_network_namespace_path_is_a_term_and_joined_only_under_a_pod_contract() {
    let t = terms(with_network("/var/run/netns/cni-1")).unwrap();
    assert_eq!(
        t.network_namespace.as_deref(),
        Some(Path::new("/var/run/netns/cni-1"))
    );
    apply_terms(&mut pod_contract(), &t, "x").unwrap();
    // The default contract (network: deny) does not let the pod's author join one.
    let err = apply_terms(&mut default_contract(), &t, "x").unwrap_err();
    assert_eq!(
        err.field,
        "linux.namespaces[network].path (/var/run/netns/cni-1)"
    );
    assert!(err.rule.contains("network.mode deny"), "{err}");
    assert!(err.rule.contains("network.mode pod"), "{err}");
}

#[test]
fn a_pod_contract_without_a_network_namespace_path_is_refused() {
    let t = terms(base()).unwrap();
    assert_eq!(t.network_namespace, None);
    let err = apply_terms(&mut pod_contract(), &t, "x").unwrap_err();
    assert_eq!(err.field, "linux.namespaces[network]");
    assert!(err.rule.contains("names none"), "{err}");
    apply_terms(&mut default_contract(), &t, "x").unwrap();
}

#[test]
fn a_relative_network_namespace_path_is_refused() {
    let err = refused(with_network("netns/cni-1"));
    assert!(err.rule.contains("absolute"), "{err}");
}

#[test]
fn a_terminal_is_the_contracts_terminal() {
    let mut spec = base();
    spec["process"]["terminal"] = json!(true);
    let t = terms(spec).unwrap();
    assert!(t.terminal);
    let mut contract = default_contract();
    apply_terms(&mut contract, &t, "x").unwrap();
    assert!(contract.terminal);
    assert!(!terms(base()).unwrap().terminal);
}

#[test]
fn a_contract_with_an_image_of_its_own_is_refused() {
    let t = terms(base()).unwrap();
    let mut contract = default_contract();
    contract.image = "registry.test/x@sha256:00".into();
    assert_eq!(
        apply_terms(&mut contract, &t, "x").unwrap_err().field,
        "root.path"
    );
}

#[test]
fn a_non_root_user_is_kept() {
    let mut spec = base();
    spec["process"]["user"] = json!({"uid": 1234, "gid": 99});
    assert_eq!(terms(spec).unwrap().user, Some((1234, 99)));
}
