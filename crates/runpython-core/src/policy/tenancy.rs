//! The log of refused cross-tenant reads. A tenant's store finds only the tenant's own ids (see
//! [`runpython_store::Store::tenant`]), so a read of another tenant's id is refused exactly like a read
//! of a missing one; whether it was another tenant's is looked up afterwards, off the caller's path
//! (so the answer takes no longer either way), and logged without the data.

use runpython_store::{Held, Store};
use tokio::sync::Semaphore;

/// Lookups at once; a miss while they are all busy is logged as unchecked (a tenant probing random
/// ids costs the store at most this many lookups at a time).
static AUDITS: Semaphore = Semaphore::const_new(2);

/// After `store` (a tenant's) found no `id`: logs, in the background, whether another tenant holds it.
pub(crate) fn audit_miss(store: &Store, held: Held, id: &str, access: &'static str) {
    let Some(tenant) = store.tenant_name() else {
        return; // the default tenant is the operator's: it sees only its own, and audits nothing
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let Ok(permit) = AUDITS.try_acquire() else {
        tracing::info!(%tenant, access, %id, "read of an unknown id (not checked against other tenants: busy)");
        return;
    };
    let (store, tenant, id) = (store.clone(), tenant.to_owned(), id.to_owned());
    runtime.spawn(async move {
        let _permit = permit;
        match store.holders_of(held, &id).await {
            Ok(holders) if holders.is_empty() => {
                tracing::info!(%tenant, access, %id, "read of an unknown id");
            }
            Ok(holders) => {
                let owners: Vec<&str> = holders
                    .iter()
                    .map(|h| h.as_deref().unwrap_or("(default tenant)"))
                    .collect();
                tracing::warn!(
                    %tenant,
                    %access,
                    %id,
                    owners = %owners.join(","),
                    "refused a cross-tenant read: the id is another tenant's"
                );
            }
            Err(e) => {
                tracing::info!(%tenant, access, %id, "read of an unknown id (not checked: {e})")
            }
        }
    });
}
