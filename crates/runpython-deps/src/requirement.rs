//! Requirement specs (PEP 508), parsed just enough to dedupe and to pass safely to an installer.

use std::fmt;

use crate::Error;

/// PEP 503 normalization of a distribution name: runs of `-`, `_`, `.` become one `-`, lowercase.
pub(crate) fn normalize_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_separator = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !in_separator {
                out.push('-');
            }
            in_separator = true;
        } else {
            out.extend(c.to_lowercase());
            in_separator = false;
        }
    }
    out
}

/// Who asked for a requirement. It decides what an install may do: only the operator's
/// requirements may be built from source (their build scripts run, sandboxed), and only the
/// operator's escape an allowlist of packages.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Source {
    /// The operator configured it (the builder's `dependency`, `--dep`, the Python package's
    /// `dependencies=`).
    Operator,
    /// It came with the run (`RunRequest::dependency`, MCP's `dependencies`, a nested run's, a
    /// session's earlier cells).
    Request,
    /// The code's PEP 723 `# /// script` block.
    Script,
    /// The code imports this module, and the distribution has its name.
    Import(String),
    /// The code imports this module, and the mapping table names its distribution (`yaml` → `pyyaml`).
    Mapped(String),
}

impl Source {
    /// Whether the operator asked for it.
    pub fn is_operator(&self) -> bool {
        matches!(self, Self::Operator)
    }

    /// A short name for reports: `operator`, `request`, `pep723`, `import`, `mapping`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Operator => "operator",
            Self::Request => "request",
            Self::Script => "pep723",
            Self::Import(_) => "import",
            Self::Mapped(_) => "mapping",
        }
    }

    /// The imported module, for [`Source::Import`] and [`Source::Mapped`].
    pub fn module(&self) -> Option<&str> {
        match self {
            Self::Import(m) | Self::Mapped(m) => Some(m),
            _ => None,
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Operator => f.write_str("the operator's dependencies"),
            Self::Request => f.write_str("the run's dependencies"),
            Self::Script => f.write_str("the code's `# /// script` block"),
            Self::Import(m) => write!(f, "the code's `import {m}`"),
            Self::Mapped(m) => write!(f, "the code's `import {m}`, through the mapping table"),
        }
    }
}

/// One requirement: `six`, `six==1.15.0`, `pkg[extra]>=2,<3`, `pkg @ file:///wheels/pkg.whl`,
/// optionally followed by `; marker`. Names and extras are PEP 503 normalized; [`fmt::Display`] writes
/// the canonical form handed to installers. It carries who asked for it ([`Requirement::source`]),
/// which is not part of what it is: two requirements with the same spec are equal whoever asked.
#[derive(Debug, Clone)]
pub struct Requirement {
    name: String,
    extras: Vec<String>,
    version: String,
    url: Option<String>,
    marker: Option<String>,
    source: Source,
}

impl Requirement {
    fn spec(&self) -> (&str, &[String], &str, Option<&str>, Option<&str>) {
        (
            &self.name,
            &self.extras,
            &self.version,
            self.url.as_deref(),
            self.marker.as_deref(),
        )
    }
}

impl PartialEq for Requirement {
    fn eq(&self, other: &Self) -> bool {
        self.spec() == other.spec()
    }
}

impl Eq for Requirement {}

impl std::hash::Hash for Requirement {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.spec().hash(state);
    }
}

impl PartialOrd for Requirement {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Requirement {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.spec().cmp(&other.spec())
    }
}

impl Requirement {
    /// Parses a spec (asked for by the operator: see [`Requirement::with_source`]). Refuses anything that is not a requirement, notably text that an installer would
    /// read as an option (`--index-url …`, `-r file`).
    pub fn parse(spec: &str) -> Result<Self, Error> {
        parse(spec).map_err(|reason| Error::InvalidRequirement {
            spec: spec.to_owned(),
            reason,
        })
    }

    /// A requirement on `name` with no extras, version or URL (what detection yields).
    pub(crate) fn bare(name: &str, source: Source) -> Self {
        Self {
            name: normalize_name(name),
            extras: Vec::new(),
            version: String::new(),
            url: None,
            marker: None,
            source,
        }
    }

    /// Who asked for it ([`Source::Operator`] unless [`Requirement::with_source`] said otherwise).
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// The same requirement, asked for by `source`.
    #[must_use]
    pub fn with_source(mut self, source: Source) -> Self {
        self.source = source;
        self
    }

    /// The normalized base name (`pyyaml` for `PyYAML>=6`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Normalized extras, sorted.
    pub fn extras(&self) -> &[String] {
        &self.extras
    }

    /// The version specifier without spaces (`==1.15.0`, `>=2,<3`), empty when there is none.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The URL of a `name @ URL` requirement.
    pub fn url(&self) -> Option<&str> {
        self.url.as_deref()
    }

    /// The environment marker after `;`.
    pub fn marker(&self) -> Option<&str> {
        self.marker.as_deref()
    }

    /// Just a name: no extras, version, URL or marker. A bare requirement never shadows another.
    pub fn is_bare(&self) -> bool {
        self.extras.is_empty()
            && self.version.is_empty()
            && self.url.is_none()
            && self.marker.is_none()
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if !self.extras.is_empty() {
            write!(f, "[{}]", self.extras.join(","))?;
        }
        match &self.url {
            Some(url) => write!(f, " @ {url}")?,
            None => f.write_str(&self.version)?,
        }
        if let Some(marker) = &self.marker {
            write!(f, " ; {marker}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Requirement {
    type Err = Error;

    fn from_str(spec: &str) -> Result<Self, Error> {
        Self::parse(spec)
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// Splits a valid PEP 508 name off the front of `text`.
fn take_name(text: &str) -> Result<(&str, &str), String> {
    let end = text.find(|c| !is_name_char(c)).unwrap_or(text.len());
    let name = &text[..end];
    let valid = name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !valid {
        return Err(
            "it must start with a distribution name (letters, digits, `-`, `_`, `.`, beginning and ending with a letter or digit)"
                .into(),
        );
    }
    Ok((name, &text[end..]))
}

fn parse(spec: &str) -> Result<Requirement, String> {
    if spec.contains(['\n', '\r', '\0']) {
        return Err("it spans more than one line; pass one requirement per spec".into());
    }
    let text = spec.trim();
    if text.is_empty() {
        return Err("it is empty".into());
    }
    let (name, rest) = take_name(text)?;
    let mut rest = rest.trim_start();

    let mut extras = Vec::new();
    if let Some(after) = rest.strip_prefix('[') {
        let close = after
            .find(']')
            .ok_or("its extras list `[` is not closed by `]`")?;
        for extra in after[..close].split(',').map(str::trim) {
            if extra.is_empty() {
                continue;
            }
            let (extra_name, trailing) =
                take_name(extra).map_err(|_| format!("bad extra `{extra}`"))?;
            if !trailing.is_empty() {
                return Err(format!("bad extra `{extra}`"));
            }
            extras.push(normalize_name(extra_name));
        }
        extras.sort();
        extras.dedup();
        rest = after[close + 1..].trim_start();
    }

    let (body, marker) = match rest.split_once(';') {
        Some((body, marker)) => {
            let marker = marker.trim();
            if marker.is_empty() {
                return Err("it has an empty marker after `;`".into());
            }
            (body.trim(), Some(marker.to_owned()))
        }
        None => (rest.trim(), None),
    };

    let (version, url) = if let Some(url) = body.strip_prefix('@') {
        let url = url.trim();
        if url.is_empty() || url.contains(char::is_whitespace) || !url.contains(':') {
            return Err(format!(
                "`{url}` is not a URL (expected `name @ scheme://…`)"
            ));
        }
        (String::new(), Some(url.to_owned()))
    } else {
        (parse_version_spec(body)?, None)
    };

    Ok(Requirement {
        name: normalize_name(name),
        extras,
        version,
        url,
        marker,
        source: Source::Operator,
    })
}

/// `==1.0`, `>= 2, < 3`, `(>=1)`, `~=1.4` → the clauses joined by `,` without spaces.
fn parse_version_spec(body: &str) -> Result<String, String> {
    let body = body
        .strip_prefix('(')
        .and_then(|b| b.strip_suffix(')'))
        .unwrap_or(body)
        .trim();
    if body.is_empty() {
        return Ok(String::new());
    }
    let mut clauses = Vec::new();
    for clause in body.split(',').map(str::trim) {
        let operator_len = clause
            .find(|c: char| !matches!(c, '<' | '>' | '=' | '!' | '~'))
            .unwrap_or(clause.len());
        let (operator, version) = clause.split_at(operator_len);
        let version = version.trim();
        let known = ["==", "!=", "<=", ">=", "<", ">", "~=", "==="].contains(&operator);
        let version_ok = !version.is_empty()
            && version.chars().all(|c| {
                c.is_ascii_alphanumeric() || matches!(c, '.' | '*' | '+' | '!' | '-' | '_')
            });
        if !known || !version_ok {
            return Err(format!(
                "`{clause}` is not a version clause (expected e.g. `==1.2`, `>=2,<3`, `~=1.4`)"
            ));
        }
        clauses.push(format!("{operator}{version}"));
    }
    Ok(clauses.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(spec: &str) -> Requirement {
        Requirement::parse(spec).unwrap()
    }

    #[test]
    fn normalization_follows_pep_503() {
        assert_eq!(normalize_name("Friendly-Bard"), "friendly-bard");
        assert_eq!(normalize_name("FRIENDLY_BARD"), "friendly-bard");
        assert_eq!(normalize_name("friendly.bard"), "friendly-bard");
        assert_eq!(normalize_name("friendly--._bard"), "friendly-bard");
        assert_eq!(normalize_name("PyYAML"), "pyyaml");
    }

    #[test]
    fn names_extras_versions_urls_and_markers_are_parsed() {
        let r = req("PyYAML");
        assert_eq!((r.name(), r.is_bare()), ("pyyaml", true));
        assert_eq!(r.to_string(), "pyyaml");

        let r = req("six==1.15.0");
        assert_eq!(
            (r.name(), r.version(), r.is_bare()),
            ("six", "==1.15.0", false)
        );

        let r = req(" Pkg_Name [Extra_B, extra-a] >= 2 , < 3 ; python_version >= '3.8' ");
        assert_eq!(r.name(), "pkg-name");
        assert_eq!(r.extras(), ["extra-a", "extra-b"]);
        assert_eq!(r.version(), ">=2,<3");
        assert_eq!(r.marker(), Some("python_version >= '3.8'"));
        assert_eq!(
            r.to_string(),
            "pkg-name[extra-a,extra-b]>=2,<3 ; python_version >= '3.8'"
        );

        let r = req("pkg @ file:///wheels/pkg-1.0-py3-none-any.whl");
        assert_eq!(r.url(), Some("file:///wheels/pkg-1.0-py3-none-any.whl"));
        assert_eq!(
            r.to_string(),
            "pkg @ file:///wheels/pkg-1.0-py3-none-any.whl"
        );

        assert_eq!(req("requests (>=2.0)").version(), ">=2.0");
        assert_eq!(req("pkg[x]").extras(), ["x"]);
        assert_eq!(req("numpy~=1.26.0").to_string(), "numpy~=1.26.0");
    }

    #[test]
    fn installer_options_and_junk_are_refused_with_the_reason() {
        for spec in [
            "",
            "   ",
            "--index-url=https://evil.example/simple",
            "-r requirements.txt",
            "-e .",
            "pkg==",
            "pkg >> 2",
            "pkg[unclosed",
            "pkg @ ",
            "pkg @ not a url",
            "pkg\n--extra-index-url x",
            "pkg;",
            "_private",
        ] {
            let err = Requirement::parse(spec).unwrap_err();
            assert!(
                matches!(err, Error::InvalidRequirement { .. }),
                "{spec:?}: {err}"
            );
            assert!(err.to_string().contains(&format!("{spec:?}")), "{err}");
        }
    }
}
