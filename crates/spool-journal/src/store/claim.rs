//! A claim on a tool call as stored, and what a new claim on it is
//! answered: the rule every store applies the same way.

use super::*;

/// A claim as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimRow {
    /// The call holding it.
    pub holder: CallRef,
    /// Its output and where it was recorded, once settled.
    pub settled: Option<(Value, Seq)>,
}

/// What to do with a claim request, given the stored claim.
#[derive(Debug, PartialEq)]
pub enum ClaimDecision {
    /// No claim yet: store one for the holder; it wins.
    Take,
    /// Answer without changing anything.
    Answer(Result<Claim, CallRef>),
}

/// What a claim request gets, given the stored claim: the holder asking
/// again (after a crash) still holds it.
#[must_use]
pub fn decide_claim(existing: Option<ClaimRow>, holder: &CallRef) -> ClaimDecision {
    match existing {
        None => ClaimDecision::Take,
        Some(ClaimRow {
            holder: by,
            settled: Some((output, seq)),
        }) => ClaimDecision::Answer(Ok(Claim::Settled { output, by, seq })),
        // The holder asking again (say, after a crash) still holds it.
        Some(ClaimRow {
            holder: by,
            settled: None,
        }) if &by == holder => ClaimDecision::Answer(Ok(Claim::Won)),
        Some(ClaimRow {
            holder: by,
            settled: None,
        }) => ClaimDecision::Answer(Err(by)),
    }
}
