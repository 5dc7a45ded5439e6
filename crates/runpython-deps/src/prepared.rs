//! A prepared environment as the engine holds it ([`PreparedEnv`]): where it is, what it was made
//! from, what it holds, and what a requirement asks of it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::requirement::normalize_name;
use crate::{Requirement, Source};

/// A ready environment. Hand `interpreter` and `site_dir` to the runner: start the interpreter as
/// usual (`-I -S`) and call `site.addsitedir(site_dir)` before the user's code, so `.pth` files work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedEnv {
    /// The content key: a hash of the interpreter (executable and version), the sorted normalized
    /// specs and the provider kind.
    pub key: String,
    /// The interpreter the packages were installed for.
    pub interpreter: PathBuf,
    /// The directory holding the packages; `None` when there was nothing to install.
    pub site_dir: Option<PathBuf>,
    /// The canonical specs, sorted.
    pub specs: Vec<String>,
    /// A hash of what is really installed (the interpreter and every `*.dist-info` name, so package
    /// versions count): use it in memo keys.
    pub fingerprint: String,
    /// Every distribution installed, with who asked for it (`None`: a dependency of another).
    #[serde(default)]
    pub installed: Vec<Installed>,
    /// True when this call installed it; false when it was prepared before.
    #[serde(skip)]
    pub installed_now: bool,
}

/// One distribution of a prepared environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Installed {
    /// Its name, as its `.dist-info` directory writes it (`PyYAML`).
    pub name: String,
    /// Its version.
    pub version: String,
    /// Who asked for it, when a requirement named it; `None` for what came as a dependency.
    #[serde(skip)]
    pub source: Option<Source>,
}

impl PreparedEnv {
    /// Whether this environment already satisfies `requirement` without installing anything: a bare
    /// name it holds a distribution of, or exactly one of the specs it was prepared from.
    pub fn provides(&self, requirement: &Requirement) -> bool {
        if self
            .specs
            .iter()
            .any(|spec| *spec == requirement.to_string())
        {
            return true;
        }
        requirement.is_bare()
            && self
                .installed
                .iter()
                .any(|d| normalize_name(&d.name) == requirement.name())
    }

    /// The modules a distribution of this environment makes importable at the top level (its
    /// `top_level.txt`, else the first component of the paths its `RECORD` lists), sorted; none for a
    /// distribution it does not hold.
    pub fn top_level_modules(&self, distribution: &str) -> Vec<String> {
        let (Some(site), wanted) = (&self.site_dir, normalize_name(distribution)) else {
            return Vec::new();
        };
        let Some(dist) = self
            .installed
            .iter()
            .find(|d| normalize_name(&d.name) == wanted)
        else {
            return Vec::new();
        };
        let info = site.join(format!("{}-{}.dist-info", dist.name, dist.version));
        let mut modules: Vec<String> = match std::fs::read_to_string(info.join("top_level.txt")) {
            Ok(text) => text.lines().map(str::trim).map(str::to_owned).collect(),
            Err(_) => std::fs::read_to_string(info.join("RECORD"))
                .unwrap_or_default()
                .lines()
                .filter_map(|line| {
                    let path = line.split(',').next()?;
                    let (first, rest) = path.split_once('/').unwrap_or((path, ""));
                    match (first.strip_suffix(".py"), rest.is_empty()) {
                        (Some(module), true) => Some(module.to_owned()),
                        (None, false) => Some(first.to_owned()),
                        _ => None,
                    }
                })
                .collect(),
        };
        modules.retain(|m| {
            !m.is_empty()
                && !m.ends_with(".dist-info")
                && !m.ends_with(".libs")
                && !m.starts_with('_')
                && !m.starts_with("..")
                && m != "__pycache__"
                && m.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
        modules.sort();
        modules.dedup();
        modules
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn env_with(site: &Path, dists: &[(&str, &str, Option<&str>, &str)]) -> PreparedEnv {
        for (name, version, top_level, record) in dists {
            let info = site.join(format!("{name}-{version}.dist-info"));
            std::fs::create_dir_all(&info).unwrap();
            if let Some(top) = top_level {
                std::fs::write(info.join("top_level.txt"), top).unwrap();
            }
            std::fs::write(info.join("RECORD"), record).unwrap();
        }
        PreparedEnv {
            key: "k".into(),
            interpreter: PathBuf::from("/usr/bin/python3"),
            site_dir: Some(site.to_owned()),
            specs: vec!["matplotlib==3.11.2".into(), "pandas".into()],
            fingerprint: String::new(),
            installed: dists
                .iter()
                .map(|(name, version, ..)| Installed {
                    name: (*name).into(),
                    version: (*version).into(),
                    source: None,
                })
                .collect(),
            installed_now: false,
        }
    }

    #[test]
    fn an_environment_provides_what_it_holds_and_the_specs_it_was_made_from() {
        let dir = tempfile::tempdir().unwrap();
        let env = env_with(
            dir.path(),
            &[
                ("matplotlib", "3.11.2", None, "matplotlib/__init__.py,,\nmpl_toolkits/a.py,,\npylab.py,,\nmatplotlib-3.11.2.dist-info/RECORD,,\n"),
                ("python_dateutil", "2.9", Some("dateutil\n"), ""),
                ("pandas", "3.1.1", None, "pandas/__init__.py,,\npandas.libs/x.so,,\n"),
            ],
        );
        let req = |s: &str| Requirement::parse(s).unwrap();
        assert!(env.provides(&req("python-dateutil")));
        assert!(env.provides(&req("Pandas")));
        assert!(env.provides(&req("matplotlib==3.11.2")));
        assert!(!env.provides(&req("matplotlib==3.10")));
        assert!(!env.provides(&req("requests")));
        assert_eq!(
            env.top_level_modules("matplotlib"),
            ["matplotlib", "mpl_toolkits", "pylab"]
        );
        assert_eq!(env.top_level_modules("python-dateutil"), ["dateutil"]);
        assert_eq!(env.top_level_modules("pandas"), ["pandas"]);
        assert!(env.top_level_modules("numpy").is_empty());
    }
}
