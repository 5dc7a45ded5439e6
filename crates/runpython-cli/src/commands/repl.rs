//! `runpython repl`: an interactive Python session for people, sandboxed like any run. Every line (or
//! block) is a cell of one session, so state carries over; multi-line input continues after a block
//! header, an open bracket or a backslash until an empty line; history is kept in `~/.runpython_history`;
//! values are shown as Python shows them (their `repr`). Ctrl-C at the prompt clears the line; during a
//! cell it stops the cell (the session's interpreter is killed, which the next cell reports); Ctrl-D
//! ends the session.

use std::io::Write;
use std::process::ExitCode;

use runpython_core::{Envelope, Event, RunRequest};
use rustyline::error::ReadlineError;

use crate::args::McpArgs;
use crate::human::{escape_controls, for_terminal};
use crate::settings;

pub(crate) async fn repl(args: McpArgs) -> anyhow::Result<ExitCode> {
    let python = settings::engine(&args.engine).await?;
    settings::warm_up(&args.engine, &python).await?;
    let session = python.session();
    let mut editor = rustyline::DefaultEditor::new()?;
    let history =
        std::env::var_os("HOME").map(|home| std::path::Path::new(&home).join(".runpython_history"));
    if let Some(path) = &history {
        let _ = editor.load_history(path);
    }
    say_err!(
        "runpython repl: a sandboxed Python session ({}). Ctrl-D to leave.",
        escape_controls(&python.isolation_report().map_or_else(
            |e| e.to_string(),
            |i| format!("filesystem {}, network {}", i.filesystem, i.network)
        ))
    );
    loop {
        let line;
        (editor, line) = read_line(editor, ">>> ").await?;
        let mut source = match line {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        };
        while needs_more(&source) {
            let line;
            (editor, line) = read_line(editor, "... ").await?;
            match line {
                Ok(line) if line.trim().is_empty() => break,
                Ok(line) => {
                    source.push('\n');
                    source.push_str(&line);
                }
                Err(ReadlineError::Interrupted) => {
                    source.clear();
                    break;
                }
                Err(ReadlineError::Eof) => break,
                Err(e) => return Err(e.into()),
            }
        }
        if source.trim().is_empty() {
            continue;
        }
        let _ = editor.add_history_entry(source.as_str());
        let mut request = RunRequest::new(source);
        request.repr = true;
        let mut handle = session.start(request);
        let envelope = loop {
            tokio::select! {
                event = handle.next_event() => match event {
                    Some(Event::Stdout(text)) => {
                        let mut out = std::io::stdout().lock();
                        let _ = out.write_all(for_terminal(&text, true).as_bytes());
                        let _ = out.flush();
                    }
                    Some(Event::Stderr(text)) => {
                        let _ = std::io::stderr().lock().write_all(for_terminal(&text, true).as_bytes());
                    }
                    Some(_) => {}
                    None => break handle.wait().await,
                },
                _ = tokio::signal::ctrl_c() => {
                    handle.cancel();
                    break handle.wait().await;
                }
            }
        };
        match envelope {
            Ok(envelope) => show(&envelope),
            Err(runpython_core::Error::Cancelled) => say_err!("KeyboardInterrupt"),
            Err(e) => say_err!("runpython: {e}"),
        }
    }
    if let Some(path) = &history {
        let _ = editor.save_history(path);
    }
    let _ = session.close().await;
    Ok(ExitCode::SUCCESS)
}

/// One line from the terminal, read on a blocking thread: the thread that drives the command stays
/// free to see a signal (`main`'s `until_signal`) while the line editor waits for input.
async fn read_line(
    mut editor: rustyline::DefaultEditor,
    prompt: &'static str,
) -> anyhow::Result<(rustyline::DefaultEditor, rustyline::Result<String>)> {
    Ok(tokio::task::spawn_blocking(move || {
        let line = editor.readline(prompt);
        (editor, line)
    })
    .await?)
}

fn show(envelope: &Envelope) {
    match &envelope.error {
        Some(error) => match &error.traceback {
            Some(tb) if !tb.is_empty() => say_err_raw!("{}", crate::human::keep_lines(tb)),
            _ => say_err!(
                "{}: {}",
                escape_controls(&error.kind),
                crate::human::keep_lines(&error.message)
            ),
        },
        None => {
            if let Some(shown) = &envelope.return_repr {
                say!("{}", crate::human::keep_lines(shown));
            }
        }
    }
}

/// Whether `source` is an unfinished statement the way Python's own REPL sees it: after a block header
/// (a line ending in `:`), inside an open bracket or a triple-quoted string, after a trailing backslash,
/// or while an indented block goes on.
fn needs_more(source: &str) -> bool {
    let last = source.lines().last().unwrap_or("");
    let code = strip_comment(last).trim_end();
    if code.ends_with(':') || code.ends_with('\\') {
        return true;
    }
    if source.lines().count() > 1 && last.starts_with([' ', '\t']) {
        return true;
    }
    let (mut depth, mut quote, mut triple): (i32, Option<char>, bool) = (0, None, false);
    let chars: Vec<char> = source.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match quote {
            Some(q) => {
                if c == '\\' {
                    i += 1;
                } else if triple
                    && c == q
                    && chars.get(i + 1) == Some(&q)
                    && chars.get(i + 2) == Some(&q)
                {
                    quote = None;
                    i += 2;
                } else if !triple && (c == q || c == '\n') {
                    quote = None;
                }
            }
            None => match c {
                '#' => {
                    while i < chars.len() && chars[i] != '\n' {
                        i += 1;
                    }
                }
                '\'' | '"' => {
                    triple = chars.get(i + 1) == Some(&c) && chars.get(i + 2) == Some(&c);
                    quote = Some(c);
                    if triple {
                        i += 2;
                    }
                }
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => depth -= 1,
                _ => {}
            },
        }
        i += 1;
    }
    depth > 0 || (quote.is_some() && triple)
}

fn strip_comment(line: &str) -> &str {
    // A `#` outside quotes starts a comment (quotes on one line: good enough for a prompt).
    let mut quote = None;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '#') => return &line[..i],
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            _ => {}
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::needs_more;

    #[test]
    fn a_statement_goes_on_the_way_pythons_repl_sees_it() {
        for more in [
            "def f():",
            "x = (1,",
            "s = '''a",
            "if x:  # why",
            "x = 1 + \\",
            "for i in y:\n    pass",
        ] {
            assert!(needs_more(more), "{more:?}");
        }
        for done in [
            "x = 1",
            "f(1, (2, 3))",
            "s = '''a'''",
            "d = {'k': ':'}",
            "print('#(')",
        ] {
            assert!(!needs_more(done), "{done:?}");
        }
    }
}
