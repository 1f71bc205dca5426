//! Canonical JSON (RFC 8785) and the content hash built on it.
//!
//! What gets hashed must be the same bytes on every machine and every
//! replay. Sorting keys by their UTF-8 bytes is not enough: RFC 8785 sorts
//! by UTF-16 code units and fixes how numbers print, so this module defers to
//! `serde_json_canonicalizer`, which passes the RFC's vectors.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The prefix of every content hash, naming the algorithm so a later one can
/// be told apart.
pub const CONTENT_HASH_PREFIX: &str = "sha256:";

/// Renders a JSON value in the RFC 8785 canonical form: keys sorted, no
/// insignificant whitespace, numbers in their shortest round-trip form.
///
/// ```
/// use serde_json::json;
/// use spool_wire::canonical::canonical_json;
///
/// let value = json!({"b": [1, 2.5, "x"], "a": {"d": true, "c": null}});
/// assert_eq!(canonical_json(&value), r#"{"a":{"c":null,"d":true},"b":[1,2.5,"x"]}"#);
/// ```
#[must_use]
pub fn canonical_json(value: &Value) -> String {
    serde_json_canonicalizer::to_string(value).expect(
        "a serde_json Value holds only string keys and finite numbers, which always canonicalize",
    )
}

/// The content hash of a JSON value: `sha256:` and the lowercase hex SHA-256
/// of its canonical form. Two values that differ only in key order or number
/// spelling hash the same.
///
/// ```
/// use serde_json::json;
/// use spool_wire::canonical::content_hash;
///
/// let a = content_hash(&json!({"x": 1, "y": [true]}));
/// let b = content_hash(&serde_json::from_str(r#"{ "y": [true], "x": 1.0 }"#).unwrap());
/// assert_eq!(a, b);
/// assert!(a.starts_with("sha256:") && a.len() == 7 + 64);
/// ```
#[must_use]
pub fn content_hash(value: &Value) -> String {
    let digest = Sha256::digest(canonical_json(value).as_bytes());
    let mut out = String::with_capacity(CONTENT_HASH_PREFIX.len() + 64);
    out.push_str(CONTENT_HASH_PREFIX);
    for byte in digest {
        out.push(hex_digit(byte >> 4));
        out.push(hex_digit(byte & 0x0f));
    }
    out
}

fn hex_digit(nibble: u8) -> char {
    char::from_digit(u32::from(nibble), 16).expect("a nibble is below 16")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_sort_by_utf16_code_units_as_rfc_8785_requires() {
        // U+10000 encodes as the surrogate pair D800 DC00, which sorts before
        // U+E000 in UTF-16 though it sorts after it in UTF-8.
        let value = json!({"\u{e000}": 1, "\u{10000}": 2});
        assert_eq!(canonical_json(&value), "{\"\u{10000}\":2,\"\u{e000}\":1}");
    }

    #[test]
    fn numbers_print_in_their_shortest_round_trip_form() {
        let value: Value = serde_json::from_str("[1.0, 1e21, 0.000001, -0.0, 1E-7]").unwrap();
        assert_eq!(canonical_json(&value), "[1,1e+21,0.000001,0,1e-7]");
    }

    #[test]
    fn content_hash_of_an_empty_object_is_the_sha256_of_two_braces() {
        assert_eq!(
            content_hash(&json!({})),
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }
}
