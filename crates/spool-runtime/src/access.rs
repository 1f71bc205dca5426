//! Who may reach a run: the one ownership check every transport calls, so
//! the HTTP channel, JSON-RPC in every framing, the bus and any later
//! surface answer another principal's run the same way (as if it did not
//! exist) and leave it out of listings.

use spool_journal::{Principal, RunId};

use crate::{Runtime, RuntimeError};

/// The principal attribute that marks an administrator: `admin = "true"`
/// reaches every run when runs belong to their creators.
pub const ADMIN_ATTRIBUTE: &str = "admin";

/// Who may read or drive a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RunAccess {
    /// Any caller the authenticator admits, as the seeds say (the
    /// default): a run is not restricted to its creator.
    #[default]
    Any,
    /// A run is reached only by the principal that created it, or by one
    /// with the attribute `admin = "true"`; to anyone else it does not
    /// exist, and listings leave it out. A run with no recorded creator
    /// is reached by administrators only. Needs an authenticator: with
    /// none, no caller is proven and only administrators could reach
    /// anything.
    Owner,
}

impl RunAccess {
    /// Whether `caller` (a principal an authenticator proved; `None` for
    /// an unproven caller) may reach a run created by `owner`.
    #[must_use]
    pub fn permits(self, caller: Option<&Principal>, owner: Option<&Principal>) -> bool {
        match self {
            Self::Any => true,
            Self::Owner => caller.is_some_and(|caller| {
                is_admin(caller) || owner.is_some_and(|owner| owner.scope() == caller.scope())
            }),
        }
    }

    /// Whether `caller` may reach `run`.
    ///
    /// # Errors
    ///
    /// `RunNotFound` for a run that does not exist; a journal error when
    /// its creator cannot be read.
    pub async fn reaches(
        self,
        runtime: &Runtime,
        caller: Option<&Principal>,
        run: &RunId,
    ) -> Result<bool, RuntimeError> {
        match self {
            // Existence is the operation's own business under `Any`.
            Self::Any => Ok(true),
            Self::Owner => {
                let owner = runtime.owner(run).await?;
                Ok(self.permits(caller, owner.as_ref()))
            }
        }
    }

    /// `Ok` when `caller` may reach `run`; `RunNotFound` when it may not,
    /// the same answer as for a run that does not exist, so a caller
    /// learns nothing of another's runs.
    ///
    /// # Errors
    ///
    /// `RunNotFound` as said; a journal error when the creator cannot be
    /// read.
    pub async fn check(
        self,
        runtime: &Runtime,
        caller: Option<&Principal>,
        run: &RunId,
    ) -> Result<(), RuntimeError> {
        if self.reaches(runtime, caller, run).await? {
            Ok(())
        } else {
            Err(RuntimeError::RunNotFound(run.clone()))
        }
    }
}

/// Whether `principal` carries `admin = "true"`.
#[must_use]
pub fn is_admin(principal: &Principal) -> bool {
    principal
        .attributes
        .get(ADMIN_ATTRIBUTE)
        .is_some_and(|admin| admin == "true")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(id: &str, admin: bool) -> Principal {
        let mut principal = Principal {
            authenticator: "token".into(),
            kind: "token".into(),
            id: id.into(),
            ..Principal::default()
        };
        if admin {
            principal
                .attributes
                .insert(ADMIN_ATTRIBUTE.into(), "true".into());
        }
        principal
    }

    #[test]
    fn under_owner_access_a_run_is_reached_by_its_creator_and_administrators_only() {
        let (alice, bob, root) = (
            token("alice", false),
            token("bob", false),
            token("root", true),
        );
        let owner = RunAccess::Owner;
        assert!(owner.permits(Some(&alice), Some(&alice)));
        assert!(!owner.permits(Some(&bob), Some(&alice)));
        assert!(owner.permits(Some(&root), Some(&alice)));
        assert!(!owner.permits(None, Some(&alice)));
        // A run nobody is recorded as creating: administrators only.
        assert!(!owner.permits(Some(&alice), None));
        assert!(owner.permits(Some(&root), None));
        assert!(RunAccess::Any.permits(None, Some(&alice)));
    }
}
