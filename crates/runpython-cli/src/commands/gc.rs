//! `runpython gc`: expired runs and the blobs no run references removed, per tenant.

use std::process::ExitCode;

use anyhow::Context as _;

use crate::args::store_flags::StoreArgs;
use crate::human::escape_controls;
use crate::settings;

pub(crate) async fn gc(store: StoreArgs) -> anyhow::Result<ExitCode> {
    let stores = settings::stores(&store).await?;
    let now = std::time::SystemTime::now();
    for store in &stores {
        let report = store
            .gc(now)
            .await
            .with_context(|| match store.tenant_name() {
                Some(name) => format!("gc of tenant {name} failed"),
                None => "gc failed".to_owned(),
            })?;
        let whose = match store.tenant_name() {
            Some(name) => format!("tenant {}: ", escape_controls(name)),
            None if stores.len() > 1 => "default tenant: ".to_owned(),
            None => String::new(),
        };
        say!(
            "{whose}removed {} expired runs, {} unreferenced blobs ({} bytes), {} staging leftovers, {} expired memo entries",
            report.expired_runs.len(),
            report.deleted_blobs,
            report.freed_bytes,
            report.deleted_staging,
            report.expired_memos
        );
        for key in &report.unreadable {
            say_err!("runpython: gc left an unreadable record in place: {key}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
