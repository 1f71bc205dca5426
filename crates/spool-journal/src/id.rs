//! Identities: run and turn ids, journal positions, addresses, principals.
//! Newtypes, so a turn id can never be passed where a run id is wanted.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// A map keyed by run id, hashed with foldhash (seeded per process) rather
/// than SipHash: the SQLite writer looks a run up in several such maps per
/// append, and SipHash was 4 % of its thread's time.
pub(crate) type RunMap<V> = std::collections::HashMap<RunId, V, foldhash::fast::RandomState>;

/// The longest id accepted, in bytes.
pub const MAX_ID_BYTES: usize = 128;

/// Why an id was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} `{value}`: use 1 to 128 characters of A-Z a-z 0-9 . _ : -")]
pub struct InvalidId {
    /// Which kind of id.
    pub what: &'static str,
    /// The value refused (cut to 64 characters).
    pub value: String,
}

fn check_id(what: &'static str, value: &str) -> Result<(), InvalidId> {
    let ok = !value.is_empty()
        && value.len() <= MAX_ID_BYTES
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(InvalidId {
            what,
            value: value.chars().take(64).collect(),
        })
    }
}

macro_rules! id_type {
    ($(#[$meta:meta])* $name:ident, $what:literal) => {
        $(#[$meta])*
        ///
        /// Shared text: a clone is a count, not a copy. Ids are copied into
        /// every envelope, head, cache key and stream line of their run,
        /// many times per event.
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(std::sync::Arc<str>);

        impl $name {
            /// Checks and wraps an id.
            ///
            /// # Errors
            ///
            /// [`InvalidId`] when it is empty, over 128 bytes, or holds a
            /// character other than ASCII letters, digits, `.`, `_`, `:`, `-`.
            pub fn new(value: impl Into<String>) -> Result<Self, InvalidId> {
                Self::checked(&value.into())
            }

            fn checked(value: &str) -> Result<Self, InvalidId> {
                check_id($what, value)?;
                Ok(Self(value.into()))
            }

            /// The id as text.
            #[must_use]
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                // Read from the input's own text where it can be: one
                // copy, into the shared text.
                struct Text;
                impl serde::de::Visitor<'_> for Text {
                    type Value = $name;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str(concat!("a ", $what))
                    }
                    fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<$name, E> {
                        $name::checked(value).map_err(E::custom)
                    }
                }
                deserializer.deserialize_str(Text)
            }
        }

        impl std::str::FromStr for $name {
            type Err = InvalidId;
            fn from_str(value: &str) -> Result<Self, InvalidId> {
                Self::checked(value)
            }
        }
    };
}

id_type!(
    /// A run's id.
    RunId,
    "run id"
);
id_type!(
    /// A turn's id.
    TurnId,
    "turn id"
);

/// A position in one run's journal: contiguous from 0.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Seq(pub u64);

impl Seq {
    /// The position after this one. Saturates rather than wrap: a
    /// client's cursor of `u64::MAX` must never read as "from the start".
    #[must_use]
    pub fn next(self) -> Self {
        Self(self.0.saturating_add(1))
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A run's name in one channel's namespace (`http/browser-42`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Address {
    /// The channel namespace (`http`, `pod`, `bus`, or a host's own).
    pub namespace: String,
    /// The name within it; may contain `/`.
    pub name: String,
}

impl Address {
    /// An address.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Who asked: what an authenticator proved about a caller.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Principal {
    /// Which authenticator proved it.
    pub authenticator: String,
    /// What kind of caller.
    pub kind: String,
    /// Who.
    pub id: String,
    /// Anything else the authenticator vouches for.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
}

impl Principal {
    /// The key operation ids are scoped by: the same key under another
    /// authenticator, kind or id is another operation.
    #[must_use]
    pub fn scope(&self) -> String {
        // Lengths first, so no choice of names can make two principals
        // collide on the joined text.
        format!(
            "{}:{}:{}:{}{}{}",
            self.authenticator.len(),
            self.kind.len(),
            self.id.len(),
            self.authenticator,
            self.kind,
            self.id
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_accept_the_safe_alphabet_and_refuse_the_rest() {
        assert!(RunId::new("run_0192f6a0-7c1e.7d1a:x").is_ok());
        for bad in ["", "has space", "slash/inside", "ü", &"x".repeat(129)] {
            assert!(RunId::new(bad).is_err(), "{bad:?}");
        }
        assert!(serde_json::from_str::<TurnId>("\"a b\"").is_err());
    }

    #[test]
    fn an_id_reads_the_same_from_escaped_or_owned_json_and_writes_as_a_plain_string() {
        let plain: RunId = serde_json::from_str("\"run-1\"").unwrap();
        // An escape makes the parser hand over its own copy of the text,
        // not a slice of the input.
        let escaped: RunId = serde_json::from_str("\"run\\u002d1\"").unwrap();
        let from_value: RunId = serde_json::from_value(serde_json::json!("run-1")).unwrap();
        assert_eq!(plain, escaped);
        assert_eq!(plain, from_value);
        assert_eq!(serde_json::to_string(&plain).unwrap(), "\"run-1\"");
        assert!(serde_json::from_str::<RunId>("\"run\\u0020 1\"").is_err());
        assert!(serde_json::from_str::<RunId>("17").is_err());
        // A clone shares the text.
        assert!(std::ptr::eq(plain.as_str(), plain.clone().as_str()));
    }

    #[test]
    fn principal_scopes_cannot_collide_by_moving_text_between_fields() {
        let a = Principal {
            authenticator: "ab".into(),
            kind: "c".into(),
            id: "d".into(),
            ..Principal::default()
        };
        let b = Principal {
            authenticator: "a".into(),
            kind: "bc".into(),
            id: "d".into(),
            ..Principal::default()
        };
        assert_ne!(a.scope(), b.scope());
    }
}
