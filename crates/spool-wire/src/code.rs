//! String codes that survive a round trip: the enum behind every wire code,
//! state and kind that a newer peer may extend.
//!
//! Wire codes are additive. A reader that turned an unfamiliar code into an
//! error would break the moment a peer upgraded, so each enum made here keeps
//! an unknown value as `Unknown(String)`, re-encodes it exactly as received,
//! and lets the caller decide whether an unknown value is acceptable (a turn
//! policy is not; an error code is).

/// Declares a string-valued enum with an `Unknown(String)` catch-all,
/// `as_str`, `parse`, `is_known`, `KNOWN`, `Display`, `From<&str>` and serde
/// as a plain JSON string.
macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A value this version does not know, kept exactly as received so
            /// it survives a round trip through this reader.
            Unknown(String),
        }

        impl $name {
            /// Every value this version knows, in the order the spec lists them.
            pub const KNOWN: &'static [Self] = &[$(Self::$variant),+];

            /// The wire string.
            #[must_use]
            pub fn as_str(&self) -> &str {
                match self {
                    $(Self::$variant => $text,)+
                    Self::Unknown(text) => text,
                }
            }

            /// Reads a wire string; an unfamiliar one becomes `Unknown`.
            #[must_use]
            pub fn parse(text: &str) -> Self {
                match text {
                    $($text => Self::$variant,)+
                    other => Self::Unknown(other.to_owned()),
                }
            }

            /// Whether this version knows the value.
            #[must_use]
            pub fn is_known(&self) -> bool {
                !matches!(self, Self::Unknown(_))
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl From<&str> for $name {
            fn from(text: &str) -> Self {
                Self::parse(text)
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = <::std::borrow::Cow<'de, str> as ::serde::Deserialize>::deserialize(deserializer)?;
                Ok(Self::parse(&text))
            }
        }
    };
}

pub(crate) use string_enum;

/// Declares a closed string-valued enum: the domain's own vocabulary,
/// where an unfamiliar value is an error rather than something to carry.
/// `as_str`, `KNOWN`, `Display`, `FromStr` (refusing with
/// [`UnknownValue`]) and serde as a plain JSON string; decoding an
/// unfamiliar string fails and names the values it knows.
macro_rules! closed_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident as $what:literal {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in the order the vocabulary lists them.
            pub const KNOWN: &'static [Self] = &[$(Self::$variant),+];

            /// The value's name.
            #[must_use]
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::code::UnknownValue;

            fn from_str(text: &str) -> Result<Self, Self::Err> {
                match text {
                    $($text => Ok(Self::$variant),)+
                    other => Err($crate::code::UnknownValue {
                        what: $what,
                        value: other.to_owned(),
                        known: &[$($text),+],
                    }),
                }
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = <::std::borrow::Cow<'de, str> as ::serde::Deserialize>::deserialize(deserializer)?;
                text.parse().map_err(<D::Error as ::serde::de::Error>::custom)
            }
        }
    };
}

pub(crate) use closed_enum;

/// A value a closed vocabulary does not hold.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{value}` (known: {})", .known.join(", "))]
pub struct UnknownValue {
    /// What kind of value it was meant to be (`turn policy`).
    pub what: &'static str,
    /// The value as given.
    pub value: String,
    /// The values the vocabulary holds.
    pub known: &'static [&'static str],
}

/// A message that did not decode: a stable protocol code and a sentence
/// saying why.
///
/// The code is what a client branches on; the message is for people and may
/// change between versions.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Rejection<C: std::fmt::Display> {
    /// The protocol's stable code for this failure.
    pub code: C,
    /// A lowercase, human-readable reason.
    pub message: String,
}

impl<C: std::fmt::Display> Rejection<C> {
    /// Builds a rejection.
    pub fn new(code: C, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// Serde helpers shared by the families.
pub(crate) mod serde_util {
    use serde::{Deserialize, Deserializer};

    /// For `#[serde(default, deserialize_with = "present")]` on an `Option`
    /// field: absent is `None`, but an explicit `null` is an error rather than
    /// a silent `None`, because the specs say "optional", never "nullable".
    pub(crate) fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de>,
    {
        T::deserialize(deserializer).map(Some)
    }

    /// Parses text as JSON, with the reason a peer sees when it is not.
    pub(crate) fn parse(text: &str) -> Result<serde_json::Value, String> {
        serde_json::from_str(text).map_err(|e| format!("not JSON: {}", reason(&e)))
    }

    /// Deserializes a JSON object straight from its text (no intermediate
    /// `Value`), with the same messages as [`parse`] and [`from_value`]:
    /// `not JSON: …` for bad syntax, `` `field`: … `` for a bad field.
    pub(crate) fn object_from_str<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
        // A top-level value that is not an object is refused up front, in
        // words a peer understands, rather than as "expected struct X".
        match text.trim_start().as_bytes().first() {
            Some(b'{') => {}
            None => return Err("not JSON: EOF while parsing a value".to_owned()),
            Some(_) => {
                return match serde_json::from_str::<serde::de::IgnoredAny>(text) {
                    Err(e) => Err(format!("not JSON: {}", reason(&e))),
                    Ok(_) => Err("must be a JSON object".to_owned()),
                };
            }
        }
        // Most messages are well-formed: decode them at full speed, and pay
        // for path tracking only to word an error.
        if let Ok(value) = serde_json::from_str(text) {
            return Ok(value);
        }
        let mut deserializer = serde_json::Deserializer::from_str(text);
        let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
            let path = error.path().to_string();
            let inner = error.into_inner();
            if inner.is_syntax() || inner.is_eof() {
                format!("not JSON: {}", reason(&inner))
            } else if path.is_empty() || path == "." {
                reason(&inner)
            } else {
                format!("`{path}`: {}", reason(&inner))
            }
        })?;
        deserializer
            .end()
            .map_err(|e| format!("not JSON: {}", reason(&e)))?;
        Ok(value)
    }

    /// Deserializes `value` into `T` with an error that names the field
    /// that failed (`` `depth`: invalid value: integer `-1`, expected u64 ``),
    /// because a reason without its field is no help to whoever sent it.
    pub(crate) fn from_value<T: serde::de::DeserializeOwned>(
        value: serde_json::Value,
    ) -> Result<T, String> {
        serde_path_to_error::deserialize(value).map_err(|error| {
            let path = error.path().to_string();
            let why = reason(error.inner());
            if path.is_empty() || path == "." {
                why
            } else {
                format!("`{path}`: {why}")
            }
        })
    }

    /// Turns a serde_json error into a lowercase sentence without the
    /// "line 1 column N" suffix, which means nothing to a reader of a value
    /// that was already parsed.
    pub(crate) fn reason(error: &serde_json::Error) -> String {
        let text = error.to_string();
        match text.rfind(" at line ") {
            Some(cut) if error.line() > 0 => text[..cut].to_owned(),
            _ => text,
        }
    }
}
