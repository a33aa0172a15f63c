//! Command policy on argv, before any cell exists: ordered prefix rules, each `allow`,
//! `prompt` or `forbidden`, and the strictest decision of every rule that matches wins
//! (the model is Codex's `execpolicy` prefix rules). Each rule carries examples that must
//! and must not match; [`CommandPolicy::check_examples`] runs them when the class is
//! loaded, so a rule that does not say what its author meant is a configuration error.
//!
//! A convenience in front of the boundary, not the boundary: a cell contains whatever
//! a command does; this only stops obviously forbidden work early and routes risky work
//! to a person (docs/policy.md).

use crate::shell::{self, ScriptCommands};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a rule (or the policy) says about a command. Ordered by strictness.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Allow,
    Prompt,
    Forbidden,
}

/// What a command gets when no rule can decide it (a script that does not parse, a
/// command word only known at run time): never `allow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Fallback {
    #[default]
    Prompt,
    Forbidden,
}

impl From<Fallback> for Decision {
    fn from(fallback: Fallback) -> Decision {
        match fallback {
            Fallback::Prompt => Decision::Prompt,
            Fallback::Forbidden => Decision::Forbidden,
        }
    }
}

/// One token of a prefix pattern: a word, or any of several words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum PatternToken {
    Word(String),
    AnyOf(Vec<String>),
}

impl PatternToken {
    fn matches(&self, word: &str) -> bool {
        match self {
            PatternToken::Word(expected) => expected == word,
            PatternToken::AnyOf(choices) => choices.iter().any(|c| c == word),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandRule {
    /// The argv prefix: `["git", ["push", "fetch"]]`. The first token is the program: a
    /// name without `/` matches the program by its base name (`git` matches
    /// `/usr/bin/git`), a path only itself.
    pub pattern: Vec<PatternToken>,
    pub decision: Decision,
    /// Why, for people reading a denial or an approval request.
    #[serde(default)]
    pub justification: Option<String>,
    /// Commands (words separated by spaces) this rule must match; checked at load.
    #[serde(default, rename = "match")]
    pub must_match: Vec<String>,
    /// Commands this rule must not match; checked at load.
    #[serde(default)]
    pub not_match: Vec<String>,
}

impl CommandRule {
    /// Whether `argv` starts with this rule's pattern.
    pub fn matches(&self, argv: &[String]) -> bool {
        let Some((program, rest)) = self.pattern.split_first() else {
            return false;
        };
        let Some((argv0, args)) = argv.split_first() else {
            return false;
        };
        program_matches(program, argv0)
            && rest.len() <= args.len()
            && rest
                .iter()
                .zip(args)
                .all(|(token, word)| token.matches(word))
    }
}

fn program_matches(token: &PatternToken, argv0: &str) -> bool {
    let base = argv0.rsplit('/').next().unwrap_or(argv0);
    let one = |expected: &String| {
        if expected.contains('/') {
            expected == argv0
        } else {
            expected == base
        }
    };
    match token {
        PatternToken::Word(expected) => one(expected),
        PatternToken::AnyOf(choices) => choices.iter().any(one),
    }
}

/// A class's command policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandPolicy {
    /// For what no rule can decide: a script that does not parse, a command word that is
    /// an expansion, a shell reading a script file no rule names. `prompt` or `forbidden`.
    #[serde(default)]
    pub default: Fallback,
    /// For a plain command no rule matches. Default `prompt`.
    #[serde(default = "unmatched_default")]
    pub unmatched: Decision,
    #[serde(default)]
    pub rules: Vec<CommandRule>,
}

impl Default for CommandPolicy {
    fn default() -> Self {
        CommandPolicy {
            default: Fallback::Prompt,
            unmatched: unmatched_default(),
            rules: Vec::new(),
        }
    }
}

fn unmatched_default() -> Decision {
    Decision::Prompt
}

/// The decision on one command, and the commands it was made of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CommandVerdict {
    pub decision: Decision,
    /// Every simple command checked, with its own decision (the strictest is `decision`).
    pub commands: Vec<CheckedCommand>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckedCommand {
    /// The words as written; a word only known at run time is shown as written.
    pub words: Vec<String>,
    pub decision: Decision,
    /// Why: the matching rule's justification, `no rule matches`, `not parseable`, ...
    pub why: String,
}

/// An example that does not behave as its rule says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExampleFailure {
    pub rule: usize,
    pub example: String,
    pub expected_match: bool,
}

impl std::fmt::Display for ExampleFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let should = if self.expected_match {
            "must match but does not"
        } else {
            "must not match but does"
        };
        write!(
            f,
            "rules[{}]: example `{}` {should}",
            self.rule, self.example
        )
    }
}

impl CommandPolicy {
    /// Every rule's examples; the failures, in rule order.
    pub fn check_examples(&self) -> Vec<ExampleFailure> {
        let mut failures = Vec::new();
        for (index, rule) in self.rules.iter().enumerate() {
            let cases = rule
                .must_match
                .iter()
                .map(|e| (e, true))
                .chain(rule.not_match.iter().map(|e| (e, false)));
            for (example, expected_match) in cases {
                if rule.matches(&example_words(example)) != expected_match {
                    failures.push(ExampleFailure {
                        rule: index,
                        example: example.clone(),
                        expected_match,
                    });
                }
            }
        }
        failures
    }

    /// The decision on `argv`: the strictest over its simple commands, which are argv
    /// itself, or for `sh -c` / `bash -lc SCRIPT` every simple command of the script.
    pub fn evaluate(&self, argv: &[String]) -> CommandVerdict {
        let commands = match shell::commands_of(argv) {
            ScriptCommands::NotAShell => vec![self.plain(argv)],
            ScriptCommands::Script(found) => found.iter().map(|c| self.found(c)).collect(),
            ScriptCommands::Unparseable(why) => vec![self.fallback(argv, why)],
        };
        let decision = commands
            .iter()
            .map(|c| c.decision)
            .max()
            .unwrap_or(Decision::from(self.default));
        CommandVerdict { decision, commands }
    }

    fn strictest_rule(&self, argv: &[String]) -> Option<&CommandRule> {
        self.rules
            .iter()
            .filter(|rule| rule.matches(argv))
            .max_by_key(|rule| rule.decision)
    }

    fn plain(&self, argv: &[String]) -> CheckedCommand {
        match self.strictest_rule(argv) {
            Some(rule) => self.ruled(argv, rule),
            // A shell given a script file (or stdin): its commands are unknown here.
            None if shell::is_shell(argv) => {
                self.fallback(argv, "a shell running a script no rule names".into())
            }
            None => CheckedCommand {
                words: argv.to_vec(),
                decision: self.unmatched,
                why: "no rule matches".to_string(),
            },
        }
    }

    fn ruled(&self, argv: &[String], rule: &CommandRule) -> CheckedCommand {
        CheckedCommand {
            words: argv.to_vec(),
            decision: rule.decision,
            why: rule
                .justification
                .clone()
                .unwrap_or_else(|| format!("rule {:?}", rule.pattern)),
        }
    }

    fn found(&self, command: &shell::FoundCommand) -> CheckedCommand {
        match command {
            shell::FoundCommand::Static(argv) => self.plain(argv),
            shell::FoundCommand::Dynamic {
                written,
                static_prefix,
            } => self.dynamic(written, static_prefix),
            shell::FoundCommand::Opaque(what) => self.fallback(
                std::slice::from_ref(what),
                format!("{what} cannot be checked"),
            ),
        }
    }

    /// A command with a word only known at run time: the default, or a stricter rule that
    /// its static words already match (`rm -rf $X` is `rm -rf`).
    fn dynamic(&self, written: &[String], static_prefix: &[String]) -> CheckedCommand {
        let fallback = self.fallback(written, "a word is only known at run time".to_string());
        match self.strictest_rule(static_prefix) {
            Some(rule) if rule.decision > fallback.decision => CheckedCommand {
                words: written.to_vec(),
                ..self.ruled(static_prefix, rule)
            },
            _ => fallback,
        }
    }

    fn fallback(&self, words: &[String], why: String) -> CheckedCommand {
        CheckedCommand {
            words: words.to_vec(),
            decision: self.default.into(),
            why,
        }
    }
}

/// An example as argv: its words separated by white space.
fn example_words(example: &str) -> Vec<String> {
    example.split_whitespace().map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(text: &str) -> Vec<String> {
        example_words(text)
    }

    fn rule(pattern: &[&str], decision: Decision) -> CommandRule {
        CommandRule {
            pattern: pattern
                .iter()
                .map(|w| PatternToken::Word(w.to_string()))
                .collect(),
            decision,
            justification: None,
            must_match: vec![],
            not_match: vec![],
        }
    }

    fn policy(rules: Vec<CommandRule>) -> CommandPolicy {
        CommandPolicy {
            default: Fallback::Prompt,
            unmatched: Decision::Prompt,
            rules,
        }
    }

    #[test]
    fn a_prefix_rule_matches_longer_commands_but_not_shorter_or_other_ones() {
        let r = rule(&["git", "push"], Decision::Prompt);
        assert!(r.matches(&argv("git push")));
        assert!(r.matches(&argv("git push origin main")));
        assert!(!r.matches(&argv("git")));
        assert!(!r.matches(&argv("git pull")));
        assert!(!r.matches(&argv("gitx push")));
    }

    #[test]
    fn a_program_name_matches_by_base_name_and_a_path_only_itself() {
        let by_name = rule(&["git"], Decision::Allow);
        assert!(by_name.matches(&argv("/usr/bin/git status")));
        let by_path = rule(&["/usr/bin/git"], Decision::Allow);
        assert!(by_path.matches(&argv("/usr/bin/git status")));
        assert!(!by_path.matches(&argv("git status")));
        assert!(!by_path.matches(&argv("/tmp/usr/bin/git")));
    }

    #[test]
    fn alternatives_match_any_of_their_words() {
        let r = CommandRule {
            pattern: vec![
                PatternToken::Word("git".into()),
                PatternToken::AnyOf(vec!["push".into(), "fetch".into()]),
            ],
            ..rule(&[], Decision::Prompt)
        };
        assert!(r.matches(&argv("git fetch")));
        assert!(r.matches(&argv("git push -f")));
        assert!(!r.matches(&argv("git status")));
    }

    #[test]
    fn the_strictest_matching_rule_wins_whatever_the_order() {
        for rules in [
            vec![
                rule(&["git"], Decision::Allow),
                rule(&["git", "push"], Decision::Forbidden),
            ],
            vec![
                rule(&["git", "push"], Decision::Forbidden),
                rule(&["git"], Decision::Allow),
            ],
        ] {
            let p = policy(rules);
            assert_eq!(
                p.evaluate(&argv("git push x")).decision,
                Decision::Forbidden
            );
            assert_eq!(p.evaluate(&argv("git status")).decision, Decision::Allow);
        }
        let p = policy(vec![
            rule(&["npm"], Decision::Prompt),
            rule(&["npm", "test"], Decision::Allow),
        ]);
        assert_eq!(p.evaluate(&argv("npm test")).decision, Decision::Prompt);
    }

    #[test]
    fn a_command_no_rule_matches_gets_the_unmatched_decision() {
        let mut p = policy(vec![rule(&["ls"], Decision::Allow)]);
        assert_eq!(p.evaluate(&argv("make test")).decision, Decision::Prompt);
        p.unmatched = Decision::Allow;
        assert_eq!(p.evaluate(&argv("make test")).decision, Decision::Allow);
        p.unmatched = Decision::Forbidden;
        assert_eq!(p.evaluate(&argv("make test")).decision, Decision::Forbidden);
    }

    #[test]
    fn every_simple_command_of_a_script_is_checked() {
        let p = CommandPolicy {
            unmatched: Decision::Allow,
            ..policy(vec![
                rule(&["rm"], Decision::Forbidden),
                rule(&["curl"], Decision::Prompt),
            ])
        };
        let verdict = p.evaluate(&["bash".into(), "-lc".into(), "cd /repo && make test".into()]);
        assert_eq!(verdict.decision, Decision::Allow);
        assert_eq!(verdict.commands.len(), 2);
        for script in [
            "make test; rm -rf /",
            "make | rm x",
            "(cd /tmp && rm -rf .)",
            "echo $(rm -rf /)",
            "echo `rm x`",
            "{ rm x; }",
            "if true; then rm x; fi",
            "for f in a b; do rm -rf $f; done",
            "make || sh -c 'rm -rf /'",
        ] {
            let verdict = p.evaluate(&["sh".into(), "-c".into(), script.into()]);
            assert_eq!(verdict.decision, Decision::Forbidden, "{script}");
        }
        let verdict = p.evaluate(&["sh".into(), "-c".into(), "make && curl x.test".into()]);
        assert_eq!(verdict.decision, Decision::Prompt);
    }

    #[test]
    fn what_cannot_be_parsed_gets_the_default_never_allow() {
        let mut p = CommandPolicy {
            unmatched: Decision::Allow,
            ..policy(vec![
                rule(&["bash"], Decision::Allow),
                rule(&["sh"], Decision::Allow),
            ])
        };
        for argv in [
            vec!["bash", "-c", "echo 'unterminated"],
            vec!["bash", "-c", "if then fi ("],
            vec!["sh", "-c"],
        ] {
            let argv: Vec<String> = argv.into_iter().map(String::from).collect();
            assert_eq!(p.evaluate(&argv).decision, Decision::Prompt, "{argv:?}");
            p.default = Fallback::Forbidden;
            assert_eq!(p.evaluate(&argv).decision, Decision::Forbidden, "{argv:?}");
            p.default = Fallback::Prompt;
        }
    }

    #[test]
    fn a_command_word_known_only_at_run_time_gets_the_default() {
        let p = CommandPolicy {
            unmatched: Decision::Allow,
            ..policy(vec![])
        };
        for script in ["$CMD x", "\"$(which rm)\" -rf /", "r?m x", "eval rm"] {
            let verdict = p.evaluate(&["bash".into(), "-c".into(), script.into()]);
            assert_eq!(verdict.decision, Decision::Prompt, "{script}");
        }
        // Quoting alone is static.
        let verdict = p.evaluate(&["bash".into(), "-c".into(), "'ls' \"-l\" \\/tmp".into()]);
        assert_eq!(verdict.decision, Decision::Allow);
        assert_eq!(verdict.commands[0].words, ["ls", "-l", "/tmp"]);
    }

    #[test]
    fn a_shell_running_a_script_file_no_rule_names_gets_the_default() {
        let p = CommandPolicy {
            unmatched: Decision::Allow,
            ..policy(vec![rule(&["bash", "/input/run.sh"], Decision::Allow)])
        };
        assert_eq!(
            p.evaluate(&argv("bash /tmp/x.sh")).decision,
            Decision::Prompt
        );
        assert_eq!(
            p.evaluate(&argv("bash /input/run.sh")).decision,
            Decision::Allow
        );
    }

    #[test]
    fn examples_are_checked_both_ways() {
        let mut r = rule(&["git", "push"], Decision::Prompt);
        r.must_match = vec!["git push origin".into(), "git status".into()];
        r.not_match = vec!["git pull".into(), "git push".into()];
        let failures = policy(vec![r]).check_examples();
        assert_eq!(
            failures.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "rules[0]: example `git status` must match but does not",
                "rules[0]: example `git push` must not match but does",
            ]
        );
    }
}
