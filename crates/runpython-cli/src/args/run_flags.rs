//! What `run` hands the code besides its source: `--input` (globals), `--env` (variables), `--file`
//! (host files put in the run), and `--max-upload-bytes` (files MCP clients send).

use std::path::PathBuf;

use serde_json::Value;

/// `--max-upload-bytes`: a size as `512K`, or `0`.
pub(crate) fn parse_upload_size(s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    runpython_core::parse_size(s)
}

/// Where `--file` takes a file from.
#[derive(Debug, Clone)]
pub(crate) enum RunFile {
    Path(PathBuf),
    Artifact(String),
}

/// `PATH`, `PATH=NAME` or `@ID=NAME`.
/// `--warm`'s value: requirement specs separated by commas, a comma inside one spec's version
/// (`pandas>=2,<3`) kept with it.
pub(crate) fn parse_warm(s: &str) -> Result<Vec<String>, String> {
    let mut specs: Vec<String> = Vec::new();
    for piece in s.split(',').map(str::trim) {
        let continues_version = piece.starts_with(['<', '>', '=', '!', '~']);
        match specs.last_mut() {
            Some(last) if continues_version => {
                last.push(',');
                last.push_str(piece);
            }
            _ if piece.is_empty() => {
                return Err(format!(
                "{s:?} has an empty spec: give requirements separated by commas, as numpy,pandas"
            ))
            }
            _ => specs.push(piece.to_owned()),
        }
    }
    Ok(specs)
}

pub(crate) fn parse_file(s: &str) -> Result<(String, RunFile), String> {
    if let Some(rest) = s.strip_prefix('@') {
        let (id, name) = rest.split_once('=').ok_or_else(|| {
            format!("{s:?}: a stored file needs its name in the run, as @ARTIFACT_ID=NAME")
        })?;
        return Ok((name.to_owned(), RunFile::Artifact(id.to_owned())));
    }
    let (path, name) = match s.rsplit_once('=') {
        Some((path, name)) if !name.is_empty() && !name.contains('/') => {
            (PathBuf::from(path), name.to_owned())
        }
        _ => {
            let path = PathBuf::from(s);
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .ok_or_else(|| format!("{s:?} has no file name; give one as PATH=NAME"))?;
            (path, name)
        }
    };
    Ok((name, RunFile::Path(path)))
}

#[derive(Debug, Clone)]
pub(crate) enum Input {
    Json(Value),
    Artifact(String),
}

pub(crate) fn parse_input(s: &str) -> Result<(String, Input), String> {
    let (name, json) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=JSON (for example --input n=42)"))?;
    // The name itself is checked by the engine (one identifier check for every caller).
    if let Some(id) = json.strip_prefix('@') {
        if id.is_empty() {
            return Err(format!("{name}=@ needs an artifact id after the @"));
        }
        return Ok((name.to_owned(), Input::Artifact(id.to_owned())));
    }
    let value = serde_json::from_str(json).map_err(|e| {
        format!("the value of {name} is not JSON ({e}); quote strings, e.g. {name}='\"text\"'")
    })?;
    Ok((name.to_owned(), Input::Json(value)))
}

pub(crate) fn parse_env(s: &str) -> Result<(String, String), String> {
    let (name, value) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=VALUE (for example --env API_TOKEN=abc)"))?;
    if name.is_empty() {
        return Err(format!("{s:?} has no variable name before the ="));
    }
    Ok((name.to_owned(), value.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warm_environment_is_split_at_commas_but_not_inside_a_version() {
        assert_eq!(
            parse_warm("numpy, pandas>=2,<3,matplotlib==3.11.2").unwrap(),
            ["numpy", "pandas>=2,<3", "matplotlib==3.11.2"]
        );
        assert!(parse_warm("numpy,,pandas")
            .unwrap_err()
            .contains("empty spec"));
    }
}
