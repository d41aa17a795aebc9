//! The layer check of `cargo xtask lint`: `shared/src/lib.rs` lists the
//! library's modules top-down, and each may use only the ones above it
//! (docs/ARCHITECTURE.md has the same list). Every `crate::<module>` path
//! in a module's files, tests included, must name a module listed above it;
//! modules the list leaves out (`test_rng`, `fuzz_entry`) may be used by any.

use std::path::Path;

/// The modules of the bullets `//! * \`a\`, \`b\`: ...` of lib.rs, in order.
fn layer_order(lib_rs: &str) -> Vec<String> {
    let mut order = Vec::new();
    for line in lib_rs.lines() {
        let Some(bullet) = line.strip_prefix("//! * ") else { continue };
        let names = bullet.split(':').next().unwrap_or("");
        order.extend(names.split(',').filter_map(|n| n.trim().strip_prefix('`')?.strip_suffix('`')).map(String::from));
    }
    order
}

/// The module names of the `crate::name` paths in `source`, outside comments.
fn crate_paths(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in source.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            out.push(name);
        }
    }
    out
}

fn rust_files(path: &Path, out: &mut Vec<std::path::PathBuf>) {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path).into_iter().flatten().flatten().map(|e| e.path()).collect();
        entries.sort();
        for e in entries {
            rust_files(&e, out);
        }
    } else if path.is_file() && path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_path_buf());
    }
}

/// Checks `src` (shared/src): one line per use of a module at or below the user's layer.
pub fn check(src: &Path) -> Result<(), String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).map_err(|e| format!("{}: {e}", src.display()))?;
    let order = layer_order(&lib);
    if order.is_empty() {
        return Err("shared/src/lib.rs lists no layers (`//! * `module`: ...`)".into());
    }
    let mut problems = Vec::new();
    for (rank, module) in order.iter().enumerate() {
        let mut files = Vec::new();
        rust_files(&src.join(module), &mut files);
        rust_files(&src.join(format!("{module}.rs")), &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
            for used in crate_paths(&text) {
                if let Some(at) = order.iter().position(|m| *m == used) {
                    if at > rank {
                        problems.push(format!("{}: uses crate::{used}, a layer below {module}", f.display()));
                    }
                }
            }
        }
    }
    problems.dedup();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("layers (shared/src/lib.rs's order, docs/ARCHITECTURE.md):\n{}", problems.join("\n")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_order_and_the_paths() {
        let lib = "//! intro\n//! * `quant`: blocks;\n//! * `sampler`, `generate`: picking\n//!   more\nmod x;";
        assert_eq!(layer_order(lib), ["quant", "sampler", "generate"]);
        let src = "use crate::model::{A, B};\n// crate::app in a comment\nlet x = crate::quant::QK; // crate::app";
        assert_eq!(crate_paths(src), ["model", "quant"]);
    }

    /// The tree as it is passes.
    #[test]
    fn the_tree_keeps_its_layers() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/src");
        check(&src).unwrap();
    }

    /// A module that uses one listed below it fails, naming the file.
    #[test]
    fn a_use_downwards_fails() {
        let dir = std::env::temp_dir().join(format!("xtask-layers-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("b")).unwrap();
        std::fs::write(dir.join("lib.rs"), "//! * `a`: top\n//! * `b`: below\n").unwrap();
        std::fs::write(dir.join("a.rs"), "use crate::b::X;\n").unwrap();
        std::fs::write(dir.join("b/mod.rs"), "use crate::a::Y; // up: fine\n").unwrap();
        let e = check(&dir).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(e.contains("a.rs: uses crate::b, a layer below a") && !e.contains("mod.rs"), "{e}");
    }
}
