//! Everyday agent work, run through the real binary under a sensible contract: each task
//! asserts its real outcome (the program's output, the test verdict, the file it made),
//! not only an exit code. Each also runs under bubblewrap with a typical agent profile
//! (`bwrap --unshare-all` with the host's /usr and /etc read-only, tmpfs /tmp and /work,
//! the inputs read-only), unless it is marked airlock-only with the reason.

mod common;

use common::upstream::Upstream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The contract every task runs under, plus its own `extra` lines: the task's files as a
/// read-only input at /src, a writable (and executable) /work and /tmp.
const BASE: &str = "\
filesystem:
  readonly_inputs:
    - source: src
      target: /src
  writable_paths:
    - path: work/
      size_mb: 1024
    - path: tmp/
      size_mb: 512
workdir: /work
resources:
  memory_mb: 2048
  process_limit: 256
  wall_time_seconds: 180
  output_bytes: 4194304
  open_files: 4096
  file_size_mb: 1024
";

/// Writes `greet-1.0-py3-none-any.whl` (a pure-Python wheel) into the directory given.
const MKWHEEL: &str = r#"
import base64, hashlib, sys, zipfile
files = {
    "greet/__init__.py": "def hi():\n    return 'hi from a wheel'\n",
    "greet-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: greet\nVersion: 1.0\n",
    "greet-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
def digest(text):
    raw = hashlib.sha256(text.encode()).digest()
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
record = "".join(f"{n},{digest(t)},{len(t.encode())}\n" for n, t in files.items())
record += "greet-1.0.dist-info/RECORD,,\n"
with zipfile.ZipFile(f"{sys.argv[1]}/greet-1.0-py3-none-any.whl", "w") as whl:
    for name, text in files.items():
        whl.writestr(name, text)
    whl.writestr("greet-1.0.dist-info/RECORD", record)
"#;

/// Whether the task also runs under bubblewrap.
enum Bwrap {
    Same,
    /// Not comparable under bubblewrap, and why.
    AirlockOnly(&'static str),
}

struct Task {
    name: &'static str,
    /// Host-side files of /src: (relative path, content).
    files: &'static [(&'static str, &'static str)],
    /// Lines appended to the contract (top-level keys other than `filesystem`/`resources`).
    extra: &'static str,
    script: &'static str,
    /// Every one must appear in stdout.
    expect: &'static [&'static str],
    bwrap: Bwrap,
}

fn write_files(src: &Path, files: &[(&str, &str)]) {
    std::fs::create_dir_all(src).unwrap();
    for (name, content) in files {
        let path = src.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, content).unwrap();
    }
}

fn run_airlock(dir: &Path, task: &Task) -> (i32, String, String) {
    let contract = format!("{BASE}{}", task.extra);
    let state = dir.join("state").display().to_string();
    let run = common::run_in(
        dir,
        Some(&contract),
        &["--state-dir", &state],
        &["/bin/sh", "-c", task.script],
    );
    (run.code(), run.stdout(), run.describe())
}

/// The typical agent profile of bubblewrap this suite compares with.
fn run_bwrap(dir: &Path, task: &Task) -> (i32, String, String) {
    let src = dir.join("src");
    let out = Command::new("bwrap")
        .args(["--unshare-all", "--die-with-parent", "--new-session"])
        .args(["--uid", "10001", "--gid", "10001"])
        .args(["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"])
        .args([
            "--symlink",
            "usr/bin",
            "/bin",
            "--symlink",
            "usr/lib",
            "/lib",
        ])
        .args([
            "--symlink",
            "usr/lib64",
            "/lib64",
            "--symlink",
            "usr/sbin",
            "/sbin",
        ])
        .args([
            "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/work",
        ])
        .arg("--ro-bind")
        .arg(&src)
        .arg("/src")
        .args([
            "--chdir", "/work", "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp",
        ])
        .args(["--", "/bin/sh", "-c", task.script])
        .stdin(Stdio::null())
        .output()
        .expect("bwrap (apt-get install bubblewrap; .ci/run installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let describe = format!(
        "bwrap exit {:?}\nstdout: {stdout}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), stdout, describe)
}

fn check(
    runner: &str,
    task: &Task,
    (code, stdout, describe): (i32, String, String),
) -> Option<String> {
    let missing: Vec<&&str> = task
        .expect
        .iter()
        .filter(|e| !stdout.contains(**e))
        .collect();
    (code != 0 || !missing.is_empty()).then(|| {
        format!(
            "{} under {runner}: exit {code}, missing {missing:?}\n{describe}",
            task.name
        )
    })
}

fn run_tasks(tasks: &[Task]) {
    if !common::cells_available() {
        return;
    }
    let mut failures = Vec::new();
    for task in tasks {
        let dir = tempfile::tempdir().unwrap();
        write_files(&dir.path().join("src"), task.files);
        prepare_fixtures(&dir.path().join("src"), task.name);
        failures.extend(check("airlock", task, run_airlock(dir.path(), task)));
        match task.bwrap {
            Bwrap::Same => failures.extend(check("bwrap", task, run_bwrap(dir.path(), task))),
            Bwrap::AirlockOnly(reason) => println!("{}: airlock-only: {reason}", task.name),
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

/// Inputs that are generated rather than written out: a large file, a git repository.
fn prepare_fixtures(src: &Path, task: &str) {
    match task {
        "large read-only input" => {
            let mut data = vec![0u8; 200 << 20];
            for (i, byte) in data.iter_mut().enumerate() {
                *byte = (i * 7 + i / 4096) as u8;
            }
            std::fs::write(src.join("large.bin"), &data).unwrap();
            let digest = Command::new("sha256sum")
                .arg(src.join("large.bin"))
                .output()
                .unwrap();
            let hex = String::from_utf8_lossy(&digest.stdout)[..64].to_string();
            std::fs::write(src.join("expected.sha256"), hex).unwrap();
        }
        "git clone of a read-only input" => {
            let repo = src.join("repo");
            let git = |args: &[&str]| {
                let ok = Command::new("git")
                    .arg("-C")
                    .arg(&repo)
                    .args(["-c", "user.name=t", "-c", "user.email=t@example.test"])
                    .args(args)
                    .stdout(Stdio::null())
                    .status()
                    .unwrap()
                    .success();
                assert!(ok, "git {args:?}");
            };
            std::fs::create_dir_all(&repo).unwrap();
            git(&["init", "-q", "-b", "main"]);
            std::fs::write(repo.join("README"), "from the host repo\n").unwrap();
            git(&["add", "README"]);
            git(&["commit", "-q", "-m", "first"]);
        }
        _ => {}
    }
}

fn rust_sysroot() -> PathBuf {
    let out = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .unwrap();
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

#[test]
fn building_and_running_code() {
    run_tasks(&[
        Task {
            name: "C compile and run",
            files: &[("hello.c", "#include <stdio.h>\nint main(void){puts(\"hello from c\");return 0;}\n")],
            extra: "",
            script: "cp /src/hello.c . && gcc -O1 -o hello hello.c && ./hello",
            expect: &["hello from c"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "C++ compile and run",
            files: &[("v.cpp", "#include <iostream>\n#include <vector>\nint main(){std::vector<int> v{1,2,3};int s=0;for(int x:v)s+=x;std::cout<<\"sum \"<<s<<std::endl;}\n")],
            extra: "",
            script: "g++ -o v /src/v.cpp && ./v",
            expect: &["sum 6"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "make test",
            files: &[
                ("Makefile", "test: calc\n\t./calc 2 3 | grep -q '^5$$' && echo 'make test: PASS'\ncalc: calc.c\n\tcc -o calc calc.c\n"),
                ("calc.c", "#include <stdio.h>\n#include <stdlib.h>\nint main(int c,char**v){printf(\"%d\\n\",atoi(v[1])+atoi(v[2]));}\n"),
            ],
            extra: "",
            script: "cp /src/Makefile /src/calc.c . && make -s test",
            expect: &["make test: PASS"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "a script the agent wrote",
            files: &[],
            extra: "",
            script: "printf '#!/bin/sh\\necho script ran with $1\\n' > x.sh && chmod +x x.sh && ./x.sh arg",
            expect: &["script ran with arg"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "a shared object loaded like a C extension",
            files: &[("ext.c", "int triple(int x){return 3*x;}\n")],
            extra: "",
            script: "gcc -shared -fPIC -o libext.so /src/ext.c && python3 -c 'import ctypes; print(\"triple\", ctypes.CDLL(\"./libext.so\").triple(14))'",
            expect: &["triple 42"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "JVM compile and run",
            files: &[("Hello.java", "public class Hello { public static void main(String[] a) { System.out.println(\"hello from the jvm \" + (1 + 2)); } }\n")],
            extra: "",
            script: "javac -d . /src/Hello.java && java -Xmx256m -cp . Hello",
            expect: &["hello from the jvm 3"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "node script",
            files: &[("a.js", "const s = [3,1,2].sort().join(','); console.log('node sorted', s);\n")],
            extra: "",
            script: "node /src/a.js",
            expect: &["node sorted 1,2,3"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "npm package with a .bin script",
            files: &[
                ("pkg/package.json", "{\"name\":\"hello-bin\",\"version\":\"1.0.0\",\"bin\":{\"hello-bin\":\"cli.js\"}}\n"),
                ("pkg/cli.js", "#!/usr/bin/env node\nconsole.log('hello from a bin script');\n"),
            ],
            extra: "",
            script: "cp -r /src/pkg . && (cd pkg && npm pack -q >/dev/null) && mkdir proj && cd proj && echo '{\"name\":\"proj\",\"version\":\"1.0.0\"}' > package.json && npm install -q --offline --no-audit --no-fund ../pkg/hello-bin-1.0.0.tgz >/dev/null 2>&1 && ./node_modules/.bin/hello-bin && npx --offline hello-bin",
            expect: &["hello from a bin script"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "perl script",
            files: &[("w.pl", "my %c; $c{$_}++ for split /\\s+/, 'a b a c a'; print \"perl a=$c{a}\\n\";\n")],
            extra: "",
            script: "perl /src/w.pl",
            expect: &["perl a=3"],
            bwrap: Bwrap::Same,
        },
    ]);
}

#[test]
fn python_work() {
    run_tasks(&[
        Task {
            name: "a virtualenv with a package installed from a local wheel",
            files: &[("mkwheel.py", MKWHEEL)],
            extra: "",
            script: "python3 -m venv v && python3 /src/mkwheel.py . && v/bin/pip install -q --no-index ./greet-1.0-py3-none-any.whl && v/bin/python -c 'import greet; print(greet.hi())'",
            expect: &["hi from a wheel"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "unittest suite",
            files: &[("test_math.py", "import unittest\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(1 + 1, 2)\n    def test_str(self):\n        self.assertIn('a', 'cat')\n")],
            extra: "",
            script: "cp /src/test_math.py . && python3 -m unittest -v test_math 2>&1 | tail -3",
            expect: &["Ran 2 tests", "OK"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "SQLite from python and the CLI",
            files: &[],
            extra: "",
            script: "python3 -c \"import sqlite3; c=sqlite3.connect('d.db'); c.execute('create table t(x)'); c.executemany('insert into t values (?)', [(i,) for i in range(100)]); c.commit()\" && sqlite3 d.db 'select \"rows\", count(*), sum(x) from t'",
            expect: &["rows|100|4950"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "multiprocessing pool",
            files: &[],
            extra: "",
            script: "python3 -c 'import multiprocessing as m\nwith m.Pool(4) as p: print(\"pool\", sum(p.map(abs, range(-50, 50))))'",
            expect: &["pool 2500"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "a 32 MiB shared memory segment",
            files: &[],
            extra: "",
            script: "python3 -c 'from multiprocessing import shared_memory as s\nm = s.SharedMemory(create=True, size=32 << 20)\nm.buf[:] = bytes(len(m.buf))\nprint(\"shm filled\", len(m.buf) >> 20, \"MiB\")\nm.close(); m.unlink()'",
            expect: &["shm filled 32 MiB"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "threads",
            files: &[],
            extra: "",
            script: "python3 -c 'from concurrent.futures import ThreadPoolExecutor as T\nwith T(32) as t: print(\"threads\", sum(t.map(lambda x: x * x, range(100))))'",
            expect: &["threads 328350"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "JSON processing",
            files: &[("data.json", "[{\"name\":\"a\",\"n\":3},{\"name\":\"b\",\"n\":4}]\n")],
            extra: "",
            script: "python3 -c 'import json; d=json.load(open(\"/src/data.json\")); print(\"total\", sum(x[\"n\"] for x in d))'",
            expect: &["total 7"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "a local TCP server and client",
            files: &[],
            extra: "",
            script: "echo served-content > index.html && (python3 -m http.server 18765 --bind 127.0.0.1 >/dev/null 2>&1 &) && for i in $(seq 50); do python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:18765/index.html\").read().decode())' 2>/dev/null && break; sleep 0.1; done",
            expect: &["served-content"],
            bwrap: Bwrap::Same,
        },
    ]);
}

#[test]
fn files_text_and_data() {
    run_tasks(&[
        Task {
            name: "tar and gzip round trip",
            files: &[("docs/a.txt", "alpha\n"), ("docs/b.txt", "beta\n")],
            extra: "",
            script: "tar czf d.tgz -C /src docs && mkdir x && tar xzf d.tgz -C x && cat x/docs/a.txt x/docs/b.txt",
            expect: &["alpha", "beta"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "zip and unzip",
            files: &[("z/one.txt", "zipped one\n")],
            extra: "",
            script: "cd /src && zip -qr /work/z.zip z && cd /work && unzip -q z.zip -d out && cat out/z/one.txt",
            expect: &["zipped one"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "xz compression",
            files: &[],
            extra: "",
            script: "seq 100000 > n && xz -k n && xz -dc n.xz | tail -1",
            expect: &["100000"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "text pipeline",
            files: &[("log.txt", "GET /a 200\nGET /b 404\nPOST /a 200\nGET /a 500\n")],
            extra: "",
            script: "grep -v ' 404' /src/log.txt | awk '{print $2}' | sort | uniq -c | sed 's/^ *//' | sort -rn | head -1",
            expect: &["3 /a"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "find and xargs",
            files: &[("t/a.md", "x"), ("t/b/c.md", "y"), ("t/d.txt", "z")],
            extra: "",
            script: "find /src/t -name '*.md' -print0 | xargs -0 wc -c | tail -1",
            expect: &["2 total"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "sort a large file through TMPDIR",
            files: &[],
            extra: "",
            script: "seq 2000000 | sort -rn -S 4M -T /tmp > s && head -1 s && wc -l < s",
            expect: &["2000000\n2000000"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "diff and patch",
            files: &[("a.txt", "one\ntwo\n")],
            extra: "",
            script: "cp /src/a.txt . && printf 'one\\nTWO\\n' > b.txt; diff -u a.txt b.txt > p.diff; patch -s a.txt p.diff && cat a.txt",
            expect: &["TWO"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "large read-only input",
            files: &[],
            extra: "",
            script: "test \"$(sha256sum /src/large.bin | cut -c1-64)\" = \"$(cat /src/expected.sha256)\" && echo large input intact",
            expect: &["large input intact"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "streaming output",
            files: &[],
            extra: "",
            script: "for i in $(seq 1 2000); do echo line $i; done | tail -1",
            expect: &["line 2000"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "writing through /dev/stdout and /dev/stderr",
            files: &[],
            extra: "",
            script: "echo via-dev-stdout > /dev/stdout && echo via-dev-stderr > /dev/stderr",
            expect: &["via-dev-stdout"],
            bwrap: Bwrap::Same,
        },
    ]);
}

#[test]
fn version_control() {
    run_tasks(&[
        Task {
            name: "git commit blocked by a pre-commit hook",
            files: &[],
            extra: "",
            script: "git init -q -b main r && cd r && git config user.name a && git config user.email a@example.test && printf '#!/bin/sh\\necho hook: no TODOs allowed >&2\\n! grep -q TODO *.txt\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit && echo TODO > f.txt && git add f.txt && (git commit -q -m blocked 2>/dev/null && echo COMMITTED || echo 'hook blocked the commit') && echo done > f.txt && git add f.txt && git commit -q -m ok && git log --oneline | wc -l | sed 's/^/commits: /'",
            expect: &["hook blocked the commit", "commits: 1"],
            bwrap: Bwrap::Same,
        },
        Task {
            name: "git clone of a read-only input",
            files: &[],
            extra: "",
            script: "git clone -q /src/repo r && cat r/README && git -C /src/repo log --format=%s",
            expect: &["from the host repo", "first"],
            bwrap: Bwrap::AirlockOnly("bubblewrap maps no host owner to the sandbox user, so git refuses the input as of dubious ownership"),
        },
    ]);
}

/// The Rust toolchain is large (over a GiB): a read-only input the start must not read.
#[test]
fn a_rust_toolchain_as_a_read_only_input() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    write_files(
        &src,
        &[
            (
                "crate/Cargo.toml",
                "[package]\nname = \"cellcrate\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
            ),
            (
                "crate/build.rs",
                "fn main() { println!(\"cargo:rustc-env=BUILT_BY=build.rs\"); }\n",
            ),
            (
                "crate/src/main.rs",
                "fn main() { println!(\"cargo run: built by {}\", env!(\"BUILT_BY\")); }\n",
            ),
        ],
    );
    let contract = format!(
        "{}\n",
        BASE.replace(
            "    - source: src\n      target: /src\n",
            &format!(
                "    - source: src\n      target: /src\n    - source: {}\n      target: /rust\n",
                rust_sysroot().display()
            ),
        )
    );
    let state = dir.path().join("state").display().to_string();
    let run = common::run_in(
        dir.path(),
        Some(&contract),
        &["--state-dir", &state],
        &[
            "/bin/sh",
            "-c",
            "cp -r /src/crate . && cd crate && CARGO_HOME=/tmp/cargo-home PATH=/rust/bin:$PATH cargo run -q --offline",
        ],
    );
    let d = run.describe();
    assert!(run.stdout().contains("cargo run: built by build.rs"), "{d}");
    let startup = run.result["timings"]["startup_ms"]
        .as_f64()
        .unwrap_or(f64::MAX);
    assert!(
        startup < 1000.0,
        "a large input must not be read before the start: {startup} ms\n{d}"
    );
}

/// Runs `script` in a cell whose allowlist holds `name:port`, resolved by the operator
/// config to `address` (exempted from the private-address rule, as a test upstream must be).
fn run_with_upstream(
    dir: &Path,
    name: &str,
    address: &str,
    port: u16,
    extra: &str,
    script: &str,
) -> common::CellRun {
    let config = dir.join("airlock.toml");
    std::fs::write(
        &config,
        format!(
            "[egress]\nresolve = {{ {name:?} = {address:?} }}\nexempt_cidrs = [\"{address}/32\"]\n"
        ),
    )
    .unwrap();
    let contract = format!(
        "{BASE}network:\n  mode: allowlist\n  allowed_domains: [\"{name}:{port}\"]\n{extra}"
    );
    let state = dir.join("state").display().to_string();
    let config = config.display().to_string();
    common::run_in(
        dir,
        Some(&contract),
        &["--state-dir", &state, "--config", &config],
        &["/bin/sh", "-c", script],
    )
}

/// airlock-only: bubblewrap has no egress allowlist, only all network or none.
#[test]
fn pip_installs_from_a_local_index_through_the_proxy() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let index = dir.path().join("index");
    let package = index.join("simple/greet");
    std::fs::create_dir_all(&package).unwrap();
    std::fs::create_dir_all(dir.path().join("src")).unwrap();
    let built = Command::new("python3")
        .args(["-c", MKWHEEL])
        .arg(&package)
        .status()
        .unwrap();
    assert!(built.success());
    std::fs::write(
        package.join("index.html"),
        "<html><body><a href=\"greet-1.0-py3-none-any.whl\">greet-1.0-py3-none-any.whl</a></body></html>\n",
    )
    .unwrap();
    let upstream = Upstream::start(dir.path(), &index, "127.0.0.3", None);
    let script = format!(
        "python3 -m venv v && v/bin/pip install -q --trusted-host pypi.test --index-url http://pypi.test:{}/simple greet \
         && v/bin/python -c 'import greet; print(greet.hi())'",
        upstream.port
    );
    let run = run_with_upstream(
        dir.path(),
        "pypi.test",
        "127.0.0.3",
        upstream.port,
        "",
        &script,
    );
    let d = run.describe();
    assert!(run.stdout().contains("hi from a wheel"), "{d}");
    let egress = run.result["egress"].to_string();
    assert!(
        egress.contains("pypi.test") && egress.contains("allowed"),
        "{d}"
    );
}

/// airlock-only: the transparent path (an in-cell resolver and listeners) has no
/// bubblewrap counterpart.
#[test]
fn proxy_unaware_clients_reach_an_allowlisted_name() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(dir.path().join("src")).unwrap();
    std::fs::write(
        root.join("hello.txt"),
        "hello through the transparent path\n",
    )
    .unwrap();
    let upstream = Upstream::start(dir.path(), &root, "127.0.0.4", None);
    // Node's built-in fetch ignores HTTP(S)_PROXY; so does python with no proxy handler.
    let script = format!(
        "unset HTTP_PROXY http_proxy HTTPS_PROXY https_proxy ALL_PROXY all_proxy; \
         node -e 'fetch(\"http://api.test:{port}/hello.txt\").then(r => r.text()).then(t => console.log(\"node:\", t.trim()))' && \
         python3 -c 'import urllib.request as u; o = u.build_opener(u.ProxyHandler({{}})); print(\"python:\", o.open(\"http://api.test:{port}/hello.txt\").read().decode().strip())'",
        port = upstream.port
    );
    let run = run_with_upstream(
        dir.path(),
        "api.test",
        "127.0.0.4",
        upstream.port,
        "",
        &script,
    );
    let d = run.describe();
    assert!(
        run.stdout()
            .contains("node: hello through the transparent path"),
        "{d}"
    );
    assert!(
        run.stdout()
            .contains("python: hello through the transparent path"),
        "{d}"
    );
    assert!(
        run.result["egress"].to_string().contains("transparent"),
        "{d}"
    );
}

/// airlock-only: bubblewrap passes its caller's terminal through or none; it has no pty
/// of its own to give a tool driven by a program.
#[test]
fn a_pty_driven_tool_runs_on_the_cells_terminal() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("src")).unwrap();
    let contract = format!("{BASE}terminal: true\n");
    let state = dir.path().join("state").display().to_string();
    let run = common::run_in(
        dir.path(),
        Some(&contract),
        &["--state-dir", &state],
        &[
            "python3",
            "-c",
            "import os, sys; print('isatty', os.isatty(0), os.isatty(1), os.ttyname(1))",
        ],
    );
    let d = run.describe();
    assert!(run.stdout().contains("isatty True True /dev/pts/0"), "{d}");
}
