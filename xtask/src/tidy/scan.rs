//! The scanner behind the import graph: a small lexer of Rust source (comments, strings, raw strings, char
//! literals and lifetimes dropped) and the paths a file names, with the inline modules they sit in.

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    LParen,
    Star,
    Other,
}

/// A path written in the source: its segments as written (`super`, `crate`, `self` included) and line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct WrittenPath {
    pub(super) segments: Vec<String>,
    pub(super) line: usize,
}

/// What one file names.
#[derive(Debug, Default)]
pub(super) struct Scan {
    /// Every path starting with `crate`, `super`, `self` or `$crate`, with the inline modules it sits in.
    pub(super) references: Vec<(Vec<String>, WrittenPath)>,
    /// Every name a top-level `use` brings in, with its full path (for re-exports of a root file).
    pub(super) uses: Vec<(String, WrittenPath)>,
}

impl Scan {
    pub(super) fn of(text: &str) -> Self {
        let tokens = lex(text);
        let mut scan = Scan::default();
        // Inline modules by brace: `Some(name)` for the brace that opened `mod name {`.
        let mut braces: Vec<Option<String>> = Vec::new();
        let mut i = 0;
        while i < tokens.len() {
            let (tok, _) = &tokens[i];
            match tok {
                Tok::Open => {
                    let inline = match i.checked_sub(2).map(|j| (&tokens[j].0, &tokens[j + 1].0)) {
                        Some((Tok::Ident(kw), Tok::Ident(name))) if kw == "mod" => {
                            Some(name.clone())
                        }
                        _ => None,
                    };
                    braces.push(inline);
                }
                Tok::Close => {
                    braces.pop();
                }
                Tok::Ident(word) if word == "use" && braces.is_empty() => {
                    let (paths, end) = parse_tree(&tokens, i + 1, &[]);
                    for (path, alias) in paths {
                        if is_anchored(&path.segments) {
                            scan.references.push((Vec::new(), path.clone()));
                        }
                        let name = alias.or_else(|| path.segments.last().cloned());
                        if let Some(name) = name.filter(|n| n != "*" && n != "self") {
                            scan.uses.push((name, path));
                        }
                    }
                    i = end.max(i + 1);
                    continue;
                }
                _ => {}
            }
            if let Some(end) = scan.reference_at(&tokens, i, &braces) {
                i = end;
            } else {
                i += 1;
            }
        }
        scan
    }

    /// Records the path starting at `tokens[i]` when it is anchored (`crate::`, `super::`, `self::`,
    /// `$crate::`); the index after it.
    fn reference_at(
        &mut self,
        tokens: &[(Tok, usize)],
        i: usize,
        braces: &[Option<String>],
    ) -> Option<usize> {
        // `$crate::` (in macros) lexes as `$` then `crate::`, and reads the same.
        let Tok::Ident(word) = &tokens[i].0 else {
            return None;
        };
        if !matches!(word.as_str(), "crate" | "super" | "self") {
            return None;
        }
        if tokens.get(i + 1).map(|t| &t.0) != Some(&Tok::PathSep) {
            return None;
        }
        if i > 0 && tokens[i - 1].0 == Tok::PathSep {
            return None; // in the middle of a path
        }
        // `pub(in crate::x)` is a visibility, not a use of x.
        if i >= 2 && tokens[i - 1].0 == Tok::Ident("in".into()) && tokens[i - 2].0 == Tok::LParen {
            let (_, end) = parse_tree(tokens, i, &[]);
            return Some(end);
        }
        let (paths, end) = parse_tree(tokens, i, &[]);
        let inside: Vec<String> = braces.iter().flatten().cloned().collect();
        for (path, _) in paths {
            self.references.push((inside.clone(), path));
        }
        Some(end)
    }
}

fn is_anchored(segments: &[String]) -> bool {
    segments
        .first()
        .is_some_and(|s| matches!(s.as_str(), "crate" | "super" | "self"))
}

/// The paths of the tree at `tokens[start..]` (`a::b`, `a::{b, c::d as e, f::*}`), each with its alias,
/// prefixed by `prefix`; and the index after the tree.
fn parse_tree(
    tokens: &[(Tok, usize)],
    start: usize,
    prefix: &[String],
) -> (Vec<(WrittenPath, Option<String>)>, usize) {
    let mut segments = prefix.to_vec();
    let mut i = start;
    let line = tokens.get(start).map_or(0, |t| t.1);
    // A leading `::` (`use ::std::x`) names an extern crate: never ours.
    loop {
        match tokens.get(i).map(|t| &t.0) {
            Some(Tok::Ident(word)) => {
                segments.push(word.clone());
                i += 1;
            }
            Some(Tok::Star) => {
                segments.push("*".into());
                i += 1;
            }
            Some(Tok::Open) => {
                let mut paths = Vec::new();
                i += 1;
                loop {
                    match tokens.get(i).map(|t| &t.0) {
                        Some(Tok::Close) => {
                            i += 1;
                            break;
                        }
                        Some(Tok::Comma) => i += 1,
                        None => break,
                        Some(_) => {
                            let (inner, end) = parse_tree(tokens, i, &segments);
                            paths.extend(inner);
                            i = if end > i { end } else { i + 1 };
                        }
                    }
                }
                return (paths, i);
            }
            _ => break,
        }
        if tokens.get(i).map(|t| &t.0) == Some(&Tok::PathSep) {
            i += 1;
        } else {
            break;
        }
    }
    let mut alias = None;
    if matches!(tokens.get(i).map(|t| &t.0), Some(Tok::Ident(w)) if w == "as") {
        if let Some(Tok::Ident(name)) = tokens.get(i + 1).map(|t| &t.0) {
            alias = Some(name.clone());
        }
        i += 2;
    }
    if segments.len() == prefix.len() {
        return (Vec::new(), i);
    }
    (vec![(WrittenPath { segments, line }, alias)], i)
}

/// Tokens of Rust source with their lines; comments, literals and lifetimes dropped.
fn lex(text: &str) -> Vec<(Tok, usize)> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let count_lines = |from: usize, to: usize, line: &mut usize| {
        *line += chars[from..to.min(chars.len())]
            .iter()
            .filter(|c| **c == '\n')
            .count();
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let start = i;
        match c {
            '\n' => {
                line += 1;
                i += 1;
            }
            c if c.is_whitespace() => i += 1,
            '/' if next == Some('/') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '/' if next == Some('*') => {
                let mut depth = 0;
                while i < chars.len() {
                    if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                        depth += 1;
                        i += 2;
                    } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
                count_lines(start, i, &mut line);
            }
            '"' => {
                i = string_end(&chars, i + 1);
                count_lines(start, i, &mut line);
            }
            '\'' => {
                // A char literal ('a', '\n', '\u{1F600}') or a lifetime / label ('a, 'static).
                if next == Some('\\') {
                    i += 3; // the quote, the backslash and the escaped character
                    while i < chars.len() && chars[i] != '\'' {
                        i += 1;
                    }
                    i += 1;
                } else if chars.get(i + 2) == Some(&'\'') {
                    i += 3;
                } else {
                    i += 1;
                    while i < chars.len() && is_ident_char(chars[i]) {
                        i += 1;
                    }
                }
            }
            c if c.is_ascii_digit() => {
                while i < chars.len()
                    && (is_ident_char(chars[i])
                        || (chars[i] == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)))
                {
                    i += 1;
                }
            }
            c if is_ident_start(c) => {
                while i < chars.len() && is_ident_char(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                match (word.as_str(), chars.get(i).copied()) {
                    // Raw strings: r"…", r#"…"#, br"…", cr#"…"#.
                    ("r" | "br" | "cr", Some('"' | '#')) if raw_string_start(&chars, i) => {
                        i = raw_string_end(&chars, i);
                        count_lines(start, i, &mut line);
                    }
                    // Raw identifiers: r#type.
                    ("r", Some('#')) => {
                        i += 1;
                        let ident_start = i;
                        while i < chars.len() && is_ident_char(chars[i]) {
                            i += 1;
                        }
                        let word: String = chars[ident_start..i].iter().collect();
                        tokens.push((Tok::Ident(word), line));
                    }
                    // Byte and C strings, byte chars.
                    ("b" | "c", Some('"')) => {
                        i = string_end(&chars, i + 1);
                        count_lines(start, i, &mut line);
                    }
                    ("b", Some('\'')) => {
                        // Past the quote and the character (with its backslash when escaped).
                        i += if chars.get(i + 1) == Some(&'\\') {
                            3
                        } else {
                            2
                        };
                        while i < chars.len() && chars[i] != '\'' {
                            i += 1;
                        }
                        i += 1;
                    }
                    _ => tokens.push((Tok::Ident(word), line)),
                }
            }
            ':' if next == Some(':') => {
                tokens.push((Tok::PathSep, line));
                i += 2;
            }
            '{' => {
                tokens.push((Tok::Open, line));
                i += 1;
            }
            '}' => {
                tokens.push((Tok::Close, line));
                i += 1;
            }
            ',' => {
                tokens.push((Tok::Comma, line));
                i += 1;
            }
            '(' => {
                tokens.push((Tok::LParen, line));
                i += 1;
            }
            '*' => {
                tokens.push((Tok::Star, line));
                i += 1;
            }
            _ => {
                tokens.push((Tok::Other, line));
                i += 1;
            }
        }
    }
    tokens
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// The index after the closing quote of a string whose body starts at `i`.
fn string_end(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// True when `chars[i..]` is `#*"`: the rest of a raw string's opening.
fn raw_string_start(chars: &[char], mut i: usize) -> bool {
    while chars.get(i) == Some(&'#') {
        i += 1;
    }
    chars.get(i) == Some(&'"')
}

/// The index after a raw string whose hashes start at `i`.
fn raw_string_end(chars: &[char], mut i: usize) -> usize {
    let mut hashes = 0;
    while chars.get(i) == Some(&'#') {
        hashes += 1;
        i += 1;
    }
    i += 1; // the opening quote
    while i < chars.len() {
        if chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(scan: &Scan) -> Vec<String> {
        scan.references
            .iter()
            .map(|(inside, p)| {
                let mut shown = inside.join("/");
                if !shown.is_empty() {
                    shown.push_str(": ");
                }
                shown + &p.segments.join("::")
            })
            .collect()
    }

    #[test]
    fn use_trees_and_inline_paths_are_read_whole() {
        let scan = Scan::of(
            "use crate::a::{self, B, c::{D, E as F}, g::*};\nuse crate::h;\n\
             fn f() { let x = crate::i::J::new(); super::k(); self::l::M; }\n",
        );
        assert_eq!(
            written(&scan),
            [
                "crate::a::self",
                "crate::a::B",
                "crate::a::c::D",
                "crate::a::c::E",
                "crate::a::g::*",
                "crate::h",
                "crate::i::J::new",
                "super::k",
                "self::l::M",
            ]
        );
    }

    #[test]
    fn comments_strings_chars_and_lifetimes_hide_nothing_and_show_nothing() {
        let scan = Scan::of(concat!(
            "// use crate::commented;\n",
            "/* crate::block /* nested */ crate::still_comment */\n",
            "/// [`crate::doc_link`]\n",
            "const S: &str = \"crate::in_a_string \\\" crate::escaped\";\n",
            "const R: &str = r#\"crate::raw \" still raw\"#;\n",
            "const B: &[u8] = b\"crate::bytes\";\n",
            "const C: char = '\"'; const Q: char = '\\''; const Z: u8 = b'{';\n",
            "fn f<'a>(x: &'a str) -> &'a str { 'outer: loop { break 'outer; } crate::real::Thing }\n",
        ));
        assert_eq!(written(&scan), ["crate::real::Thing"]);
        assert_eq!(scan.references[0].1.line, 8);
    }

    #[test]
    fn visibility_paths_are_not_uses_and_mid_path_keywords_are_not_anchors() {
        let scan = Scan::of(
            "pub(in crate::a) fn f() {}\nuse other::crate_like::x;\nfn g(&self) { self.h() }",
        );
        assert!(written(&scan).is_empty(), "{:?}", written(&scan));
    }

    #[test]
    fn paths_inside_inline_modules_know_where_they_are() {
        let scan = Scan::of(
            "use crate::top;\n#[cfg(test)]\nmod tests {\n    use super::*;\n    mod deeper { fn f() { super::super::x::Y; } }\n}\nfn after() { crate::z::W; }",
        );
        assert_eq!(
            written(&scan),
            [
                "crate::top",
                "tests: super::*",
                "tests/deeper: super::super::x::Y",
                "crate::z::W",
            ]
        );
    }

    #[test]
    fn macro_crate_paths_count() {
        let scan = Scan::of("macro_rules! m { () => { $crate::a::b!() }; }");
        assert_eq!(written(&scan), ["crate::a::b"]);
    }
}
