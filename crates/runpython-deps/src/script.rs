//! PEP 723 inline script metadata: the `# /// script` block, read and written.

use crate::Error;

/// What a `# /// script` block declares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScriptMetadata {
    /// `dependencies`, as written.
    pub dependencies: Vec<String>,
    /// `requires-python`, as written.
    pub requires_python: Option<String>,
}

/// Where a block sits: the line indices of `# /// script` and of its closing `# ///`.
struct Block {
    open: usize,
    close: usize,
}

fn find_block(lines: &[&str]) -> Result<Option<Block>, Error> {
    let mut found: Option<Block> = None;
    let mut i = 0;
    while i < lines.len() {
        let Some(kind) = lines[i].trim_end().strip_prefix("# /// ") else {
            i += 1;
            continue;
        };
        let kind = kind.trim();
        if kind.is_empty() || !kind.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            i += 1;
            continue;
        }
        // The block runs over comment lines (`#` or `# …`); it ends at the last `# ///` among them.
        let mut close = None;
        let mut j = i + 1;
        while j < lines.len() {
            let line = lines[j].trim_end();
            if line == "# ///" {
                close = Some(j);
            } else if !(line == "#" || line.starts_with("# ")) {
                break;
            }
            j += 1;
        }
        let Some(close) = close else {
            return Err(Error::ScriptMetadata {
                reason: format!(
                    "the `# /// {kind}` block opened on line {} is never closed by a `# ///` line",
                    i + 1
                ),
            });
        };
        if kind == "script" {
            if let Some(first) = &found {
                return Err(Error::ScriptMetadata {
                    reason: format!(
                        "two `# /// script` blocks (lines {} and {}); PEP 723 allows one",
                        first.open + 1,
                        i + 1
                    ),
                });
            }
            found = Some(Block { open: i, close });
        }
        i = close + 1;
    }
    Ok(found)
}

fn block_toml(lines: &[&str], block: &Block) -> String {
    let mut toml = String::new();
    for line in &lines[block.open + 1..block.close] {
        let line = line.trim_end();
        toml.push_str(line.strip_prefix("# ").unwrap_or(""));
        toml.push('\n');
    }
    toml
}

/// Reads the PEP 723 `# /// script` block of `source`, if there is one.
pub fn read_script_metadata(source: &str) -> Result<Option<ScriptMetadata>, Error> {
    if !source.contains("# /// ") {
        return Ok(None);
    }
    let lines: Vec<&str> = source.lines().collect();
    let Some(block) = find_block(&lines)? else {
        return Ok(None);
    };
    let table: toml::Table =
        toml::from_str(&block_toml(&lines, &block)).map_err(|e| Error::ScriptMetadata {
            reason: format!(
                "the `# /// script` block on line {} is not valid TOML: {}",
                block.open + 1,
                e.message()
            ),
        })?;
    let dependencies = match table.get("dependencies") {
        None => Vec::new(),
        Some(toml::Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                toml::Value::String(s) => Ok(s.clone()),
                other => Err(Error::ScriptMetadata {
                    reason: format!(
                        "`dependencies` must list strings, it has a {}",
                        other.type_str()
                    ),
                }),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(Error::ScriptMetadata {
                reason: format!(
                    "`dependencies` must be a list of strings, not a {}",
                    other.type_str()
                ),
            })
        }
    };
    let requires_python = match table.get("requires-python") {
        None => None,
        Some(toml::Value::String(s)) => Some(s.clone()),
        Some(other) => {
            return Err(Error::ScriptMetadata {
                reason: format!(
                    "`requires-python` must be a string, not a {}",
                    other.type_str()
                ),
            })
        }
    };
    Ok(Some(ScriptMetadata {
        dependencies,
        requires_python,
    }))
}

fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn dependencies_lines(dependencies: &[String]) -> Vec<String> {
    if dependencies.is_empty() {
        return vec!["# dependencies = []".into()];
    }
    let mut lines = vec!["# dependencies = [".to_owned()];
    lines.extend(
        dependencies
            .iter()
            .map(|d| format!("#   {},", toml_string(d))),
    );
    lines.push("# ]".into());
    lines
}

/// The index just past the end of a top-level `dependencies = [...]` value that starts on line
/// `start` of `content` (block lines without their `# ` prefix), or `None` if it never closes.
fn value_end(content: &[String], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote: Option<(char, bool)> = None; // (quote char, triple)
    for (offset, line) in content[start..].iter().enumerate() {
        let text = if offset == 0 {
            line.split_once('=').map_or("", |(_, v)| v)
        } else {
            line.as_str()
        };
        let chars: Vec<char> = text.chars().collect();
        let mut k = 0;
        while k < chars.len() {
            let c = chars[k];
            match quote {
                Some((q, triple)) => {
                    if c == '\\' && q == '"' {
                        k += 1;
                    } else if c == q {
                        if !triple {
                            quote = None;
                        } else if chars.get(k + 1) == Some(&q) && chars.get(k + 2) == Some(&q) {
                            quote = None;
                            k += 2;
                        }
                    }
                }
                None => match c {
                    '#' => break,
                    '"' | '\'' => {
                        let triple = chars.get(k + 1) == Some(&c) && chars.get(k + 2) == Some(&c);
                        quote = Some((c, triple));
                        if triple {
                            k += 2;
                        }
                    }
                    '[' => depth += 1,
                    ']' => {
                        depth = depth.saturating_sub(1);
                        if depth == 0 {
                            return Some(start + offset + 1);
                        }
                    }
                    _ => {}
                },
            }
            k += 1;
        }
        if depth == 0 && quote.is_none() {
            // A one-line value that is not an array (invalid, but its extent is this line).
            return Some(start + offset + 1);
        }
    }
    None
}

/// Writes `dependencies` into the PEP 723 block of `source`: replaces the `dependencies` key of an
/// existing block (other keys and comments stay), or adds a block at the top (after a `#!` line).
pub fn write_script_dependencies(source: &str, dependencies: &[String]) -> Result<String, Error> {
    let lines: Vec<&str> = source.lines().collect();
    let mut out: Vec<String> = Vec::with_capacity(lines.len() + dependencies.len() + 4);
    match find_block(&lines)? {
        None => {
            let insert_at = usize::from(lines.first().is_some_and(|l| l.starts_with("#!")));
            out.extend(lines[..insert_at].iter().map(|l| (*l).to_owned()));
            out.push("# /// script".into());
            out.extend(dependencies_lines(dependencies));
            out.push("# ///".into());
            out.extend(lines[insert_at..].iter().map(|l| (*l).to_owned()));
        }
        Some(block) => {
            // Validate first: we only rewrite blocks we can read.
            read_script_metadata(source)?;
            let content: Vec<String> = lines[block.open + 1..block.close]
                .iter()
                .map(|l| l.trim_end().strip_prefix("# ").unwrap_or("").to_owned())
                .collect();
            let first_table = content
                .iter()
                .position(|l| l.trim_start().starts_with('['))
                .unwrap_or(content.len());
            let key_line = content[..first_table].iter().position(|l| {
                l.trim_start()
                    .strip_prefix("dependencies")
                    .is_some_and(|rest| rest.trim_start().starts_with('='))
            });
            out.extend(lines[..=block.open].iter().map(|l| (*l).to_owned()));
            let original = &lines[block.open + 1..block.close];
            match key_line {
                Some(start) => {
                    let end = value_end(&content, start).ok_or_else(|| Error::ScriptMetadata {
                        reason: "the `dependencies` list in the `# /// script` block is not closed"
                            .into(),
                    })?;
                    out.extend(original[..start].iter().map(|l| (*l).to_owned()));
                    out.extend(dependencies_lines(dependencies));
                    out.extend(original[end..].iter().map(|l| (*l).to_owned()));
                }
                None => {
                    out.extend(dependencies_lines(dependencies));
                    out.extend(original.iter().map(|l| (*l).to_owned()));
                }
            }
            out.extend(lines[block.close..].iter().map(|l| (*l).to_owned()));
        }
    }
    let mut text = out.join("\n");
    if source.ends_with('\n') || source.is_empty() {
        text.push('\n');
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPT: &str = r#"#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = [
#   "requests<3",   # a comment ] with a bracket
#   'rich',
# ]
#
# [tool.runpython]
# note = "kept"
# ///
import requests
"#;

    #[test]
    fn a_script_block_is_read() {
        let meta = read_script_metadata(SCRIPT).unwrap().unwrap();
        assert_eq!(meta.dependencies, ["requests<3", "rich"]);
        assert_eq!(meta.requires_python.as_deref(), Some(">=3.10"));
        assert_eq!(read_script_metadata("import os\n").unwrap(), None);
        let other_kind = "# /// pyproject\n# x = 1\n# ///\n";
        assert_eq!(read_script_metadata(other_kind).unwrap(), None);
    }

    #[test]
    fn malformed_blocks_are_errors_that_say_what_is_wrong() {
        let unclosed = "# /// script\n# dependencies = []\nimport os\n";
        let err = read_script_metadata(unclosed).unwrap_err();
        assert!(err.to_string().contains("never closed"), "{err}");

        let twice = "# /// script\n# ///\nimport os\n# /// script\n# ///\n";
        let err = read_script_metadata(twice).unwrap_err();
        assert!(err.to_string().contains("two"), "{err}");

        let bad_toml = "# /// script\n# dependencies = [\"a\"\n# ///\n";
        assert!(read_script_metadata(bad_toml)
            .unwrap_err()
            .to_string()
            .contains("TOML"));

        let not_strings = "# /// script\n# dependencies = [1]\n# ///\n";
        assert!(read_script_metadata(not_strings)
            .unwrap_err()
            .to_string()
            .contains("strings"));
    }

    #[test]
    fn writing_replaces_dependencies_and_keeps_everything_else() {
        let deps = vec![
            "six==1.15.0".to_owned(),
            "pkg[x] @ file:///a \"b\"".to_owned(),
        ];
        let written = write_script_dependencies(SCRIPT, &deps).unwrap();
        let meta = read_script_metadata(&written).unwrap().unwrap();
        assert_eq!(meta.dependencies, deps);
        assert_eq!(meta.requires_python.as_deref(), Some(">=3.10"));
        assert!(
            written.starts_with("#!/usr/bin/env python3\n# /// script\n"),
            "{written}"
        );
        assert!(written.contains("# note = \"kept\""), "{written}");
        assert!(written.ends_with("# ///\nimport requests\n"), "{written}");
    }

    #[test]
    fn writing_adds_a_block_after_the_shebang_or_a_key_to_a_block_without_one() {
        let written =
            write_script_dependencies("#!/bin/python\nimport six\n", &["six".into()]).unwrap();
        assert_eq!(
            written,
            "#!/bin/python\n# /// script\n# dependencies = [\n#   \"six\",\n# ]\n# ///\nimport six\n"
        );
        let no_key = "# /// script\n# requires-python = \">=3.11\"\n# ///\nx = 1";
        let written = write_script_dependencies(no_key, &["tabulate".into()]).unwrap();
        let meta = read_script_metadata(&written).unwrap().unwrap();
        assert_eq!(meta.dependencies, ["tabulate"]);
        assert_eq!(meta.requires_python.as_deref(), Some(">=3.11"));
        assert!(written.ends_with("# ///\nx = 1"), "{written}");
        let updated = write_script_dependencies(&written, &[]).unwrap();
        assert!(read_script_metadata(&updated)
            .unwrap()
            .unwrap()
            .dependencies
            .is_empty());
    }
}
