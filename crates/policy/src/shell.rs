//! The simple commands of a `sh -c` / `bash -lc` script, found with a real shell parser
//! (brush-parser's bash grammar): pipelines, `&&`/`||` lists, `;`, subshells, brace
//! groups, `if`/`while`/`until`/`for`/`case` bodies, command and process substitutions
//! (parsed in turn) and nested `sh -c` scripts. A word whose value is only known when
//! the shell runs (a parameter, a glob, a brace or tilde expansion, a substitution) makes
//! its command [`FoundCommand::Dynamic`]; code the parser cannot see into (a function
//! definition, `eval`, `source`, `trap`, arithmetic) is [`FoundCommand::Opaque`]. Both get
//! the class's default decision, never `allow`.

use brush_parser::ast;
use brush_parser::word::{self, WordPiece};
use brush_parser::ParserOptions;

/// Shells whose `-c` script is parsed.
const SHELLS: &[&str] = &["sh", "bash", "dash", "ash", "ksh", "zsh"];
/// Builtins that run their arguments (or a file) as shell code.
const CODE_BUILTINS: &[&str] = &["eval", "source", ".", "trap"];
/// Builtins that run the command their arguments name: the command is checked instead.
const PREFIX_BUILTINS: &[&str] = &["exec", "command", "builtin"];
/// Nested scripts deeper than this are not followed (the default decision applies).
const MAX_DEPTH: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FoundCommand {
    /// Every word is known: the argv the shell will run.
    Static(Vec<String>),
    /// At least one word is only known at run time: the words as written, and the
    /// values of the static words before the first dynamic one.
    Dynamic {
        written: Vec<String>,
        static_prefix: Vec<String>,
    },
    /// Code that cannot be checked command by command.
    Opaque(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptCommands {
    /// argv is not a shell's `-c` invocation.
    NotAShell,
    Script(Vec<FoundCommand>),
    /// Why the script could not be parsed.
    Unparseable(String),
}

/// Whether argv's program is one of the shells whose scripts are parsed.
pub fn is_shell(argv: &[String]) -> bool {
    argv.first()
        .map(|p| p.rsplit('/').next().unwrap_or(p))
        .is_some_and(|name| SHELLS.contains(&name))
}

/// The script of `sh [-opts] -c SCRIPT ...` (any option cluster holding `c`, such as
/// `-lc` or `-ec`), if argv is one.
fn script_of(argv: &[String]) -> Option<Result<&str, String>> {
    if !is_shell(argv) {
        return None;
    }
    let mut rest = argv[1..].iter();
    for word in rest.by_ref() {
        let flags = word.strip_prefix('-').filter(|f| !f.starts_with('-'))?;
        if flags.contains('c') {
            return Some(
                rest.next()
                    .map(String::as_str)
                    .ok_or_else(|| format!("{word} without a script")),
            );
        }
    }
    None
}

/// The simple commands argv runs, if it is a shell's `-c` invocation.
pub fn commands_of(argv: &[String]) -> ScriptCommands {
    let mut found = Vec::new();
    match walk_argv(argv, 0, &mut found) {
        Ok(false) => ScriptCommands::NotAShell,
        Ok(true) => ScriptCommands::Script(found),
        Err(why) => ScriptCommands::Unparseable(why),
    }
}

/// Adds the commands of argv's script to `found`; false when argv runs no script.
fn walk_argv(argv: &[String], depth: usize, found: &mut Vec<FoundCommand>) -> Result<bool, String> {
    let Some(script) = script_of(argv) else {
        return Ok(false);
    };
    let script = script?;
    if depth >= MAX_DEPTH {
        return Err(format!("scripts nested deeper than {MAX_DEPTH}"));
    }
    walk_script(script, depth, found)?;
    Ok(true)
}

fn walk_script(script: &str, depth: usize, found: &mut Vec<FoundCommand>) -> Result<(), String> {
    let options = ParserOptions::default();
    let program = brush_parser::Parser::new(script.as_bytes(), &options)
        .parse_program()
        .map_err(|err| format!("the script does not parse: {err}"))?;
    let mut walker = Walker {
        options,
        depth,
        found,
    };
    for list in &program.complete_commands {
        walker.list(list)?;
    }
    Ok(())
}

struct Walker<'a> {
    options: ParserOptions,
    depth: usize,
    found: &'a mut Vec<FoundCommand>,
}

impl Walker<'_> {
    fn list(&mut self, list: &ast::CompoundList) -> Result<(), String> {
        for ast::CompoundListItem(and_or, _) in &list.0 {
            self.pipeline(&and_or.first)?;
            for next in &and_or.additional {
                let (ast::AndOr::And(p) | ast::AndOr::Or(p)) = next;
                self.pipeline(p)?;
            }
        }
        Ok(())
    }

    fn pipeline(&mut self, pipeline: &ast::Pipeline) -> Result<(), String> {
        pipeline.seq.iter().try_for_each(|c| self.command(c))
    }

    fn command(&mut self, command: &ast::Command) -> Result<(), String> {
        match command {
            ast::Command::Simple(simple) => self.simple(simple),
            ast::Command::Compound(compound, redirects) => {
                self.compound(compound)?;
                redirects
                    .iter()
                    .flat_map(|r| &r.0)
                    .try_for_each(|r| self.redirect(r))
            }
            ast::Command::Function(_) => self.opaque("a function definition"),
            ast::Command::ExtendedTest(..) => Ok(()),
        }
    }

    fn compound(&mut self, compound: &ast::CompoundCommand) -> Result<(), String> {
        use ast::CompoundCommand as C;
        match compound {
            C::BraceGroup(group) => self.list(&group.list),
            C::Subshell(subshell) => self.list(&subshell.list),
            C::ForClause(f) => {
                for value in f.values.iter().flatten() {
                    self.word(value)?;
                }
                self.list(&f.body.list)
            }
            C::CaseClause(case) => {
                self.word(&case.value)?;
                case.cases
                    .iter()
                    .flat_map(|c| &c.cmd)
                    .try_for_each(|l| self.list(l))
            }
            C::IfClause(branch) => {
                self.list(&branch.condition)?;
                self.list(&branch.then)?;
                for other in branch.elses.iter().flatten() {
                    if let Some(condition) = &other.condition {
                        self.list(condition)?;
                    }
                    self.list(&other.body)?;
                }
                Ok(())
            }
            C::WhileClause(w) | C::UntilClause(w) => {
                self.list(&w.0)?;
                self.list(&w.1.list)
            }
            C::Arithmetic(_) | C::ArithmeticForClause(_) => self.opaque("arithmetic"),
            C::Coprocess(_) => self.opaque("a coprocess"),
        }
    }

    fn simple(&mut self, simple: &ast::SimpleCommand) -> Result<(), String> {
        use ast::CommandPrefixOrSuffixItem as Item;
        let mut words = Vec::new();
        let items = simple.prefix.iter().flat_map(|p| &p.0);
        let suffix = simple.suffix.iter().flat_map(|s| &s.0);
        for item in items.clone() {
            if let Item::AssignmentWord(_, w) = item {
                self.word(w)?;
            }
        }
        words.extend(simple.word_or_name.iter());
        for item in items.chain(suffix) {
            match item {
                Item::Word(w) => words.push(w),
                Item::IoRedirect(r) => self.redirect(r)?,
                Item::AssignmentWord(..) => {}
                Item::ProcessSubstitution(_, sub) => self.list(&sub.list)?,
            }
        }
        if words.is_empty() {
            return Ok(());
        }
        let mut values = Vec::with_capacity(words.len());
        for w in &words {
            values.push(self.word(w)?);
        }
        if values.iter().any(Option::is_none) {
            self.found.push(FoundCommand::Dynamic {
                written: words.iter().map(|w| w.value.clone()).collect(),
                static_prefix: values.into_iter().map_while(|v| v).collect(),
            });
            return Ok(());
        }
        let argv = values.into_iter().flatten().collect();
        self.argv(argv)
    }

    /// A static argv: a code builtin is opaque, `exec X` is X, a nested shell script is
    /// walked, anything else is found as it is.
    fn argv(&mut self, mut argv: Vec<String>) -> Result<(), String> {
        while PREFIX_BUILTINS.contains(&argv[0].as_str())
            && argv.len() > 1
            && !argv[1].starts_with('-')
        {
            argv.remove(0);
        }
        if CODE_BUILTINS.contains(&argv[0].as_str()) {
            return self.opaque(&argv[0].clone());
        }
        if walk_argv(&argv, self.depth + 1, self.found)? {
            return Ok(());
        }
        self.found.push(FoundCommand::Static(argv));
        Ok(())
    }

    fn redirect(&mut self, redirect: &ast::IoRedirect) -> Result<(), String> {
        use ast::IoFileRedirectTarget as T;
        match redirect {
            ast::IoRedirect::File(_, _, T::Filename(w) | T::Duplicate(w)) => self.word(w).map(drop),
            ast::IoRedirect::File(_, _, T::ProcessSubstitution(_, sub)) => self.list(&sub.list),
            ast::IoRedirect::File(_, _, T::Fd(_)) => Ok(()),
            ast::IoRedirect::HereString(_, w) | ast::IoRedirect::OutputAndError(w, _) => {
                self.word(w).map(drop)
            }
            // An unquoted here-document may hold substitutions: not expanded here.
            ast::IoRedirect::HereDocument(_, doc) if doc.requires_expansion => {
                self.opaque("an expanding here-document")
            }
            ast::IoRedirect::HereDocument(..) => Ok(()),
        }
    }

    fn opaque(&mut self, what: &str) -> Result<(), String> {
        self.found.push(FoundCommand::Opaque(what.to_string()));
        Ok(())
    }

    /// The word's value when it is static; `None` when only the shell can know it. The
    /// scripts of its command substitutions are walked either way.
    fn word(&mut self, w: &ast::Word) -> Result<Option<String>, String> {
        let pieces = word::parse(&w.value, &self.options)
            .map_err(|err| format!("a word does not parse: {err}"))?;
        let mut value = Some(String::new());
        self.pieces(&pieces, &mut value, false)?;
        Ok(value)
    }

    fn pieces(
        &mut self,
        pieces: &[word::WordPieceWithSource],
        value: &mut Option<String>,
        quoted: bool,
    ) -> Result<(), String> {
        for piece in pieces.iter().map(|p| &p.piece) {
            let text = match piece {
                WordPiece::Text(text) if !quoted && text.contains(['*', '?', '[', '{', '~']) => {
                    None
                }
                WordPiece::Text(text) | WordPiece::SingleQuotedText(text) => Some(text.clone()),
                WordPiece::EscapeSequence(escaped) => {
                    Some(escaped.trim_start_matches('\\').to_string())
                }
                WordPiece::DoubleQuotedSequence(inner)
                | WordPiece::GettextDoubleQuotedSequence(inner) => {
                    self.pieces(inner, value, true)?;
                    continue;
                }
                WordPiece::CommandSubstitution(script)
                | WordPiece::BackquotedCommandSubstitution(script) => {
                    if self.depth + 1 >= MAX_DEPTH {
                        return Err(format!("scripts nested deeper than {MAX_DEPTH}"));
                    }
                    walk_script(script, self.depth + 1, self.found)?;
                    None
                }
                _ => None,
            };
            match (text, value.as_mut()) {
                (Some(text), Some(v)) => v.push_str(&text),
                (None, _) => *value = None,
                (Some(_), None) => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(text: &str) -> Vec<FoundCommand> {
        match commands_of(&["bash".into(), "-c".into(), text.into()]) {
            ScriptCommands::Script(found) => found,
            other => panic!("{text}: {other:?}"),
        }
    }

    fn st(words: &[&str]) -> FoundCommand {
        FoundCommand::Static(words.iter().map(|w| w.to_string()).collect())
    }

    #[test]
    fn only_a_shells_dash_c_form_is_a_script() {
        let argv = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            commands_of(&argv(&["ls", "-c", "x"])),
            ScriptCommands::NotAShell
        );
        assert_eq!(
            commands_of(&argv(&["bash", "x.sh"])),
            ScriptCommands::NotAShell
        );
        assert_eq!(
            commands_of(&argv(&["/bin/sh", "-e", "-c", "ls"])),
            ScriptCommands::Script(vec![st(&["ls"])])
        );
        assert_eq!(
            commands_of(&argv(&["bash", "-lc", "ls"])),
            ScriptCommands::Script(vec![st(&["ls"])])
        );
        assert!(matches!(
            commands_of(&argv(&["sh", "-c"])),
            ScriptCommands::Unparseable(_)
        ));
    }

    #[test]
    fn lists_pipelines_and_groups_yield_each_command_in_order() {
        assert_eq!(
            script("a 1 && b | c; (d) || { e; }"),
            [
                st(&["a", "1"]),
                st(&["b"]),
                st(&["c"]),
                st(&["d"]),
                st(&["e"])
            ]
        );
    }

    #[test]
    fn substitutions_and_nested_shells_are_walked() {
        assert_eq!(
            script("echo \"$(id -u)\" `whoami` <(cat f)"),
            [
                st(&["cat", "f"]),
                st(&["id", "-u"]),
                st(&["whoami"]),
                FoundCommand::Dynamic {
                    written: vec!["echo".into(), "\"$(id -u)\"".into(), "`whoami`".into()],
                    static_prefix: vec!["echo".into()],
                }
            ]
        );
        assert_eq!(script("sh -c 'bash -c \"rm x\"'"), [st(&["rm", "x"])]);
        assert_eq!(script("exec rm x"), [st(&["rm", "x"])]);
    }

    #[test]
    fn code_the_parser_cannot_see_into_is_opaque() {
        assert_eq!(
            script("eval \"rm x\""),
            [FoundCommand::Opaque("eval".into())]
        );
        assert_eq!(script(". ./env.sh"), [FoundCommand::Opaque(".".into())]);
        assert_eq!(
            script("f() { rm x; }; f"),
            [
                FoundCommand::Opaque("a function definition".into()),
                st(&["f"])
            ]
        );
    }

    #[test]
    fn assignments_and_redirections_are_not_the_command_but_are_checked() {
        assert_eq!(script("A=1 make > out.txt 2>&1"), [st(&["make"])]);
        assert_eq!(script("A=$(rm x) make"), [st(&["rm", "x"]), st(&["make"])]);
    }

    #[test]
    fn nesting_is_bounded() {
        let mut text = "ls".to_string();
        for _ in 0..10 {
            text = format!("sh -c {}", shell_quote(&text));
        }
        assert!(matches!(
            commands_of(&["sh".into(), "-c".into(), text]),
            ScriptCommands::Unparseable(_)
        ));
    }

    fn shell_quote(text: &str) -> String {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}
