//! `cargo xtask api [--bless]`: each library's public API, one item per
//! line, compared with the snapshot checked in under `api/`, so a change
//! to what a crate exposes shows up in review as a diff of that file.
//!
//! The listing comes from rustdoc's JSON output. That output is unstable on
//! a stable toolchain, so rustdoc is run with `RUSTC_BOOTSTRAP=1`, for this
//! one command (cargo-public-api, which reads the same output, needs a
//! nightly toolchain this machine does not have). Items are listed with
//! their kind and path; functions and methods with their signatures,
//! structs with their public fields, enums with their variants, traits with
//! their methods.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{cargo, section};

/// The libraries whose API is held to a snapshot.
const LIBRARIES: [&str; 13] = [
    "spool-wire",
    "spool-journal",
    "spool-journal-pg",
    "spool-runtime",
    "spool-edge",
    "spool-http",
    "spool-engines",
    "spool-rpc",
    "spool-pod",
    "spool-bus",
    "spool-mcp",
    "spool-a2a",
    "spool-otel",
];

pub(crate) fn run(root: &Path, bless: bool) -> Result<()> {
    section("api: the public API of each library against api/*.txt");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), std::path::PathBuf::from);
    // A target directory of its own: rustdoc's JSON run must not replace
    // the HTML docs of `cargo doc`.
    let doc_target = target.join("api");
    let mut changed = Vec::new();
    for library in LIBRARIES {
        let status = cargo()
            .args(["rustdoc", "--locked", "-q", "--lib", "-p", library])
            .arg("--target-dir")
            .arg(&doc_target)
            .args(["--", "-Z", "unstable-options", "--output-format", "json"])
            .env("RUSTC_BOOTSTRAP", "1")
            .current_dir(root)
            .status()
            .with_context(|| format!("starting rustdoc for {library}"))?;
        if !status.success() {
            bail!("rustdoc failed for {library} ({status})");
        }
        let file = doc_target
            .join("doc")
            .join(format!("{}.json", library.replace('-', "_")));
        let json: Value = serde_json::from_slice(
            &std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?,
        )?;
        let listing = listing(&json)?;
        let snapshot = root.join("api").join(format!("{library}.txt"));
        let current = std::fs::read_to_string(&snapshot).unwrap_or_default();
        if current != listing {
            if bless {
                std::fs::create_dir_all(root.join("api"))?;
                std::fs::write(&snapshot, &listing)?;
                crate::say(&format!("api: wrote {}", snapshot.display()));
            } else {
                changed.push((library, diff(&current, &listing)));
            }
        }
    }
    if !changed.is_empty() {
        let mut report = String::new();
        for (library, diff) in &changed {
            let _ = writeln!(report, "{library}:\n{diff}");
        }
        bail!(
            "the public API changed:\n{report}if that is meant, run `cargo xtask api --bless` and commit api/"
        );
    }
    Ok(())
}

/// The lines only in `old` (`-`) and only in `new` (`+`).
fn diff(old: &str, new: &str) -> String {
    let old: std::collections::BTreeSet<&str> = old.lines().collect();
    let new: std::collections::BTreeSet<&str> = new.lines().collect();
    let mut out = String::new();
    for line in old.difference(&new) {
        let _ = writeln!(out, "  - {line}");
    }
    for line in new.difference(&old) {
        let _ = writeln!(out, "  + {line}");
    }
    out
}

/// Every public item reachable from the crate root, sorted, one per line.
fn listing(json: &Value) -> Result<String> {
    let index = json["index"]
        .as_object()
        .context("rustdoc JSON has no index")?;
    let root = json["root"].to_string();
    let mut lines = Vec::new();
    let mut seen = std::collections::HashSet::new();
    walk(index, &root, None, &[], &mut lines, &mut seen);
    lines.sort();
    lines.dedup();
    Ok(lines.into_iter().map(|l| l + "\n").collect())
}

type Index = serde_json::Map<String, Value>;

/// Lists item `id` under `path`, named `alias` when a re-export renames it.
fn walk(
    index: &Index,
    id: &str,
    alias: Option<&str>,
    path: &[String],
    lines: &mut Vec<String>,
    seen: &mut std::collections::HashSet<(String, Vec<String>)>,
) {
    let Some(item) = index.get(id) else {
        return;
    };
    let name = alias
        .or_else(|| item["name"].as_str())
        .unwrap_or_default()
        .to_owned();
    // An item re-exported under several paths is listed under each, once.
    let mut at = path.to_vec();
    at.push(name.clone());
    if !seen.insert((id.to_owned(), at)) {
        return;
    }
    let Some((kind, inner)) = item["inner"].as_object().and_then(|o| o.iter().next()) else {
        return;
    };
    let here = |name: &str| {
        let mut p = path.to_vec();
        p.push(name.to_owned());
        p.join("::")
    };
    match kind.as_str() {
        "module" => {
            let mut inside = path.to_vec();
            inside.push(name);
            for child in inner["items"].as_array().into_iter().flatten() {
                walk(index, &child.to_string(), None, &inside, lines, seen);
            }
        }
        "use" => {
            let alias = inner["name"].as_str().unwrap_or_default();
            match inner["id"]
                .as_u64()
                .map(|i| i.to_string())
                .filter(|i| index.contains_key(i))
            {
                Some(target) if inner["is_glob"].as_bool() == Some(true) => {
                    if let Some(items) = index[&target]["inner"]["module"]["items"].as_array() {
                        for child in items {
                            walk(index, &child.to_string(), None, path, lines, seen);
                        }
                    }
                }
                Some(target) => walk(index, &target, Some(alias), path, lines, seen),
                // From another crate: listed as the re-export it is.
                None => lines.push(format!(
                    "pub use {} = {}",
                    here(alias),
                    inner["source"].as_str().unwrap_or_default()
                )),
            }
        }
        "function" => lines.push(format!("fn {}{}", here(&name), signature(&inner["sig"]))),
        "struct" => {
            lines.push(format!("struct {}", here(&name)));
            let fields = inner["kind"]["plain"]["fields"]
                .as_array()
                .or_else(|| inner["kind"]["tuple"].as_array());
            for field in fields.into_iter().flatten() {
                if let Some(field) = index.get(&field.to_string()) {
                    lines.push(format!(
                        "struct field {}::{}: {}",
                        here(&name),
                        field["name"].as_str().unwrap_or_default(),
                        ty(&field["inner"]["struct_field"])
                    ));
                }
            }
            methods(index, inner, &here(&name), lines);
        }
        "enum" => {
            lines.push(format!(
                "enum {}{}",
                here(&name),
                if item["attrs"].to_string().contains("non_exhaustive") {
                    " (non_exhaustive)"
                } else {
                    ""
                }
            ));
            for variant in inner["variants"].as_array().into_iter().flatten() {
                if let Some(variant) = index.get(&variant.to_string()) {
                    lines.push(format!(
                        "enum variant {}::{}",
                        here(&name),
                        variant["name"].as_str().unwrap_or_default()
                    ));
                }
            }
            methods(index, inner, &here(&name), lines);
        }
        "trait" => {
            lines.push(format!("trait {}", here(&name)));
            for member in inner["items"].as_array().into_iter().flatten() {
                if let Some(member) = index.get(&member.to_string()) {
                    let member_name = member["name"].as_str().unwrap_or_default();
                    if let Some(sig) = member["inner"].get("function") {
                        lines.push(format!(
                            "trait fn {}::{member_name}{}",
                            here(&name),
                            signature(&sig["sig"])
                        ));
                    }
                }
            }
        }
        "constant" => lines.push(format!("const {}: {}", here(&name), ty(&inner["type"]))),
        "static" => lines.push(format!("static {}: {}", here(&name), ty(&inner["type"]))),
        "type_alias" => lines.push(format!("type {} = {}", here(&name), ty(&inner["type"]))),
        "macro" => lines.push(format!("macro {}!", here(&name))),
        other => lines.push(format!("{other} {}", here(&name))),
    }
}

/// The inherent methods of a struct or enum (trait impls aside: they are
/// the traits' APIs).
fn methods(index: &Index, inner: &Value, owner: &str, lines: &mut Vec<String>) {
    for implementation in inner["impls"].as_array().into_iter().flatten() {
        let Some(implementation) = index.get(&implementation.to_string()) else {
            continue;
        };
        let block = &implementation["inner"]["impl"];
        if !block["trait"].is_null() {
            continue;
        }
        for member in block["items"].as_array().into_iter().flatten() {
            let Some(member) = index.get(&member.to_string()) else {
                continue;
            };
            if member["visibility"] != "public" {
                continue;
            }
            let name = member["name"].as_str().unwrap_or_default();
            if let Some(function) = member["inner"].get("function") {
                lines.push(format!("fn {owner}::{name}{}", signature(&function["sig"])));
            } else if let Some(constant) = member["inner"].get("assoc_const") {
                lines.push(format!("const {owner}::{name}: {}", ty(&constant["type"])));
            }
        }
    }
}

fn signature(sig: &Value) -> String {
    let inputs: Vec<String> = sig["inputs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|input| {
            let name = input[0].as_str().unwrap_or("_");
            if name == "self" {
                ty(&input[1]).replace("Self", "self")
            } else {
                format!("{name}: {}", ty(&input[1]))
            }
        })
        .collect();
    let output = if sig["output"].is_null() {
        String::new()
    } else {
        format!(" -> {}", ty(&sig["output"]))
    };
    format!("({}){output}", inputs.join(", "))
}

/// A type, written about as in source: enough to see a change.
fn ty(written: &Value) -> String {
    let Some((kind, inner)) = written.as_object().and_then(|o| o.iter().next()) else {
        return "_".into();
    };
    match kind.as_str() {
        "primitive" | "generic" => inner.as_str().unwrap_or("_").to_owned(),
        "resolved_path" => {
            let path = inner["path"].as_str().unwrap_or("_");
            let args = &inner["args"]["angle_bracketed"]["args"];
            let args: Vec<String> = args
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| match a.get("type") {
                    Some(t) => ty(t),
                    None => a
                        .get("lifetime")
                        .and_then(Value::as_str)
                        .unwrap_or("_")
                        .to_owned(),
                })
                .collect();
            if args.is_empty() {
                path.to_owned()
            } else {
                format!("{path}<{}>", args.join(", "))
            }
        }
        "borrowed_ref" => format!(
            "&{}{}",
            if inner["is_mutable"] == true {
                "mut "
            } else {
                ""
            },
            ty(&inner["type"])
        ),
        "slice" => format!("[{}]", ty(inner)),
        "array" => format!(
            "[{}; {}]",
            ty(&inner["type"]),
            inner["len"].as_str().unwrap_or("_")
        ),
        "tuple" => format!(
            "({})",
            inner
                .as_array()
                .into_iter()
                .flatten()
                .map(ty)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        "impl_trait" | "dyn_trait" => {
            let bounds = if kind == "dyn_trait" {
                &inner["traits"]
            } else {
                inner
            };
            let names: Vec<String> = bounds
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|b| {
                    b.get("trait_bound")
                        .map(|t| t["trait"]["path"].as_str().unwrap_or("_").to_owned())
                        .or_else(|| b["trait"]["path"].as_str().map(str::to_owned))
                })
                .collect();
            format!(
                "{} {}",
                if kind == "dyn_trait" { "dyn" } else { "impl" },
                names.join(" + ")
            )
        }
        "qualified_path" => format!(
            "{}::{}",
            ty(&inner["self_type"]),
            inner["name"].as_str().unwrap_or("_")
        ),
        "raw_pointer" => format!("*{}", ty(&inner["type"])),
        "function_pointer" => "fn(..)".into(),
        other => other.to_owned(),
    }
}
