//! Applies the plan's Landlock rules (`CellPlan::layout.landlock`, decided by the contract
//! crate's `layout.rs`): the payload can read and execute the system tree and inputs,
//! write only its writable paths and device nodes, execute in a writable path only where
//! the plan allows it, and neither signal nor reach abstract unix sockets outside the
//! cell. Requires Landlock ABI 6 (Linux 6.12); anything less is refused, never silently
//! weakened.
//!
//! TCP is deliberately not restricted here. Landlock can only filter TCP by port, not by
//! address, and the cell's network namespace holds nothing but `lo`: every TCP connect
//! stays inside the cell, where the only listeners are the payload's own and (with an
//! allowlist) airlock's enforcing proxies. The namespace is the egress boundary; a port
//! filter on top of it would add nothing but break the payload's own test servers,
//! databases and kernels (docs/threat-model.md).

use crate::kernel::Kernel;
use crate::stage::Stage;
use airlock_contract::{FsAccess, LandlockPlan, LandlockRule};
use landlock::ABI;

/// The lowest ABI that has everything the cell relies on (fs rights and scopes).
pub const REQUIRED_ABI: ABI = ABI::V6;

fn bits(access: impl IntoIterator<Item = FsAccess>) -> u64 {
    access.into_iter().fold(0, |all, a| all | a.bit())
}

/// A rule's rights as the kernel takes them: on a file (an input file, a device node)
/// only the rights that apply to files.
fn rule_bits(rule: &LandlockRule, is_dir: bool) -> u64 {
    bits(
        rule.access
            .iter()
            .copied()
            .filter(|access| is_dir || access.on_file()),
    )
}

/// Applies the ruleset to the calling process (and so to everything it execs).
pub fn restrict<K: Kernel>(kernel: &mut K, plan: &LandlockPlan) -> Result<(), Stage> {
    kernel.landlock_create_ruleset(
        bits(FsAccess::ALL),
        plan.scope_signals,
        plan.scope_abstract_unix_sockets,
    )?;
    for rule in &plan.rules {
        // Paths of the plan that did not materialise (optional host dirs such as /lib32)
        // simply get no rule: no rule means no access.
        let Some(is_dir) = kernel.is_dir(&rule.path) else {
            continue;
        };
        kernel.landlock_add_rule(&rule.path, rule_bits(rule, is_dir))?;
    }
    kernel.landlock_restrict_self()
}

/// The Landlock ABI of the running kernel (0 when unsupported).
pub fn kernel_abi() -> i64 {
    crate::sys::landlock_abi_version()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::recording::{Call, RecordingKernel};
    use airlock_contract::{compile, parse_contract, CellPlan, CompileInput, ContractFormat};
    use landlock::{Access, AccessFs, BitFlags};
    use std::path::{Path, PathBuf};

    fn plan(yaml: &str) -> CellPlan {
        let contract = parse_contract(yaml, ContractFormat::Yaml).unwrap();
        compile(
            &contract,
            &CompileInput::new(Path::new("/jobs"), &["true".to_owned()]),
        )
        .unwrap()
    }

    /// The rules the kernel got, as `(path, rights)`.
    fn applied(plan: &CellPlan, kernel: &mut RecordingKernel) -> Vec<(String, BitFlags<AccessFs>)> {
        restrict(kernel, &plan.layout.landlock).unwrap();
        assert_eq!(
            kernel.calls.first(),
            Some(&Call::LandlockCreateRuleset {
                handled: AccessFs::from_all(REQUIRED_ABI).bits(),
                scope_signals: true,
                scope_abstract_unix_sockets: true,
            })
        );
        assert_eq!(kernel.calls.last(), Some(&Call::LandlockRestrictSelf));
        kernel.calls[1..kernel.calls.len() - 1]
            .iter()
            .map(|call| match call {
                Call::LandlockAddRule { path, access } => (
                    path.display().to_string(),
                    BitFlags::<AccessFs>::from_bits(*access).unwrap(),
                ),
                other => panic!("not a rule: {other:?}"),
            })
            .collect()
    }

    const DEVICES: [&str; 6] = [
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/random",
        "/dev/urandom",
        "/dev/tty",
    ];

    fn device_kernel(more_files: &[&str], missing: &[&str]) -> RecordingKernel {
        let files: Vec<&str> = DEVICES.iter().chain(more_files).copied().collect();
        RecordingKernel::with_files(&files, missing)
    }

    #[test]
    fn the_default_cell_gets_its_rules_in_order_with_file_rights_on_files() {
        let plan = plan("{}\n");
        let rules = applied(&plan, &mut device_kernel(&[], &["/lib32", "/libx32"]));
        let read = AccessFs::ReadFile | AccessFs::ReadDir;
        let read_exec = read | AccessFs::Execute;
        let device = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev;
        let all = AccessFs::from_all(REQUIRED_ABI);
        let mut expected: Vec<(String, BitFlags<AccessFs>)> = vec![
            ("/".into(), AccessFs::ReadDir.into()),
            ("/etc".into(), read),
            ("/proc".into(), read),
            ("/sys/fs/cgroup".into(), read),
            ("/dev".into(), AccessFs::ReadDir.into()),
            ("/dev/pts".into(), device | AccessFs::ReadDir),
            ("/dev/shm".into(), all & !AccessFs::Execute),
        ];
        expected.extend(DEVICES.iter().map(|d| (d.to_string(), device)));
        // The optional system dirs this host lacks get no rule at all.
        for dir in ["/usr", "/bin", "/sbin", "/lib", "/lib64"] {
            expected.push((dir.into(), read_exec));
        }
        expected.push(("/tmp".into(), all));
        assert_eq!(rules, expected);
    }

    #[test]
    fn inputs_are_read_and_execute_and_writable_paths_execute_only_when_allowed() {
        let plan = plan(
            "filesystem:\n  readonly_inputs: [input/report.docx, tools]\n  writable_paths: [output, { path: data, exec: false }]\n  output_allowlist: [output/*.pdf]\n",
        );
        let rules = applied(&plan, &mut device_kernel(&["/input/report.docx"], &[]));
        let tail = &rules[rules.len() - 4..];
        let all = AccessFs::from_all(REQUIRED_ABI);
        assert_eq!(
            tail,
            [
                // A file input gets the file rights of read + execute.
                (
                    "/input/report.docx".into(),
                    AccessFs::ReadFile | AccessFs::Execute
                ),
                (
                    "/tools".into(),
                    AccessFs::ReadFile | AccessFs::ReadDir | AccessFs::Execute
                ),
                ("/output".into(), all),
                ("/data".into(), all & !AccessFs::Execute),
            ]
        );
        let write = AccessFs::WriteFile | AccessFs::MakeReg | AccessFs::RemoveFile;
        for (path, access) in &rules {
            let writable = access.intersects(write);
            let expected = matches!(path.as_str(), "/output" | "/data" | "/dev/shm")
                || path.starts_with("/dev/");
            assert_eq!(writable, expected, "{path}: {access:?}");
        }
    }

    #[test]
    fn terminal_and_allowlisted_cells_get_the_same_rules_as_the_default() {
        let default = applied(&plan("{}\n"), &mut device_kernel(&[], &[]));
        for yaml in [
            "terminal: true\n",
            "network:\n  mode: allowlist\n  allowed_domains: [api.test]\n",
        ] {
            // The pty is in /dev/pts, the proxies and resolver are reached over lo: neither
            // needs a path of its own.
            assert_eq!(
                applied(&plan(yaml), &mut device_kernel(&[], &[])),
                default,
                "{yaml}"
            );
        }
        let paths: Vec<PathBuf> = default.iter().map(|(p, _)| PathBuf::from(p)).collect();
        assert!(paths.contains(&PathBuf::from("/dev/pts")));
    }

    #[test]
    fn the_plans_rights_are_the_kernels_bits_of_abi_6() {
        let ours = BitFlags::<AccessFs>::from_bits(bits(FsAccess::ALL)).unwrap();
        assert_eq!(ours, AccessFs::from_all(REQUIRED_ABI));
        let on_file: Vec<FsAccess> = FsAccess::ALL.into_iter().filter(|a| a.on_file()).collect();
        assert_eq!(
            BitFlags::<AccessFs>::from_bits(bits(on_file)).unwrap(),
            AccessFs::from_file(REQUIRED_ABI)
        );
        assert_eq!(FsAccess::Execute.bit(), AccessFs::Execute as u64);
        assert_eq!(FsAccess::IoctlDev.bit(), AccessFs::IoctlDev as u64);
    }
}
