//! The hash chain: each row's hash covers the previous row's hash, the run,
//! the position and the exact stored bytes, so a changed, dropped or
//! reordered row is reported on read instead of served.

use sha2::{Digest, Sha256};

use crate::id::{RunId, Seq};

/// A row's chain hash.
pub type Hash = [u8; 32];

/// The "previous hash" of a run's first row.
pub const GENESIS: Hash = [0; 32];

/// A row's hash: SHA-256 over the previous hash and the length-prefixed run
/// id, position and stored bytes (lengths make the framing unambiguous).
#[must_use]
pub fn link(prev: &Hash, run: &RunId, seq: Seq, bytes: &[u8]) -> Hash {
    let mut hasher = Sha256::new();
    hasher.update(prev);
    hasher.update((run.as_str().len() as u64).to_be_bytes());
    hasher.update(run.as_str().as_bytes());
    hasher.update(seq.0.to_be_bytes());
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
    hasher.finalize().into()
}

/// A log that does not verify: the first position whose stored hash does
/// not match what its content and predecessor say it must be.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("journal of run {run} is tamper-evident at seq {seq}: its hash chain does not verify")]
pub struct TamperEvident {
    /// The run.
    pub run: RunId,
    /// The first bad position.
    pub seq: Seq,
}

/// Walks stored rows in order, checking each against the chain.
#[derive(Debug)]
pub struct Verifier {
    run: RunId,
    prev: Hash,
    next: Seq,
}

impl Verifier {
    /// A verifier for rows starting at `from`, whose predecessor's stored
    /// hash is `prev` ([`GENESIS`] when `from` is 0).
    #[must_use]
    pub fn new(run: RunId, from: Seq, prev: Hash) -> Self {
        Self {
            run,
            prev,
            next: from,
        }
    }

    /// Checks the next row.
    ///
    /// # Errors
    ///
    /// [`TamperEvident`] when its position is not the next one or its hash
    /// is not the link of its content.
    pub fn check(&mut self, seq: Seq, bytes: &[u8], stored: &Hash) -> Result<(), TamperEvident> {
        let expected = link(&self.prev, &self.run, seq, bytes);
        if seq != self.next || &expected != stored {
            return Err(TamperEvident {
                run: self.run.clone(),
                seq: self.next.min(seq),
            });
        }
        self.prev = expected;
        self.next = seq.next();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> RunId {
        RunId::new("r").unwrap()
    }

    #[test]
    fn a_chain_built_with_link_verifies() {
        let rows: Vec<&[u8]> = vec![b"{\"a\":1}", b"{\"b\":2}", b"{}"];
        let mut prev = GENESIS;
        let mut hashes = Vec::new();
        for (seq, bytes) in rows.iter().enumerate() {
            prev = link(&prev, &run(), Seq(seq as u64), bytes);
            hashes.push(prev);
        }
        let mut verifier = Verifier::new(run(), Seq(0), GENESIS);
        for (seq, bytes) in rows.iter().enumerate() {
            verifier
                .check(Seq(seq as u64), bytes, &hashes[seq])
                .unwrap();
        }
    }

    #[test]
    fn a_changed_byte_a_skipped_row_or_a_wrong_run_is_tamper_evident() {
        let first = link(&GENESIS, &run(), Seq(0), b"{}");
        let second = link(&first, &run(), Seq(1), b"[]");
        let mut changed = Verifier::new(run(), Seq(0), GENESIS);
        assert_eq!(
            changed.check(Seq(0), b"{ }", &first).unwrap_err().seq,
            Seq(0)
        );
        let mut skipped = Verifier::new(run(), Seq(0), GENESIS);
        assert_eq!(
            skipped.check(Seq(1), b"[]", &second).unwrap_err().seq,
            Seq(0)
        );
        let mut other_run = Verifier::new(RunId::new("s").unwrap(), Seq(0), GENESIS);
        assert!(other_run.check(Seq(0), b"{}", &first).is_err());
    }
}
