//! Is a module part of CPython's standard library, for a given minor version?

/// True when `module` (a top-level name such as `json`, or a dotted one, of which the first component
/// counts) ships with CPython `version`. Modules that left the standard library (`distutils` in 3.12,
/// `imp`, `asynchat`) are third-party for the versions after they left.
pub(crate) fn is_stdlib_module(version: (u32, u32, u32), module: &str) -> bool {
    let top = module.split('.').next().unwrap_or_default();
    let minor = u8::try_from(version.1).unwrap_or(u8::MAX);
    // Ruff's table leaves out `__future__`, which it treats as syntax.
    top == "__future__" || ruff_python_stdlib::sys::is_known_standard_library(minor, top)
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;
    use crate::Interpreter;

    #[test]
    fn agrees_with_the_local_interpreters_stdlib_module_names() {
        let python = Interpreter::discover(None).expect("this machine has Python 3");
        let out = Command::new(&python.executable)
            .args([
                "-I",
                "-S",
                "-c",
                "import sys; print('\\n'.join(sorted(sys.stdlib_module_names)))",
            ])
            .output()
            .unwrap();
        assert!(out.status.success());
        let names = String::from_utf8(out.stdout).unwrap();
        let missing: Vec<&str> = names
            .lines()
            .filter(|name| !is_stdlib_module(python.version, name))
            .collect();
        assert!(
            missing.is_empty(),
            "Python {:?} says these are stdlib, the table does not: {missing:?}",
            python.version
        );
        for third_party in ["numpy", "yaml", "requests", "six", "PIL"] {
            assert!(
                !is_stdlib_module(python.version, third_party),
                "{third_party}"
            );
        }
    }

    #[test]
    fn version_matters_for_removed_modules() {
        assert!(is_stdlib_module((3, 11, 0), "distutils"));
        assert!(!is_stdlib_module((3, 12, 0), "distutils"));
        assert!(is_stdlib_module((3, 12, 0), "os.path"));
        assert!(is_stdlib_module((3, 11, 4), "tomllib"));
        assert!(!is_stdlib_module((3, 10, 4), "tomllib"));
    }
}
