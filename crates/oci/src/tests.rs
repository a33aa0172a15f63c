//! The spec of a plan, field by field: what the sandbox gets and what it must not.

use super::*;
use airlock_contract::{compile, parse_contract, CompileInput, ContractFormat};
use std::path::Path;

const CONTRACT: &str = "
isolation: gvisor
identity: { uid: 1000, gid: 1001 }
filesystem:
  readonly_inputs: [{ source: /srv/data, target: /input }]
  writable_paths:
    - { path: /tmp, size_mb: 8 }
    - { path: /out, size_mb: 4, exec: false }
  output_allowlist: [/out/*]
resources: { memory_mb: 256, process_limit: 32, open_files: 128, file_size_mb: 2 }
";

fn plan() -> CellPlan {
    let contract = parse_contract(CONTRACT, ContractFormat::Yaml).unwrap();
    let argv = vec!["/bin/true".to_string()];
    compile(&contract, &CompileInput::new(Path::new("/"), &argv)).unwrap()
}

fn host() -> BundleHost {
    BundleHost {
        rootfs: PathBuf::from("/run/airlock-gvisor/c/bundle/rootfs"),
        system: vec![(PathBuf::from("/usr"), PathBuf::from("/usr"))],
        etc_entries: vec![(
            PathBuf::from("/etc/ld.so.cache"),
            PathBuf::from("/etc/ld.so.cache"),
        )],
        writable: vec![PathBuf::from("/run/w/0"), PathBuf::from("/run/w/1")],
        cgroups_path: PathBuf::from("/airlock/1-2-3"),
        root_host_id: 1_000_000_007,
        payload_host_id: 1_000_000_008,
        oom_score_adj: None,
    }
}

fn spec() -> Spec {
    runtime_spec(&plan(), &host(), vec!["PATH=/usr/bin:/bin".into()]).unwrap()
}

#[test]
fn the_payload_runs_as_the_plan_identity_with_no_capability_and_no_new_privileges() {
    let spec = spec();
    let process = spec.process().as_ref().unwrap();
    assert_eq!(process.user().uid(), 1000);
    assert_eq!(process.user().gid(), 1001);
    assert_eq!(process.no_new_privileges(), Some(true));
    let caps = process.capabilities().as_ref().unwrap();
    for set in [
        caps.bounding(),
        caps.effective(),
        caps.inheritable(),
        caps.permitted(),
        caps.ambient(),
    ] {
        assert!(set.as_ref().is_none_or(|s| s.is_empty()), "{set:?}");
    }
    assert_eq!(process.args().as_ref().unwrap(), &["/bin/true"]);
    assert_eq!(process.env().as_ref().unwrap(), &["PATH=/usr/bin:/bin"]);
}

#[test]
fn only_two_ids_exist_on_the_host_the_sandbox_root_and_the_payload_each_mapped_to_its_own() {
    let spec = spec();
    let linux = spec.linux().as_ref().unwrap();
    let uids = linux.uid_mappings().as_ref().unwrap();
    let pairs: Vec<(u32, u32, u32)> = uids
        .iter()
        .map(|m| (m.container_id(), m.host_id(), m.size()))
        .collect();
    assert_eq!(pairs, [(0, 1_000_000_007, 1), (1000, 1_000_000_008, 1)]);
    let gids: Vec<(u32, u32)> = linux
        .gid_mappings()
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| (m.container_id(), m.host_id()))
        .collect();
    assert_eq!(gids, [(0, 1_000_000_007), (1001, 1_000_000_008)]);
    let types: Vec<_> = linux
        .namespaces()
        .as_ref()
        .unwrap()
        .iter()
        .map(|n| n.typ())
        .collect();
    assert!(types.contains(&LinuxNamespaceType::User));
    assert!(types.contains(&LinuxNamespaceType::Network));
}

#[test]
fn a_payload_that_would_be_the_sandbox_root_is_refused() {
    let mut plan = plan();
    plan.identity.uid = 0;
    assert!(matches!(
        runtime_spec(&plan, &host(), Vec::new()),
        Err(OciError::RootPayload)
    ));
}

#[test]
fn the_cgroup_is_airlocks_and_the_spec_sets_no_resources_runsc_would_own() {
    let spec = spec();
    let linux = spec.linux().as_ref().unwrap();
    assert_eq!(
        linux.cgroups_path().as_deref(),
        Some(Path::new("/airlock/1-2-3"))
    );
    assert!(linux.resources().is_none());
}

#[test]
fn the_sandbox_oom_score_is_set_only_when_asked() {
    let process = spec().process().clone().unwrap();
    assert_eq!(process.oom_score_adj(), None);
    let host = BundleHost {
        oom_score_adj: Some(1000),
        ..host()
    };
    let spec = runtime_spec(&plan(), &host, Vec::new()).unwrap();
    assert_eq!(spec.process().as_ref().unwrap().oom_score_adj(), Some(1000));
}

#[test]
fn rlimits_carry_the_plan_and_nproc_is_the_process_limit() {
    let spec = spec();
    let rlimits = spec.process().as_ref().unwrap().rlimits().clone().unwrap();
    let value = |typ| {
        rlimits
            .iter()
            .find(|r| r.typ() == typ)
            .map(|r| (r.soft(), r.hard()))
    };
    assert_eq!(value(PosixRlimitType::RlimitNproc), Some((32, 32)));
    assert_eq!(value(PosixRlimitType::RlimitNofile), Some((128, 128)));
    assert_eq!(
        value(PosixRlimitType::RlimitFsize),
        Some((2 << 20, 2 << 20))
    );
    assert_eq!(value(PosixRlimitType::RlimitCore), Some((0, 0)));
}

#[test]
fn the_root_is_read_only_and_every_host_mount_is_nosuid_nodev_with_writable_ones_on_host_tmpfs() {
    let spec = spec();
    assert_eq!(spec.root().as_ref().unwrap().readonly(), Some(true));
    let mounts = spec.mounts().as_ref().unwrap();
    let find = |target: &str| {
        mounts
            .iter()
            .find(|m| m.destination() == Path::new(target))
            .unwrap_or_else(|| panic!("no mount at {target}"))
    };
    let options = |target: &str| find(target).options().clone().unwrap_or_default();
    for target in ["/usr", "/input", "/etc/ld.so.cache", "/tmp", "/out"] {
        let o = options(target);
        assert!(o.contains(&"nosuid".to_string()), "{target}: {o:?}");
        assert!(o.contains(&"nodev".to_string()), "{target}: {o:?}");
        assert_eq!(find(target).typ().as_deref(), Some("bind"));
    }
    for target in ["/usr", "/input", "/etc/ld.so.cache"] {
        assert!(options(target).contains(&"ro".to_string()), "{target}");
    }
    assert_eq!(
        find("/tmp").source().as_deref(),
        Some(Path::new("/run/w/0"))
    );
    assert_eq!(
        find("/out").source().as_deref(),
        Some(Path::new("/run/w/1"))
    );
    assert!(options("/out").contains(&"noexec".to_string()));
    assert!(!options("/tmp").contains(&"noexec".to_string()));
    assert_eq!(find("/proc").typ().as_deref(), Some("proc"));
    assert!(options("/dev/shm").contains(&format!("size={}", 64u64 << 20)));
}

#[test]
fn a_bundle_without_a_directory_per_writable_path_is_refused() {
    let mut host = host();
    host.writable.pop();
    assert!(matches!(
        runtime_spec(&plan(), &host, Vec::new()),
        Err(OciError::WritableMismatch {
            planned: 2,
            prepared: 1
        })
    ));
}

#[test]
fn the_spec_serialises_as_runsc_reads_it() {
    let json = serde_json::to_value(spec()).unwrap();
    assert_eq!(json["ociVersion"], OCI_VERSION);
    assert_eq!(json["process"]["noNewPrivileges"], true);
    assert_eq!(json["linux"]["cgroupsPath"], "/airlock/1-2-3");
    assert_eq!(json["linux"]["uidMappings"][1]["containerID"], 1000);
}
