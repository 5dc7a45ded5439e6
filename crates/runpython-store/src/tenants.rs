//! Tenants: a store scoped to one (every key under its own prefix), and what operator tools need to
//! act on them all.

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use crate::error::{Error, Result};
use crate::layout::{self, Layout};
use crate::store::Store;

/// What an id names, for [`Store::holders_of`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// An artifact (blob) id.
    Artifact,
    /// A run id (its manifest, or the checkpoint of a suspended or durable run).
    Run,
}

impl Store {
    /// The same store scoped to tenant `name`: every run, artifact, checkpoint, session and memo
    /// entry it writes lives under the tenant's own key prefix (`v1/t/<hex of the name>/…`), and
    /// every read finds only what is there, so another tenant's id reads exactly like a missing one
    /// (blobs two tenants share are stored twice: no read can tell that another tenant has them).
    /// The store without a tenant is the default tenant, whose layout is the one written before
    /// tenants existed. Cheap after the first call for a name: the tenant's store is kept, with its
    /// caches.
    pub fn tenant(&self, name: &str) -> Result<Store> {
        if name.is_empty() {
            return Err(Error::InvalidId {
                what: "tenant",
                value: String::new(),
                reason: "must be 1 to 256 bytes long",
            });
        }
        let mut tenants = self.inner.tenants.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(store) = tenants.get(name) {
            return Ok(store.clone());
        }
        let store = self.sibling(Layout::tenant(name)?, Some(name.to_owned()));
        tenants.insert(name.to_owned(), store.clone());
        Ok(store)
    }

    /// The tenant this store is scoped to; `None` for the default tenant.
    pub fn tenant_name(&self) -> Option<&str> {
        self.inner.tenant.as_deref()
    }

    /// The default tenant's store and every named tenant's found in the backend (by the record each
    /// keeps of its name): what operator tools act on when no tenant is given.
    pub async fn every_tenant(&self) -> Result<Vec<Store>> {
        let base = self.default_tenant();
        let mut stores = vec![base.clone()];
        let prefix = layout::prefix(layout::TENANTS);
        let roots = base
            .inner
            .os
            .list_with_delimiter(Some(&prefix))
            .await
            .map_err(|e| base.backend_err("list", &prefix, e))?
            .common_prefixes;
        let mut names = Vec::new();
        for root in roots {
            let record = Path::from(format!("{root}/tenant"));
            if let Some(bytes) = base.read(&record).await? {
                if let Ok(name) = String::from_utf8(bytes.to_vec()) {
                    names.push(name);
                }
            }
        }
        names.sort();
        for name in names {
            stores.push(base.tenant(&name)?);
        }
        Ok(stores)
    }

    /// The default tenant's store of the backend this one uses.
    fn default_tenant(&self) -> Store {
        match &self.inner.tenant {
            None => self.clone(),
            Some(_) => {
                let mut tenants = self.inner.tenants.lock().unwrap_or_else(|p| p.into_inner());
                let existing = tenants.get("").cloned();
                existing.unwrap_or_else(|| {
                    let base = self.sibling(Layout::default_tenant(), None);
                    tenants.insert(String::new(), base.clone());
                    base
                })
            }
        }
    }

    /// The tenants other than this store's that hold `id` (a [`Held`] kind): `None` in the list is the
    /// default tenant. For the log of a refused read only (which another tenant's id it was), never
    /// for an answer to the caller: it lists every tenant and looks in each, so it costs one request
    /// per tenant.
    pub async fn holders_of(&self, held: Held, id: &str) -> Result<Vec<Option<String>>> {
        let mut found = Vec::new();
        for store in self.every_tenant().await? {
            if store.inner.tenant == self.inner.tenant {
                continue;
            }
            let keys = match held {
                Held::Artifact => vec![store.layout().blob(id)?],
                Held::Run => vec![store.layout().run(id)?, store.layout().checkpoint(id)?],
            };
            for key in keys {
                match store.inner.os.head(&key).await {
                    Ok(_) => {
                        found.push(store.inner.tenant.clone());
                        break;
                    }
                    Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(store.backend_err("head", &key, e)),
                }
            }
        }
        Ok(found)
    }

    /// A named tenant's first write leaves its name beside its objects (for operator listings).
    pub(crate) async fn record_tenant(&self) -> Result<()> {
        use std::sync::atomic::Ordering;
        let (Some(name), false) = (
            &self.inner.tenant,
            self.inner.recorded.load(Ordering::Relaxed),
        ) else {
            return Ok(());
        };
        let key = self.layout().tenant_record();
        self.inner
            .os
            .put(&key, Bytes::from(name.clone().into_bytes()).into())
            .await
            .map_err(|e| self.backend_err("put", &key, e))?;
        self.inner.recorded.store(true, Ordering::Relaxed);
        Ok(())
    }
}
