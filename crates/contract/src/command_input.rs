//! What a sender asks a cell to exec (argv, environment, working directory): one pure
//! decision that every door calls before any cell exists — the service's runs, sessions
//! and session commands, `airlock run`, `airlock tool call` and MCP tool calls — and the
//! engine calls once more as the last door, so no path reaches a cell unchecked.
//!
//! The rules, in the order they are checked (the first one broken is the answer):
//!
//! 1. Every environment key is a portable name, `[A-Za-z_][A-Za-z0-9_]*` (so non-empty,
//!    no `=`, no NUL). `execve` takes `NAME=value` strings: a key holding `=` is split by
//!    the payload's libc at the first `=`, so `HTTP_PROXY=x#` with value `v` arrives as
//!    `HTTP_PROXY` = `x#=v`, past any check of the key as sent. The strict charset is the
//!    contract's own rule for `env` (one rule, whoever sets the variable), the one POSIX
//!    shells can reference, and the only one every tool reads.
//! 2. Reserved names ([`RESERVED_ENV_NAMES`], in either case), checked on the key that
//!    passed rule 1.
//! 3. No NUL in an argument, an environment value or the working directory: the kernel
//!    ends each string at its first NUL, so the payload would run something other than
//!    what the record says (or lose the variable while the record keeps it).
//! 4. Sizes the kernel and airlock's control protocol always carry: each argument and
//!    each `NAME=value` entry at most [`MAX_ARG_STRLEN`]` - 1` bytes (the kernel's
//!    per-string limit counts the NUL), and argv with the whole environment of the
//!    payload at most [`MAX_COMMAND_BYTES`], counted as `execve` counts them.

use crate::validate::RESERVED_ENV_NAMES;

/// The kernel's limit on one `execve` string, its terminating NUL included
/// (`MAX_ARG_STRLEN`, 32 pages).
pub const MAX_ARG_STRLEN: usize = 32 * 4096;

/// The most argv and environment (the payload's whole environment: the plan's, the
/// credentials', the sender's) one command may take, counted as `execve` counts them:
/// each string's bytes, its NUL and its pointer. The kernel's own limit is a quarter of
/// the payload's stack rlimit (2 MiB under the usual 8 MiB, never below 128 KiB);
/// 256 KiB stays within it for any stack rlimit of 1 MiB or more, and airlock's control
/// sockets are sized to carry it even with every byte escaped (see
/// `airlock_cell::control::COMMAND_SEND_BUFFER`).
pub const MAX_COMMAND_BYTES: usize = 256 * 1024;

/// The bytes of one pointer of `execve`'s argv or envp array.
const POINTER_BYTES: usize = std::mem::size_of::<usize>();

/// One command as a sender asked for it, and the environment it will run with.
#[derive(Debug, Clone, Copy, Default)]
pub struct CommandInput<'a> {
    pub argv: &'a [String],
    /// The sender's environment additions: their names and values are checked.
    pub env: &'a [(&'a str, &'a str)],
    /// The rest of the payload's environment (the plan's variables, the credentials'),
    /// already checked where it was set: counted in the size only.
    pub base_env: &'a [(&'a str, &'a str)],
    /// The command's working directory, if the sender names one.
    pub cwd: Option<&'a str>,
}

/// Why a command may not be sent to a cell. Each names the field and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandInputError {
    #[error("env key {}: {rule}", quoted(.key))]
    EnvKeyInvalid { key: String, rule: &'static str },
    #[error("env.{key}: is reserved: airlock sets the proxy variables itself")]
    EnvKeyReserved { key: String },
    #[error("{field}: must not contain NUL (byte {offset})")]
    NulByte { field: String, offset: usize },
    #[error(
        "{field}: {bytes} bytes, over the kernel's limit of {} bytes for one argument or \
         environment entry",
        MAX_ARG_STRLEN - 1
    )]
    ArgTooLarge { field: String, bytes: usize },
    #[error(
        "argv and env: {bytes} bytes as execve counts them (each string, its NUL and its \
         pointer), over the {MAX_COMMAND_BYTES} one command may take"
    )]
    CommandTooLarge { bytes: usize },
}

impl CommandInputError {
    /// The stable reason code of the refusal (the service's `ErrorBody.reason`).
    pub fn reason(&self) -> &'static str {
        match self {
            CommandInputError::EnvKeyInvalid { .. } => "request.env_key_invalid",
            CommandInputError::EnvKeyReserved { .. } => "request.env_reserved",
            CommandInputError::NulByte { .. } => "request.nul_byte",
            CommandInputError::ArgTooLarge { .. } => "request.arg_too_large",
            CommandInputError::CommandTooLarge { .. } => "request.argv_too_large",
        }
    }

    /// The field the refusal names (`argv[3]`, `env.FOO`, `env key "A=B"`, `cwd`,
    /// `argv and env`).
    pub fn field(&self) -> String {
        match self {
            CommandInputError::EnvKeyInvalid { key, .. } => format!("env key {}", quoted(key)),
            CommandInputError::EnvKeyReserved { key } => format!("env.{key}"),
            CommandInputError::NulByte { field, .. }
            | CommandInputError::ArgTooLarge { field, .. } => field.clone(),
            CommandInputError::CommandTooLarge { .. } => "argv and env".to_string(),
        }
    }
}

/// `key` in double quotes, with NUL and other control characters escaped so that the
/// message shows what was sent.
fn quoted(key: &str) -> String {
    format!("\"{}\"", key.escape_debug())
}

/// A plan's environment as the `(name, value)` pairs a [`CommandInput`] takes.
pub fn plan_env(plan: &crate::CellPlan) -> Vec<(&str, &str)> {
    plan.env
        .iter()
        .map(|var| (var.name.as_str(), var.value.as_str()))
        .collect()
}

/// Whether `input` may be sent to a cell: `Ok`, or the first rule it breaks. The doors'
/// check: the sender's keys are held to every rule, then [`check_exec`].
pub fn check_command(input: &CommandInput<'_>) -> Result<(), CommandInputError> {
    for (key, _) in input.env {
        check_env_key(key)?;
    }
    check_exec(input)
}

/// What must hold of any command a cell execs, whoever composed its environment: the
/// engine's check of a plan (whose environment also holds airlock's own proxy variables
/// and an image's, so no reserved-name or charset rule): no key that `execve` would
/// split or cut (empty, `=`, NUL), no NUL in a string, the sizes of rule 4. What it
/// passes runs exactly as recorded.
pub fn check_exec(input: &CommandInput<'_>) -> Result<(), CommandInputError> {
    for (key, _) in input.env.iter().chain(input.base_env) {
        if let Some(rule) = exec_key_rule(key) {
            return Err(CommandInputError::EnvKeyInvalid {
                key: key.to_string(),
                rule,
            });
        }
    }
    for (index, argument) in input.argv.iter().enumerate() {
        check_string(&format!("argv[{index}]"), argument, argument.len())?;
    }
    for (key, value) in input.env.iter().chain(input.base_env) {
        check_string(&format!("env.{key}"), value, env_entry_bytes(key, value))?;
    }
    if let Some(cwd) = input.cwd {
        check_string("cwd", cwd, cwd.len())?;
    }
    let bytes = exec_bytes(input);
    if bytes > MAX_COMMAND_BYTES {
        return Err(CommandInputError::CommandTooLarge { bytes });
    }
    Ok(())
}

/// Rules 1 and 2 for one environment key.
pub fn check_env_key(key: &str) -> Result<(), CommandInputError> {
    if let Some(rule) = env_key_rule(key) {
        return Err(CommandInputError::EnvKeyInvalid {
            key: key.to_string(),
            rule,
        });
    }
    if RESERVED_ENV_NAMES
        .iter()
        .any(|reserved| reserved.eq_ignore_ascii_case(key))
    {
        return Err(CommandInputError::EnvKeyReserved {
            key: key.to_string(),
        });
    }
    Ok(())
}

/// The rule a sender's key breaks, the most specific first.
fn env_key_rule(key: &str) -> Option<&'static str> {
    exec_key_rule(key).or_else(|| {
        (!crate::validate::is_env_name(key)).then_some("must match [A-Za-z_][A-Za-z0-9_]*")
    })
}

/// The rule a key breaks that would make the payload's variable differ from the
/// record's.
fn exec_key_rule(key: &str) -> Option<&'static str> {
    if key.is_empty() {
        Some("must not be empty")
    } else if key.contains('\0') {
        Some("must not contain NUL")
    } else if key.contains('=') {
        Some("must not contain `=` (execve would split the variable there)")
    } else {
        None
    }
}

/// Rule 3 and the per-string half of rule 4 for one string (`exec_len` is its length as
/// the kernel sees it: an environment value's whole `NAME=value` entry).
fn check_string(field: &str, text: &str, exec_len: usize) -> Result<(), CommandInputError> {
    if let Some(offset) = text.bytes().position(|b| b == 0) {
        return Err(CommandInputError::NulByte {
            field: field.to_string(),
            offset,
        });
    }
    if exec_len >= MAX_ARG_STRLEN {
        return Err(CommandInputError::ArgTooLarge {
            field: field.to_string(),
            bytes: exec_len,
        });
    }
    Ok(())
}

/// `NAME=value` without its NUL.
fn env_entry_bytes(key: &str, value: &str) -> usize {
    key.len() + 1 + value.len()
}

/// argv and the whole environment as `execve` counts them. A sender's variable that
/// replaces one of the base environment's is counted once.
fn exec_bytes(input: &CommandInput<'_>) -> usize {
    let argv: usize = input.argv.iter().map(|a| a.len() + 1 + POINTER_BYTES).sum();
    let entry = |(key, value): &(&str, &str)| env_entry_bytes(key, value) + 1 + POINTER_BYTES;
    let added: usize = input.env.iter().map(entry).sum();
    let kept: usize = input
        .base_env
        .iter()
        .filter(|(key, _)| !input.env.iter().any(|(added, _)| added == key))
        .map(entry)
        .sum();
    // The two arrays' terminating NULL pointers.
    argv + added + kept + 2 * POINTER_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn refusal(argv: &[String], env: &[(&str, &str)]) -> Option<(&'static str, String)> {
        let input = CommandInput {
            argv,
            env,
            ..CommandInput::default()
        };
        check_command(&input).err().map(|e| (e.reason(), e.field()))
    }

    #[test]
    fn env_keys_must_be_portable_names_before_the_reserved_check() {
        let cmd = argv(&["true"]);
        let cases: &[(&str, &str, &str)] = &[
            ("", "request.env_key_invalid", "env key \"\""),
            ("=", "request.env_key_invalid", "env key \"=\""),
            ("A=B", "request.env_key_invalid", "env key \"A=B\""),
            ("A\0B", "request.env_key_invalid", "env key \"A\\0B\""),
            (
                "HTTP_PROXY=x#",
                "request.env_key_invalid",
                "env key \"HTTP_PROXY=x#\"",
            ),
            ("1A", "request.env_key_invalid", "env key \"1A\""),
            ("A-B", "request.env_key_invalid", "env key \"A-B\""),
            ("HTTP_PROXY", "request.env_reserved", "env.HTTP_PROXY"),
            ("https_proxy", "request.env_reserved", "env.https_proxy"),
            ("No_Proxy", "request.env_reserved", "env.No_Proxy"),
        ];
        for (key, reason, field) in cases {
            assert_eq!(
                refusal(&cmd, &[(key, "v")]),
                Some((*reason, field.to_string())),
                "key {key:?}"
            );
        }
        assert_eq!(refusal(&cmd, &[("_ok", "v"), ("A1", "")]), None);
    }

    #[test]
    fn the_engines_check_allows_airlocks_own_names_but_not_a_split_key() {
        let cmd = argv(&["true"]);
        let own = [("HTTP_PROXY", "http://127.0.0.1:1"), ("foo.bar", "1")];
        let plan = CommandInput {
            argv: &cmd,
            base_env: &own,
            ..CommandInput::default()
        };
        assert_eq!(check_exec(&plan), Ok(()));
        let split = [("A=B", "1")];
        let plan = CommandInput {
            base_env: &split,
            ..plan
        };
        assert_eq!(
            check_exec(&plan).map_err(|e| e.reason()),
            Err("request.env_key_invalid")
        );
    }

    #[test]
    fn nul_is_refused_in_arguments_values_and_the_working_directory() {
        assert_eq!(
            refusal(&argv(&["echo", "a", "b\0c"]), &[]),
            Some(("request.nul_byte", "argv[2]".into()))
        );
        assert_eq!(
            refusal(&argv(&["true"]), &[("FOO", "x\0y")]),
            Some(("request.nul_byte", "env.FOO".into()))
        );
        let cmd = argv(&["true"]);
        let input = CommandInput {
            argv: &cmd,
            cwd: Some("/work\0/x"),
            ..CommandInput::default()
        };
        assert_eq!(
            check_command(&input).map_err(|e| e.field()),
            Err("cwd".to_string())
        );
    }

    #[test]
    fn one_string_may_take_the_kernels_limit_less_its_nul() {
        let at_limit = "a".repeat(MAX_ARG_STRLEN - 1);
        assert_eq!(refusal(&argv(&["echo", &at_limit]), &[]), None);
        let over = "a".repeat(MAX_ARG_STRLEN);
        assert_eq!(
            refusal(&argv(&["echo", &over]), &[]),
            Some(("request.arg_too_large", "argv[1]".into()))
        );
        // An environment entry is `NAME=value`: the name counts.
        let value = "a".repeat(MAX_ARG_STRLEN - 4);
        assert_eq!(
            refusal(&argv(&["true"]), &[("FOO", &value)]),
            Some(("request.arg_too_large", "env.FOO".into()))
        );
    }

    #[test]
    fn the_total_counts_argv_and_the_whole_environment_as_execve_does() {
        let chunk = "a".repeat(100_000);
        // Two arguments fit; three do not.
        assert_eq!(refusal(&argv(&["echo", &chunk, &chunk]), &[]), None);
        assert_eq!(
            refusal(&argv(&["echo", &chunk, &chunk, &chunk]), &[]),
            Some(("request.argv_too_large", "argv and env".into()))
        );
        // The base environment counts too, and a replaced variable once.
        let cmd = argv(&["echo", &chunk, &chunk]);
        let big = "b".repeat(70_000);
        let base = [("BIG", big.as_str())];
        let over = CommandInput {
            argv: &cmd,
            base_env: &base,
            ..CommandInput::default()
        };
        assert!(matches!(
            check_command(&over),
            Err(CommandInputError::CommandTooLarge { .. })
        ));
        let replaced = [("BIG", "small")];
        let under = CommandInput {
            env: &replaced,
            ..over
        };
        assert_eq!(check_command(&under), Ok(()));
    }

    #[test]
    fn the_exact_bound_is_accepted_and_one_byte_more_refused() {
        // argv[0] "x" (its byte, its NUL, its pointer) and the two terminating pointers;
        // the rest of the budget in arguments of n bytes, each costing n + 1 + pointer.
        let fixed = 2 + POINTER_BYTES + 2 * POINTER_BYTES;
        let largest = MAX_COMMAND_BYTES - fixed;
        let mut cmd = vec!["x".to_string()];
        // Split across strings each within the per-string limit; each extra string costs
        // its NUL and pointer.
        let per = MAX_ARG_STRLEN - 1;
        let mut left = largest;
        while left > 0 {
            let take = left.saturating_sub(1 + POINTER_BYTES).min(per);
            cmd.push("a".repeat(take));
            left -= take + 1 + POINTER_BYTES;
        }
        let input = CommandInput {
            argv: &cmd,
            ..CommandInput::default()
        };
        assert_eq!(exec_bytes(&input), MAX_COMMAND_BYTES);
        assert_eq!(check_command(&input), Ok(()));
        cmd.last_mut().unwrap().push('a');
        let input = CommandInput {
            argv: &cmd,
            ..CommandInput::default()
        };
        assert_eq!(
            check_command(&input),
            Err(CommandInputError::CommandTooLarge {
                bytes: MAX_COMMAND_BYTES + 1
            })
        );
    }
}
