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

/// The query parameter `name`, decoded as a form encodes it: `+` is a
/// space (a browser's `URLSearchParams` writes one so; a plus itself
/// comes as `%2B`), then percent-escapes, strictly. Given twice it is
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
        found = Some(segment(&raw.replace('+', " "), name)?);
    }
    Ok(found)
}

pub(super) fn cursor(query: Option<&str>) -> Result<Option<Seq>, String> {
    position(query, "cursor")
}

/// The query parameter `name` as a journal position.
pub(super) fn position(query: Option<&str>, name: &str) -> Result<Option<Seq>, String> {
    query_value(query, name)?
        .map(|value| {
            value
                .parse::<u64>()
                .map(Seq)
                .map_err(|_| format!("`{name}` must be a non-negative integer, not `{value}`"))
        })
        .transpose()
}

/// `limit`: how many a page holds, 1 to `max`; `default` when absent.
pub(super) fn limit(query: Option<&str>, default: usize, max: usize) -> Result<usize, String> {
    match query_value(query, "limit")? {
        None => Ok(default),
        Some(value) => value
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| format!("`limit` must be an integer from 1 to {max}, not `{value}`")),
    }
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
        let limit = limit(query, Self::DEFAULT, Self::MAX)?;
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

/// What `GET /runs` keeps and in which order: `state` (states, comma
/// separated), `kind` (suspension kinds: waiting runs parked on one of
/// them), `q` (a search) and `order` (`newest`, the default, or
/// `oldest`, updated longest ago first: an inbox's order).
pub(super) struct Filter {
    states: Option<Vec<spool_wire::run::RunState>>,
    kinds: Option<Vec<spool_wire::run::SuspendKind>>,
    /// The search, lowercased.
    pub(super) search: Option<String>,
    pub(super) oldest_first: bool,
}

impl Filter {
    /// The longest search taken: a title is at most this long.
    const MAX_SEARCH: usize = 256;

    pub(super) fn parse(query: Option<&str>) -> Result<Self, String> {
        fn list<T: std::str::FromStr>(
            query: Option<&str>,
            name: &str,
        ) -> Result<Option<Vec<T>>, String>
        where
            T::Err: std::fmt::Display,
        {
            query_value(query, name)?
                .map(|value| {
                    value
                        .split(',')
                        .map(|one| {
                            one.trim()
                                .parse::<T>()
                                .map_err(|e| format!("`{name}`: {e}"))
                        })
                        .collect()
                })
                .transpose()
        }
        let search = query_value(query, "q")?
            .map(|q| q.trim().to_lowercase())
            .filter(|q| !q.is_empty());
        if search
            .as_ref()
            .is_some_and(|q| q.chars().count() > Self::MAX_SEARCH)
        {
            return Err(format!(
                "`q` is longer than {} characters",
                Self::MAX_SEARCH
            ));
        }
        let oldest_first = match query_value(query, "order")?.as_deref() {
            None | Some("newest") => false,
            Some("oldest") => true,
            Some(other) => {
                return Err(format!(
                    "`order` must be `newest` or `oldest`, not `{other}`"
                ));
            }
        };
        Ok(Self {
            states: list(query, "state")?,
            kinds: list(query, "kind")?,
            search,
            oldest_first,
        })
    }

    /// Whether a run in `status` passes the state and kind filters.
    pub(super) fn admits(&self, status: &spool_journal::fold::Status) -> bool {
        let state = status.state();
        if self
            .states
            .as_ref()
            .is_some_and(|states| !states.contains(&state))
        {
            return false;
        }
        match (&self.kinds, status) {
            (None, _) => true,
            (Some(kinds), spool_journal::fold::Status::Waiting(kind)) => kinds.contains(kind),
            (Some(_), _) => false,
        }
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
