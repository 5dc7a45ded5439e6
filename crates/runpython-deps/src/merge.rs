//! Merging the requirement sources of one run into one deduplicated list.

use std::collections::BTreeMap;

use crate::mapping::{alternatives_for_import, distribution_for_import};
use crate::requirement::normalize_name;
use crate::requirement::{Requirement, Source};
use crate::script::read_script_metadata;
use crate::stdlib::is_stdlib_module;
use crate::Error;

/// Everything that can ask for a dependency in one run, in merge order. Explicit specs (`defaults`,
/// `explicit` and the script's PEP 723 block) are equals: the same base name with two different
/// non-bare specs is a [`Error::ConflictingRequirements`]. A bare name (`six`, or a detected import)
/// never shadows a pinned, URL or extras spec of the same base name.
#[derive(Debug, Clone, Copy)]
pub struct DependencySources<'a> {
    /// Specs configured once (the builder's defaults).
    pub defaults: &'a [String],
    /// Specs passed with this run.
    pub explicit: &'a [String],
    /// The code, read for a PEP 723 `# /// script` block; `None` to ignore such a block.
    pub script: Option<&'a str>,
    /// Import names from [`crate::detect_imports`]; empty when auto-detection is off.
    pub detected: &'a [String],
    /// Modules that are files of the run (its directory and inputs), not dependencies: `helpers` for a
    /// `helpers.py` beside the code, and the runtime's own modules.
    pub local_modules: &'a [String],
    /// The target interpreter's version, for the standard-library filter.
    pub python_version: (u32, u32, u32),
}

/// Merges `sources` into requirements sorted by base name, one per base name, each with its
/// [`Source`]: `defaults` are the operator's, `explicit` the run's.
pub fn merge_requirements(sources: &DependencySources<'_>) -> Result<Vec<Requirement>, Error> {
    let mut merged: Merged = BTreeMap::new();
    for spec in sources.defaults {
        add(
            &mut merged,
            Requirement::parse(spec)?.with_source(Source::Operator),
            "default dependencies",
        )?;
    }
    for spec in sources.explicit {
        add(
            &mut merged,
            Requirement::parse(spec)?.with_source(Source::Request),
            "explicit dependencies",
        )?;
    }
    if let Some(meta) = sources
        .script
        .map(read_script_metadata)
        .transpose()?
        .flatten()
    {
        for spec in &meta.dependencies {
            add(
                &mut merged,
                Requirement::parse(spec)?.with_source(Source::Script),
                "the script's `# /// script` block",
            )?;
        }
    }

    let local: Vec<&str> = sources
        .local_modules
        .iter()
        .map(|m| m.split('.').next().unwrap_or_default())
        .collect();
    let explicit_names: Vec<String> = merged.keys().cloned().collect();
    for module in sources.detected {
        let top = module.split('.').next().unwrap_or_default();
        if top.is_empty() || local.contains(&top) || is_stdlib_module(sources.python_version, top) {
            continue;
        }
        let Some(distribution) = distribution_for_import(module) else {
            continue;
        };
        let satisfied = alternatives_for_import(module)
            .iter()
            .any(|alt| explicit_names.iter().any(|name| name == alt));
        if !satisfied {
            let source = if normalize_name(&distribution) == normalize_name(top) {
                Source::Import(module.clone())
            } else {
                Source::Mapped(module.clone())
            };
            add(
                &mut merged,
                Requirement::bare(&distribution, source),
                "detected import",
            )?;
        }
    }
    Ok(merged.into_values().map(|(r, _)| r).collect())
}

type Merged = BTreeMap<String, (Requirement, &'static str)>;

/// Adds `requirement` under its base name: a bare one never shadows, a non-bare one replaces a bare
/// one, two different non-bare ones conflict.
fn add(merged: &mut Merged, requirement: Requirement, origin: &'static str) -> Result<(), Error> {
    let Some((existing, existing_origin)) = merged.get(requirement.name()) else {
        merged.insert(requirement.name().to_owned(), (requirement, origin));
        return Ok(());
    };
    if requirement.is_bare() || *existing == requirement {
        return Ok(());
    }
    if existing.is_bare() {
        merged.insert(requirement.name().to_owned(), (requirement, origin));
        return Ok(());
    }
    Err(Error::ConflictingRequirements {
        first: format!("{existing} ({existing_origin})"),
        second: format!("{requirement} ({origin})"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    fn merged(
        defaults: &[&str],
        explicit: &[&str],
        script: &str,
        detected: &[&str],
    ) -> Result<Vec<String>, Error> {
        let (defaults, explicit, detected) =
            (strings(defaults), strings(explicit), strings(detected));
        let local = strings(&["helpers", "runpython_tools"]);
        merge_requirements(&DependencySources {
            defaults: &defaults,
            explicit: &explicit,
            script: Some(script),
            detected: &detected,
            local_modules: &local,
            python_version: (3, 12, 0),
        })
        .map(|reqs| reqs.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn a_pinned_spec_is_never_shadowed_by_a_bare_detected_name() {
        let out = merged(&[], &["six==1.15.0"], "", &["six"]).unwrap();
        assert_eq!(out, ["six==1.15.0"]);
        let out = merged(
            &["Six"],
            &[],
            "# /// script\n# dependencies = ['six==1.15.0']\n# ///\n",
            &["six"],
        )
        .unwrap();
        assert_eq!(out, ["six==1.15.0"]);
        let out = merged(
            &[],
            &["pkg @ file:///w/pkg.whl", "extra-pkg[fast]>=2"],
            "",
            &["pkg", "extra_pkg"],
        )
        .unwrap();
        assert_eq!(out, ["extra-pkg[fast]>=2", "pkg @ file:///w/pkg.whl"]);
    }

    #[test]
    fn detected_imports_are_filtered_mapped_and_deduped() {
        let detected = [
            "os",
            "json",
            "yaml",
            "PIL",
            "helpers",
            "runpython_tools",
            "google",
            "google.protobuf",
            "distutils",
        ];
        let out = merged(&[], &["PyYAML>=6"], "", &detected).unwrap();
        // distutils left the stdlib in 3.12: setuptools provides it there.
        assert_eq!(out, ["pillow", "protobuf", "pyyaml>=6", "setuptools"]);
    }

    #[test]
    fn an_explicit_alternative_distribution_satisfies_the_import() {
        let out = merged(&[], &["opencv-python-headless"], "", &["cv2"]).unwrap();
        assert_eq!(out, ["opencv-python-headless"]);
        let out = merged(&[], &[], "", &["cv2"]).unwrap();
        assert_eq!(out, ["opencv-python"]);
    }

    #[test]
    fn two_different_explicit_specs_for_one_name_are_an_error_naming_both() {
        let script = "# /// script\n# dependencies = ['six==1.16.0']\n# ///\n";
        let err = merged(&[], &["six==1.15.0"], script, &[]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("six==1.15.0 (explicit dependencies)"),
            "{text}"
        );
        assert!(
            text.contains("six==1.16.0 (the script's `# /// script` block)"),
            "{text}"
        );
        // The same spec twice, however written, is not a conflict.
        assert_eq!(
            merged(&["six == 1.15.0"], &["Six==1.15.0"], "", &[]).unwrap(),
            ["six==1.15.0"]
        );
    }

    #[test]
    fn invalid_specs_in_any_source_are_reported() {
        assert!(matches!(
            merged(&[], &["--index-url=x"], "", &[]),
            Err(Error::InvalidRequirement { .. })
        ));
        let script = "# /// script\n# dependencies = ['-r reqs.txt']\n# ///\n";
        assert!(matches!(
            merged(&[], &[], script, &[]),
            Err(Error::InvalidRequirement { .. })
        ));
    }
}
