//! What a request's path and query say, decoded strictly: run ids,
//! percent-decoded segments, query values, cursors and pages; and a body
//! principal and turn policy in the runtime's words.

use super::*;

/// A run id from its path segment, percent-decoded as any segment is (a
/// client may encode every byte that is not alphanumeric).
pub(super) fn run_id(raw: &str) -> Result<RunId, String> {
    let decoded = segment(raw, "run id")?;
    RunId::new(decoded).map_err(|e| e.to_string())
}

/// A path segment, percent-decoded strictly: a `%` not followed by two hex
/// digits, or bytes that are not UTF-8, are refused rather than passed on
/// or replaced (a lossy decoding made `%ff%fe` and `%80%80` one address).
pub(super) fn segment(raw: &str, what: &str) -> Result<String, String> {
    let bytes = raw.as_bytes();
    let malformed = bytes.iter().enumerate().any(|(at, byte)| {
        *byte == b'%'
            && !bytes
                .get(at + 1..at + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    });
    if malformed {
        return Err(format!("the {what} has a malformed percent-escape"));
    }
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(|_| format!("the {what} is not UTF-8 once percent-decoded"))
}

/// The value of `name` in a query string, when it is there.
/// The query parameter `name`, percent-decoded. Given twice it is
/// refused: two cursors (or limits) cannot both be meant.
pub(super) fn query_value(query: Option<&str>, name: &str) -> Result<Option<String>, String> {
    let mut found = None;
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        let Some(raw) = pair.strip_prefix(name).and_then(|v| v.strip_prefix('=')) else {
            continue;
        };
        if found.is_some() {
            return Err(format!("`{name}` is given more than once"));
        }
        found = Some(segment(raw, name)?);
    }
    Ok(found)
}

pub(super) fn cursor(query: Option<&str>) -> Result<Option<Seq>, String> {
    query_value(query, "cursor")?
        .map(|value| {
            value
                .parse::<u64>()
                .map(Seq)
                .map_err(|_| format!("`cursor` must be a non-negative integer, not `{value}`"))
        })
        .transpose()
}

/// A page of `GET /runs`.
pub(super) struct Page {
    pub(super) limit: usize,
    /// The last run of the previous page: its update time (Unix
    /// nanoseconds) and id.
    pub(super) after: Option<(i128, String)>,
}

impl Page {
    const DEFAULT: usize = 100;
    const MAX: usize = 1000;

    pub(super) fn parse(query: Option<&str>) -> Result<Self, String> {
        let limit = match query_value(query, "limit")? {
            None => Self::DEFAULT,
            Some(value) => value
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=Self::MAX).contains(n))
                .ok_or_else(|| {
                    format!(
                        "`limit` must be an integer from 1 to {}, not `{value}`",
                        Self::MAX
                    )
                })?,
        };
        let after = query_value(query, "after")?
            .map(|value| {
                value
                    .split_once('.')
                    .and_then(|(at, id)| Some((at.parse::<i128>().ok()?, id.to_owned())))
                    .ok_or_else(|| {
                        format!(
                            "`after` must be a `next` value from an earlier page, not `{value}`"
                        )
                    })
            })
            .transpose()?;
        Ok(Self { limit, after })
    }
}

pub(super) fn principal_of(auth: wire::Principal) -> Principal {
    Principal {
        authenticator: auth.authenticator,
        kind: auth.kind,
        id: auth.id,
        attributes: auth.attributes,
    }
}

/// The seed's turn policy in the runtime's vocabulary. The decoders refuse
/// an unknown policy with `unknown_turn_policy` first; this refuses what
/// is left, should that check ever move.
pub(super) fn turn_policy(
    policy: Option<&wire::TurnPolicy>,
) -> Result<Option<spool_wire::run::TurnPolicy>, RuntimeError> {
    policy
        .map(spool_wire::run::TurnPolicy::try_from)
        .transpose()
        .map_err(|unknown| RuntimeError::BadRequest(unknown.to_string()))
}
