//! The worked transcripts in `docs/protocol/` are test fixtures: every line
//! validates as its stated kind and re-encodes to the same JSON value, so
//! the docs cannot drift from the code.

use serde_json::Value;
use spool_wire::validate::{Kind, validate};

const PAGES: [(&str, &str, usize); 5] = [
    (
        "bus.md",
        include_str!("../../../../docs/protocol/bus.md"),
        5,
    ),
    (
        "rpc.md",
        include_str!("../../../../docs/protocol/rpc.md"),
        10,
    ),
    (
        "pod.md",
        include_str!("../../../../docs/protocol/pod.md"),
        14,
    ),
    (
        "http.md",
        include_str!("../../../../docs/protocol/http.md"),
        10,
    ),
    (
        "sentinels.md",
        include_str!("../../../../docs/protocol/sentinels.md"),
        4,
    ),
];

/// The `>`/`<` lines of a page's ```transcript blocks.
fn transcript(page: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut inside = false;
    for line in page.lines() {
        match line.trim() {
            "```transcript" => inside = true,
            "```" => inside = false,
            text if inside && (text.starts_with('>') || text.starts_with('<')) => lines.push(text),
            _ => {}
        }
    }
    lines
}

#[test]
fn every_transcript_line_in_the_protocol_pages_validates_and_re_encodes_unchanged() {
    for (name, page, at_least) in PAGES {
        let lines = transcript(page);
        assert!(
            lines.len() >= at_least,
            "{name}: expected at least {at_least} transcript lines, found {}",
            lines.len()
        );
        for line in lines {
            let (kind, json) = line[1..]
                .trim()
                .split_once(' ')
                .unwrap_or_else(|| panic!("{name}: `{line}` has no kind"));
            let kind =
                Kind::from_name(kind).unwrap_or_else(|| panic!("{name}: unknown kind `{kind}`"));
            let encoded =
                validate(kind, json).unwrap_or_else(|e| panic!("{name}: `{line}` is refused: {e}"));
            let sent: Value = serde_json::from_str(json).unwrap();
            let back: Value = serde_json::from_str(&encoded).unwrap();
            // A legacy client line is read as an envelope; compare it by
            // what it maps to rather than by its own shape.
            if kind != Kind::RpcClient || sent.get("t").is_none() {
                assert_eq!(back, sent, "{name}: `{line}` changed on re-encoding");
            }
        }
    }
}
