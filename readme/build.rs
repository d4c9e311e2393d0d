//! Extracts README's programs into `$OUT_DIR`, for the binaries to include:
//! the first Rust block under "## Quick start" as `quickstart.rs`, and the
//! first under "## With axum" as `axum.rs`. Lines rustdoc hides (`# …`) are
//! kept, as rustdoc compiles them.

use std::path::Path;
use std::{env, fs};

/// README's heading of each program, and the file it is written to.
const PROGRAMS: [(&str, &str); 2] = [
    ("## Quick start", "quickstart.rs"),
    ("## With axum", "axum.rs"),
];

fn main() {
    let readme_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    println!("cargo::rerun-if-changed={}", readme_path.display());
    let readme = fs::read_to_string(&readme_path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", readme_path.display()));
    let out_dir = env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    for (heading, file) in PROGRAMS {
        let program = rust_block_under(&readme, heading).unwrap_or_else(|| {
            panic!("README.md has no ```rust block under a heading `{heading}`")
        });
        fs::write(Path::new(&out_dir).join(file), program).expect("write to OUT_DIR");
    }
}

/// The first Rust code block after the line `heading` and before the next
/// heading of the same or a higher level, as rustdoc compiles it.
fn rust_block_under(readme: &str, heading: &str) -> Option<String> {
    let level = heading.split(' ').next().unwrap_or("##");
    let mut lines = readme
        .lines()
        .skip_while(|line| line.trim_end() != heading)
        .skip(1);
    loop {
        let line = lines.next()?;
        if is_heading_at_most(line, level) {
            return None;
        }
        if let Some(info) = line.strip_prefix("```")
            && is_rust(info)
        {
            break;
        }
    }
    let mut program = String::new();
    for line in lines {
        if line.starts_with("```") {
            return Some(program);
        }
        program.push_str(unhide(line));
        program.push('\n');
    }
    None
}

/// Whether a fence's info string (`rust`, `rust,no_run`, empty) marks Rust, as
/// rustdoc reads it.
fn is_rust(info: &str) -> bool {
    let words: Vec<&str> = info.split(',').map(str::trim).collect();
    words.iter().all(|w| {
        matches!(
            *w,
            "" | "rust" | "no_run" | "should_panic" | "edition2021" | "edition2024"
        )
    })
}

/// Whether `line` is a Markdown heading of `level` (`##`) or a higher one.
fn is_heading_at_most(line: &str, level: &str) -> bool {
    let hashes = line.chars().take_while(|c| *c == '#').count();
    hashes > 0 && hashes <= level.len() && line[hashes..].starts_with(' ')
}

/// A line as rustdoc compiles it: `# x` is `x`, a lone `#` is empty, `##x` is `#x`.
fn unhide(line: &str) -> &str {
    let trimmed = line.trim_start();
    let indent = line.len() - trimmed.len();
    if trimmed == "#" {
        ""
    } else if let Some(rest) = trimmed.strip_prefix("# ") {
        rest
    } else if trimmed.starts_with("##") {
        &line[indent + 1..]
    } else {
        line
    }
}
