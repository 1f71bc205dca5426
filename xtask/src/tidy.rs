//! `cargo xtask tidy`: checks what review would otherwise have to catch by
//! eye. The crate graph follows DESIGN.md's layering (read from `cargo
//! metadata`), every source file opens with a `//!` line, and the toolchain
//! pin is exact.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Each Spool crate and the Spool crates it may depend on directly.
/// Dependencies point one way: wire ← journal ← runtime ← transports ← cli.
/// Transports may reuse `spool-http`'s server plumbing.
const LAYERS: &[(&str, &[&str])] = &[
    ("spool-wire", &[]),
    ("spool-journal", &["spool-wire"]),
    ("spool-journal-pg", &["spool-journal", "spool-wire"]),
    ("spool-runtime", &["spool-journal", "spool-wire"]),
    // What every network transport shares, the outbound client's path
    // and trust policy among it; no transport depends on another (tests
    // may compose them, as the binary does).
    (
        "spool-edge",
        &["spool-runtime", "spool-journal", "spool-wire"],
    ),
    // The model engines reach providers through the edge's outbound path.
    (
        "spool-engines",
        &["spool-edge", "spool-runtime", "spool-journal", "spool-wire"],
    ),
    (
        "spool-http",
        &["spool-edge", "spool-runtime", "spool-journal", "spool-wire"],
    ),
    (
        "spool-rpc",
        &["spool-edge", "spool-runtime", "spool-journal", "spool-wire"],
    ),
    (
        "spool-pod",
        &["spool-runtime", "spool-journal", "spool-wire"],
    ),
    (
        "spool-bus",
        &["spool-edge", "spool-runtime", "spool-journal", "spool-wire"],
    ),
    // OTLP's LogRecords are the JSON-RPC events' own: the mapping lives
    // once, in the edge (`spool_edge::records`).
    (
        "spool-otel",
        &["spool-edge", "spool-runtime", "spool-journal", "spool-wire"],
    ),
    // MCP both ways: servers' tools as Spool tools, and Spool's runs
    // served to MCP hosts through the edge.
    (
        "spool-mcp",
        &["spool-edge", "spool-runtime", "spool-journal", "spool-wire"],
    ),
    // A2A: Spool's runs as an agent's durable tasks, through the edge.
    (
        "spool-a2a",
        &["spool-edge", "spool-runtime", "spool-journal", "spool-wire"],
    ),
    ("spool-cli", &["*"]),
    ("spool-bench", &["*"]),
];

/// External crates a Spool crate must not reach, even indirectly.
const NEVER_REACHES: &[(&str, &[&str])] = &[(
    "spool-wire",
    &[
        "tokio",
        "hyper",
        "hyper-util",
        "mio",
        "reqwest",
        "rusqlite",
        "libsqlite3-sys",
        "tokio-postgres",
        "postgres",
        "sqlx",
    ],
)];

/// External crates a Spool crate must not name directly: the runtime knows
/// no transport, and transports know no store.
const NEVER_NAMES: &[(&str, &[&str])] = &[
    (
        "spool-journal",
        &["hyper", "hyper-util", "tokio-tungstenite"],
    ),
    (
        "spool-runtime",
        &[
            "hyper",
            "hyper-util",
            "tokio-tungstenite",
            "rusqlite",
            "tokio-postgres",
        ],
    ),
    ("spool-http", &["rusqlite", "tokio-postgres"]),
    ("spool-rpc", &["rusqlite", "tokio-postgres"]),
    ("spool-pod", &["rusqlite", "tokio-postgres"]),
    ("spool-bus", &["rusqlite", "tokio-postgres"]),
    ("spool-otel", &["rusqlite", "tokio-postgres"]),
    ("spool-mcp", &["rusqlite", "tokio-postgres"]),
    ("spool-a2a", &["rusqlite", "tokio-postgres"]),
];

/// Transport vocabularies the domain must not use: the journal and the
/// runtime speak `spool_wire::run`, and each transport maps it to its own
/// words at its edge. Checked in their sources (tests may use anything).
const DOMAIN_NEVER_USES: &[(&str, &[&str])] = &[
    (
        "crates/spool-journal/src",
        &[
            "spool_wire::http",
            "spool_wire::rpc",
            "spool_wire::pod",
            "spool_wire::bus",
        ],
    ),
    (
        "crates/spool-runtime/src",
        &[
            "spool_wire::http",
            "spool_wire::rpc",
            "spool_wire::pod",
            "spool_wire::bus",
        ],
    ),
];

pub(crate) fn run(root: &Path) -> Result<()> {
    let mut problems = Vec::new();
    problems.extend(layering(root)?);
    problems.extend(file_openers(root)?);
    problems.extend(domain_vocabulary(root)?);
    problems.extend(toolchain(root)?);
    if problems.is_empty() {
        crate::say(
            "tidy: crate layering, file openers, the domain's vocabulary and toolchain pin are in order",
        );
        return Ok(());
    }
    for problem in &problems {
        crate::say(&format!("tidy: {problem}"));
    }
    bail!("{} tidy problem(s)", problems.len())
}

/// The normal (non-dev, non-build) dependency graph of the workspace, by
/// crate name.
#[derive(Debug, Default)]
struct Graph {
    members: BTreeSet<String>,
    edges: BTreeMap<String, BTreeSet<String>>,
}

fn graph(root: &Path) -> Result<Graph> {
    let output = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["metadata", "--format-version", "1"])
        .current_dir(root)
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let metadata: Value =
        serde_json::from_slice(&output.stdout).context("reading cargo metadata")?;
    let names: BTreeMap<&str, &str> = metadata["packages"]
        .as_array()
        .context("metadata has packages")?
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p["name"].as_str()?)))
        .collect();
    let members: BTreeSet<String> = metadata["workspace_members"]
        .as_array()
        .context("metadata has workspace members")?
        .iter()
        .filter_map(|id| names.get(id.as_str()?).map(|n| (*n).to_owned()))
        .collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for node in metadata["resolve"]["nodes"]
        .as_array()
        .context("metadata has a resolve graph")?
    {
        let Some(from) = node["id"].as_str().and_then(|id| names.get(id)) else {
            continue;
        };
        let entry = edges.entry((*from).to_owned()).or_default();
        for dep in node["deps"].as_array().into_iter().flatten() {
            let normal = dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|kind| kind["kind"].is_null());
            if let (true, Some(to)) = (normal, dep["pkg"].as_str().and_then(|id| names.get(id))) {
                entry.insert((*to).to_owned());
            }
        }
    }
    Ok(Graph { members, edges })
}

fn layering(root: &Path) -> Result<Vec<String>> {
    Ok(check_layers(&graph(root)?))
}

fn check_layers(Graph { members, edges }: &Graph) -> Vec<String> {
    let mut problems = Vec::new();
    for member in members.iter().filter(|m| m.starts_with("spool-")) {
        let Some((_, allowed)) = LAYERS.iter().find(|(name, _)| name == member) else {
            problems.push(format!(
                "{member} is not in xtask's layering table; add it with the crates it may use"
            ));
            continue;
        };
        let direct = edges.get(member).cloned().unwrap_or_default();
        for dep in direct.iter().filter(|d| d.starts_with("spool-")) {
            if !allowed.contains(&"*") && !allowed.contains(&dep.as_str()) {
                problems.push(format!(
                    "{member} must not depend on {dep} (dependencies point down the layers)"
                ));
            }
        }
        if let Some((_, banned)) = NEVER_NAMES.iter().find(|(name, _)| name == member) {
            for dep in direct.iter().filter(|d| banned.contains(&d.as_str())) {
                problems.push(format!("{member} must not depend on {dep} directly"));
            }
        }
        if let Some((_, banned)) = NEVER_REACHES.iter().find(|(name, _)| name == member) {
            for dep in reachable(edges, member)
                .iter()
                .filter(|d| banned.contains(&d.as_str()))
            {
                problems.push(format!(
                    "{member} must not reach {dep}, even through another crate"
                ));
            }
        }
    }
    problems
}

fn reachable(edges: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.to_owned()];
    while let Some(name) = stack.pop() {
        for next in edges.get(&name).into_iter().flatten() {
            if seen.insert(next.clone()) {
                stack.push(next.clone());
            }
        }
    }
    seen
}

/// Every Rust file opens with a `//!` line saying what it is for.
fn file_openers(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for dir in ["crates", "xtask", "fuzz/fuzz_targets"] {
        let mut files = Vec::new();
        rust_files(&root.join(dir), &mut files)?;
        for file in files {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            if !first.starts_with("//!") {
                let shown = file
                    .strip_prefix(root)
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                problems.push(format!("{shown} does not open with a `//!` line"));
            }
        }
    }
    Ok(problems)
}

/// The journal and the runtime name no transport's types.
fn domain_vocabulary(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for (dir, banned) in DOMAIN_NEVER_USES {
        let mut files = Vec::new();
        rust_files(&root.join(dir), &mut files)?;
        for file in files {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            for name in banned.iter().filter(|name| text.contains(*name)) {
                let shown = file.strip_prefix(root).unwrap_or(&file).display();
                problems.push(format!(
                    "{shown} uses `{name}`: the domain speaks `spool_wire::run`"
                ));
            }
        }
    }
    Ok(problems)
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The toolchain pin is exact: a bare `1.95` makes rustup try a download,
/// and every cargo call fails on a machine without that access.
fn toolchain(root: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(root.join("rust-toolchain.toml"))
        .context("reading rust-toolchain.toml")?;
    Ok(check_toolchain(&text))
}

fn check_toolchain(text: &str) -> Vec<String> {
    let pinned = text
        .lines()
        .any(|l| l.replace(' ', "").trim_end() == "channel=\"1.95.0\"");
    if pinned {
        vec![]
    } else {
        vec!["rust-toolchain.toml must say channel = \"1.95.0\" exactly".to_owned()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &str)]) -> Graph {
        let mut graph = Graph::default();
        for (from, to) in edges {
            for name in [from, to] {
                if name.starts_with("spool-") {
                    graph.members.insert((*name).to_owned());
                }
            }
            graph
                .edges
                .entry((*from).to_owned())
                .or_default()
                .insert((*to).to_owned());
        }
        graph
    }

    #[test]
    fn the_layering_as_designed_passes() {
        let ok = graph(&[
            ("spool-journal", "spool-wire"),
            ("spool-runtime", "spool-journal"),
            ("spool-http", "spool-runtime"),
            ("spool-cli", "spool-http"),
            ("spool-wire", "serde"),
        ]);
        assert_eq!(check_layers(&ok), Vec::<String>::new());
    }

    #[test]
    fn the_wire_crate_reaching_tokio_through_another_crate_is_caught() {
        let bad = graph(&[("spool-wire", "some-helper"), ("some-helper", "tokio")]);
        assert_eq!(
            check_layers(&bad),
            ["spool-wire must not reach tokio, even through another crate"]
        );
    }

    #[test]
    fn a_transport_standing_on_another_transport_is_caught() {
        let bad = graph(&[("spool-pod", "spool-http"), ("spool-bus", "spool-rpc")]);
        assert_eq!(
            check_layers(&bad),
            [
                "spool-bus must not depend on spool-rpc (dependencies point down the layers)",
                "spool-pod must not depend on spool-http (dependencies point down the layers)",
            ]
        );
        let ok = graph(&[("spool-pod", "spool-runtime"), ("spool-bus", "spool-edge")]);
        assert_eq!(check_layers(&ok), Vec::<String>::new());
    }

    #[test]
    fn an_upward_dependency_is_caught() {
        let bad = graph(&[("spool-runtime", "spool-http")]);
        assert_eq!(
            check_layers(&bad),
            ["spool-runtime must not depend on spool-http (dependencies point down the layers)"]
        );
    }

    #[test]
    fn a_transport_naming_a_store_is_caught() {
        let bad = graph(&[("spool-http", "rusqlite")]);
        assert_eq!(
            check_layers(&bad),
            ["spool-http must not depend on rusqlite directly"]
        );
    }

    #[test]
    fn a_crate_missing_from_the_table_is_caught() {
        let problems = check_layers(&graph(&[("spool-mystery", "spool-wire")]));
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("not in xtask's layering table"));
    }

    #[test]
    fn only_the_exact_toolchain_pin_passes() {
        assert!(check_toolchain("[toolchain]\nchannel = \"1.95.0\"\n").is_empty());
        assert_eq!(
            check_toolchain("[toolchain]\nchannel = \"1.95\"\n").len(),
            1
        );
        assert_eq!(
            check_toolchain("[toolchain]\nchannel = \"stable\"\n").len(),
            1
        );
    }
}
