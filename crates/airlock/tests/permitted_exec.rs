//! Running code the payload wrote: each test runs the real `airlock` binary (as root, with
//! its own state directory) and has the payload build and run something in a writable
//! path. With `exec` (the default) ordinary agent work must succeed; with `exec: false` it
//! must fail loudly with EACCES; and either way, what contains the payload (nosuid, nodev,
//! no capabilities, seccomp, Landlock's read and write rules, read-only inputs and system
//! tree) must be exactly as strict as before.
mod common;

use common::CellRun;
use std::path::Path;

/// `/tmp` with room for a compiler's temporaries and a virtualenv; executable by default.
const EXEC_TMP: &str = "filesystem:\n  writable_paths:\n    - { path: /tmp, size_mb: 64 }\n";
/// The same path with execution withheld.
const NOEXEC_TMP: &str =
    "filesystem:\n  writable_paths:\n    - { path: /tmp, size_mb: 64, exec: false }\n";

/// `sh -c script` in a cell of `contract` (the default contract when `None`), with a state
/// directory of its own under `dir`.
fn sh_in(dir: &Path, contract: Option<&str>, script: &str) -> CellRun {
    let state = dir.join("state");
    let state = state.to_str().unwrap();
    common::run_in(
        dir,
        contract,
        &["--state-dir", state],
        &["/bin/sh", "-c", script],
    )
}

fn sh(contract: Option<&str>, script: &str) -> CellRun {
    let dir = tempfile::tempdir().unwrap();
    sh_in(dir.path(), contract, script)
}

fn assert_ok(run: &CellRun) {
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.status(), "ok", "{}", run.describe());
}

/// Lines `name: verdict` printed by the probes.
fn verdict<'r>(stdout: &'r str, name: &str) -> Option<&'r str> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
}

/// Asserts each probe in `names` printed `name: blocked...`.
fn assert_blocked(run: &CellRun, names: &[&str]) {
    let stdout = run.stdout();
    for name in names {
        let v = verdict(&stdout, name)
            .unwrap_or_else(|| panic!("probe `{name}` printed nothing\n{}", run.describe()));
        assert!(
            v.starts_with("blocked"),
            "boundary crossed: `{name}` -> `{v}`\n{}",
            run.describe()
        );
    }
}

/// Mount options of `mount_point` in the cell, from a `/proc/self/mountinfo` dump.
fn mount_options(stdout: &str, mount_point: &str) -> Vec<String> {
    stdout
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|fields| fields.len() > 5 && fields[4] == mount_point && fields.contains(&"-"))
        .map(|fields| fields[5].split(',').map(str::to_owned).collect())
        .unwrap_or_default()
}

const HELLO_C: &str = r#"cat > hello.c <<'EOF'
#include <stdio.h>
int main(void) { puts("hello from a compiled program"); return 0; }
EOF"#;

// With exec (the default) ---------------------------------------------------------------

#[test]
fn a_c_program_compiled_in_the_cell_runs_and_make_test_passes() {
    require_cells!();
    let script = format!(
        "set -e\ncd /tmp\n{HELLO_C}\ngcc -o hello hello.c\n./hello\n\
         printf 'test: hello\\n\\t./hello | grep -q compiled && echo make-test-passed\\n' > Makefile\n\
         make -s test\n"
    );
    let run = sh(Some(EXEC_TMP), &script);
    assert_ok(&run);
    assert!(
        run.stdout().contains("hello from a compiled program"),
        "{}",
        run.describe()
    );
    assert!(
        run.stdout().contains("make-test-passed"),
        "{}",
        run.describe()
    );
}

#[test]
fn a_script_the_payload_wrote_runs_under_the_default_contract() {
    require_cells!();
    // No contract at all: the default /tmp is executable.
    let run = sh(
        None,
        "cd /tmp && printf '#!/bin/sh\\necho script-ran\\n' > x.sh && chmod +x x.sh && ./x.sh",
    );
    assert_ok(&run);
    assert_eq!(run.stdout().trim(), "script-ran", "{}", run.describe());
}

#[test]
fn a_virtualenv_and_its_pip_entry_point_run() {
    require_cells!();
    // `bin/python` is a symlink into /usr, which would run even from a noexec path;
    // `bin/pip` is a script in the venv (its shebang is the venv's python), so it needs
    // exec on the writable path.
    let run = sh(
        Some(EXEC_TMP),
        "set -e\npython3 -m venv /tmp/venv\n/tmp/venv/bin/python -c 'import sys; print(\"venv\", sys.prefix)'\n\
         /tmp/venv/bin/pip --version\n",
    );
    assert_ok(&run);
    assert!(
        run.stdout().contains("venv /tmp/venv"),
        "{}",
        run.describe()
    );
    assert!(
        run.stdout().contains("pip ") && run.stdout().contains("/tmp/venv/"),
        "pip ran from the venv\n{}",
        run.describe()
    );
}

const ADD_SO: &str = r#"cat > add.c <<'EOF'
int add(int a, int b) { return a + b; }
EOF
gcc -shared -fPIC -o libadd.so add.c"#;

#[test]
fn a_shared_object_built_in_the_cell_loads_like_a_c_extension() {
    require_cells!();
    // What a binary wheel or a C extension needs: mmap(PROT_EXEC) of a file in the path.
    let script = format!(
        "set -e\ncd /tmp\n{ADD_SO}\n\
         python3 -c 'import ctypes; print(\"add:\", ctypes.CDLL(\"/tmp/libadd.so\").add(2, 3))'\n"
    );
    let run = sh(Some(EXEC_TMP), &script);
    assert_ok(&run);
    assert_eq!(
        verdict(&run.stdout(), "add"),
        Some("5"),
        "{}",
        run.describe()
    );
}

/// A repository in /tmp/repo with a local identity and a pre-commit hook exiting `status`;
/// then `git commit`, and the number of commits afterwards.
fn git_commit_with_hook(status: u8) -> String {
    format!(
        r#"set -e
git init -q /tmp/repo && cd /tmp/repo
git config user.name cell && git config user.email cell@airlock.test
printf '#!/bin/sh\necho pre-commit-hook-ran >&2\nexit {status}\n' > .git/hooks/pre-commit
chmod +x .git/hooks/pre-commit
echo data > file.txt && git add file.txt
if git commit -q -m first; then echo "commit: made"; else echo "commit: refused"; fi
echo "commits: $(git rev-list --all --count)"
"#
    )
}

#[test]
fn a_failing_pre_commit_hook_blocks_the_commit() {
    require_cells!();
    let run = sh(Some(EXEC_TMP), &git_commit_with_hook(1));
    assert_ok(&run);
    let stdout = run.stdout();
    assert_eq!(
        verdict(&stdout, "commit"),
        Some("refused"),
        "{}",
        run.describe()
    );
    assert_eq!(verdict(&stdout, "commits"), Some("0"), "{}", run.describe());
    assert!(
        run.stderr().contains("pre-commit-hook-ran"),
        "{}",
        run.describe()
    );

    // The control: a hook that passes lets the commit through.
    let run = sh(Some(EXEC_TMP), &git_commit_with_hook(0));
    assert_ok(&run);
    assert_eq!(
        verdict(&run.stdout(), "commits"),
        Some("1"),
        "{}",
        run.describe()
    );
}

// With exec: false ------------------------------------------------------------------------

#[test]
fn with_exec_false_written_code_is_refused_with_eacces() {
    require_cells!();
    let script = format!(
        r#"cd /tmp
{HELLO_C}
gcc -o hello hello.c && echo "compiled: yes"
printf '#!/bin/sh\necho script-ran\n' > x.sh && chmod +x x.sh
{ADD_SO}
python3 - <<'EOF'
import ctypes, os, subprocess
def run(name, argv):
    try:
        subprocess.run(argv, check=True)
        print(f"{{name}}: EXECUTED")
    except OSError as e:
        print(f"{{name}}: blocked errno={{e.errno}}")
run("script", ["./x.sh"])
run("binary", ["./hello"])
try:
    ctypes.CDLL("/tmp/libadd.so"); print("mmap-exec: LOADED")
except OSError as e:
    print(f"mmap-exec: blocked {{e}}")
EOF
grep ' /tmp ' /proc/self/mountinfo
"#
    );
    let run = sh(Some(NOEXEC_TMP), &script);
    assert_ok(&run);
    let stdout = run.stdout();
    assert_eq!(
        verdict(&stdout, "compiled"),
        Some("yes"),
        "{}",
        run.describe()
    );
    assert_blocked(&run, &["script", "binary", "mmap-exec"]);
    for name in ["script", "binary"] {
        assert_eq!(
            verdict(&stdout, name),
            Some("blocked errno=13"),
            "EACCES, not a silent skip\n{}",
            run.describe()
        );
    }
    let options = mount_options(&stdout, "/tmp");
    assert!(
        options.iter().any(|o| o == "noexec"),
        "{options:?}\n{}",
        run.describe()
    );
}

#[test]
fn with_exec_false_git_skips_the_hook_and_says_so_on_stderr() {
    require_cells!();
    // git probes hooks with access(X_OK) and treats one it cannot execute as absent: the
    // commit goes through. That is git's choice, not airlock's; what the run must do is
    // not hide it. docs/contract.md says to keep repositories with hooks on an exec path.
    let run = sh(Some(NOEXEC_TMP), &git_commit_with_hook(1));
    assert_ok(&run);
    let stdout = run.stdout();
    assert_eq!(
        verdict(&stdout, "commit"),
        Some("made"),
        "{}",
        run.describe()
    );
    assert!(
        !run.stderr().contains("pre-commit-hook-ran"),
        "{}",
        run.describe()
    );
    assert!(
        run.stderr().contains("hook was ignored"),
        "git says the hook did not run\n{}",
        run.describe()
    );
}

#[test]
fn exec_false_is_not_a_boundary_memfd_still_runs_written_code() {
    require_cells!();
    // Why exec is the default: a payload that wants to run a binary it wrote does not need
    // the mount's permission. This is existing behaviour, shown so the docs' claim is
    // checked, not a hole this change opens.
    let script = format!(
        r#"cd /tmp
{HELLO_C}
gcc -o hello hello.c
python3 - <<'EOF'
import os
fd = os.memfd_create("hello")
os.write(fd, open("/tmp/hello", "rb").read())
os.execv(f"/proc/self/fd/{{fd}}", ["hello"])
EOF
"#
    );
    let run = sh(Some(NOEXEC_TMP), &script);
    assert_ok(&run);
    assert!(
        run.stdout().contains("hello from a compiled program"),
        "{}",
        run.describe()
    );
}

// Denied paths: what contains the payload is unchanged ------------------------------------

/// A C probe: each line is `name: blocked errno=N` or `name: ALLOWED`.
const PROBE_C: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static void verdict(const char *name, long ret) {
    if (ret < 0) printf("%s: blocked errno=%d\n", name, errno);
    else printf("%s: ALLOWED ret=%ld\n", name, ret);
}

static long open_for(const char *path, int flags) {
    int fd = open(path, flags | O_CLOEXEC, 0644);
    if (fd >= 0) close(fd);
    return fd;
}

int main(int argc, char **argv) {
    /* Unbuffered: a successful exec at the end must not swallow the lines before it. */
    setvbuf(stdout, NULL, _IONBF, 0);
    printf("ids: uid=%d euid=%d gid=%d egid=%d\n", getuid(), geteuid(), getgid(), getegid());
    verdict("setuid-root", setuid(0));
    verdict("setgid-root", setgid(0));
    verdict("read-host-shadow", open_for("/etc/shadow", O_RDONLY));
    verdict("read-shadow-via-proc-root", open_for("/proc/1/root/etc/shadow", O_RDONLY));
    verdict("finit-module", syscall(SYS_finit_module, 0, "", 0));
    verdict("init-module", syscall(SYS_init_module, argv[0], 16, ""));
    verdict("mount-tmpfs", mount("none", "/tmp", "tmpfs", 0, NULL));
    verdict("remount-exec-path-suid", mount(NULL, "/tmp", NULL, MS_REMOUNT | MS_BIND, NULL));
    verdict("unshare-user", unshare(CLONE_NEWUSER));
    verdict("unshare-net", unshare(CLONE_NEWNET));
    verdict("mknod-null", mknod("/tmp/null", S_IFCHR | 0666, makedev(1, 3)));
    verdict("write-system-tree", open_for("/usr/bin/airlock-probe", O_WRONLY | O_CREAT));
    verdict("write-into-etc", open_for("/etc/passwd", O_WRONLY | O_APPEND));
    verdict("write-cell-root", open_for("/probe", O_WRONLY | O_CREAT));
    verdict("write-input", open_for("/in/data.txt", O_WRONLY | O_APPEND));
    verdict("create-in-input", open_for("/in/new.txt", O_WRONLY | O_CREAT));
    verdict("exec-in-noexec-path", execl("/data/x.sh", "x.sh", (char *)NULL));
    return 0;
}
"#;

#[test]
fn code_run_from_an_exec_path_gains_no_privilege_and_crosses_no_rule() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("data.txt");
    std::fs::write(&input, "input data\n").unwrap();
    // /tmp executable (the default), /data for data only.
    let contract = format!(
        "filesystem:\n  readonly_inputs:\n    - {{ source: {}, target: /in/data.txt }}\n  \
         writable_paths:\n    - {{ path: /tmp, size_mb: 64 }}\n    - {{ path: /data, exec: false }}\n",
        input.display()
    );
    let script = format!(
        r#"set -e
cd /tmp
cat > probe.c <<'EOF'
{PROBE_C}
EOF
gcc -o probe probe.c
printf '#!/bin/sh\necho data-script-ran\n' > /data/x.sh && chmod +x /data/x.sh
# A set-user-id file: on a nosuid mount the bit is inert. (No one in the cell can create a
# root-owned file, so `cp /usr/bin/su .` loses the bit anyway; the mount flag is what holds.)
chmod u+s,g+s probe
cp /usr/bin/su /tmp/su && chmod u+s /tmp/su
echo "modes: $(stat -c '%A %u' probe) $(stat -c '%A %u' su)"
./probe
grep -E ' /tmp | /data ' /proc/self/mountinfo
grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status | sed 's/:\s*/: /'
./su -c 'echo SU-WORKED' root </dev/null || echo "su: blocked exit=$?"
"#
    );
    let run = sh_in(dir.path(), Some(&contract), &script);
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    let stdout = run.stdout();
    assert_eq!(
        verdict(&stdout, "ids"),
        Some("uid=10001 euid=10001 gid=10001 egid=10001"),
        "a set-id bit on the exec path must not change the ids\n{d}"
    );
    assert!(
        verdict(&stdout, "modes").is_some_and(|m| m.starts_with("-rwsr-s")),
        "the probe really carries the set-id bits\n{d}"
    );
    assert_blocked(
        &run,
        &[
            "setuid-root",
            "setgid-root",
            "read-host-shadow",
            "read-shadow-via-proc-root",
            "finit-module",
            "init-module",
            "mount-tmpfs",
            "remount-exec-path-suid",
            "unshare-user",
            "unshare-net",
            "mknod-null",
            "write-system-tree",
            "write-into-etc",
            "write-cell-root",
            "write-input",
            "create-in-input",
            "exec-in-noexec-path",
            "su",
        ],
    );
    assert!(!stdout.contains("SU-WORKED"), "{d}");
    assert!(!stdout.contains("data-script-ran"), "{d}");
    assert_eq!(
        verdict(&stdout, "exec-in-noexec-path"),
        Some("blocked errno=13"),
        "{d}"
    );
    for (mount_point, noexec) in [("/tmp", false), ("/data", true)] {
        let options = mount_options(&stdout, mount_point);
        let has = |o: &str| options.iter().any(|x| x == o);
        assert!(
            has("nosuid") && has("nodev") && has("rw"),
            "{mount_point}: {options:?}\n{d}"
        );
        assert_eq!(has("noexec"), noexec, "{mount_point}: {options:?}\n{d}");
    }
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(
            verdict(&stdout, cap).map(str::trim),
            Some("0000000000000000"),
            "{cap}\n{d}"
        );
    }
    assert_eq!(
        verdict(&stdout, "NoNewPrivs").map(str::trim),
        Some("1"),
        "{d}"
    );
    assert_eq!(verdict(&stdout, "Seccomp").map(str::trim), Some("2"), "{d}");
    // The input on the host is untouched.
    assert_eq!(std::fs::read_to_string(&input).unwrap(), "input data\n");
}
