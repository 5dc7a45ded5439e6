//! Files in through the CLI and MCP: `artifacts put` stores a host file and prints its id, `run
//! --file` puts a host file or a stored one in the run (pandas reads the CSV), MCP's `files` takes
//! stored ids, and uploads only where the operator allows them, within their bound; and data out:
//! an MCP call that plots gets its chart as an `image` content block.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

mod common;

use common::{envelope, runpython, text};
use serde_json::{json, Value};

const CSV: &str = "name,age\nada,36\nalan,41\n";

#[test]
fn a_csv_put_in_the_store_or_passed_as_a_file_is_read_by_pandas() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let csv = dir.path().join("people.csv");
    std::fs::write(&csv, CSV).unwrap();
    let put = runpython(&[
        "artifacts",
        "put",
        csv.to_str().unwrap(),
        "--store",
        &store,
        "--json",
    ]);
    assert!(put.status.success(), "{}", text(&put.stderr));
    let put = envelope(&put);
    let id = put["id"].as_str().unwrap().to_owned();
    assert_eq!(put["bytes"], CSV.len());
    // Listed (a run of its own keeps it from gc), readable back.
    let list = envelope(&runpython(&[
        "artifacts",
        "list",
        "--json",
        "--store",
        &store,
    ]));
    assert!(list.to_string().contains(&id), "{list}");
    let code = "import pandas as pd\nlist(pd.read_csv('people.csv')['age'])";
    for file in [format!("@{id}=people.csv"), csv.display().to_string()] {
        let out = runpython(&[
            "run", "--json", "--store", &store, "--file", &file, "-c", code,
        ]);
        let e = envelope(&out);
        assert_eq!(e["status"], "success", "{file}: {e}");
        assert_eq!(e["return_value"], json!([36, 41]), "{file}: {e}");
    }
    // Another tenant's id is a missing one; a path that is not a file says so; exit 2 for both.
    let out = runpython(&[
        "run",
        "--json",
        "--store",
        &store,
        "--tenant",
        "bob",
        "--file",
        &format!("@{id}=people.csv"),
        "-c",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("no artifact"),
        "{}",
        text(&out.stderr)
    );
    let out = runpython(&[
        "run",
        "--no-store",
        "--file",
        dir.path().to_str().unwrap(),
        "-c",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("not a regular file"),
        "{}",
        text(&out.stderr)
    );
}

/// `tools/call run_python` with `arguments`, over `runpython mcp ARGS`' stdio: the reply.
fn mcp_call(args: &[&str], arguments: Value) -> Value {
    common::mcp_call(args, &[], arguments).0
}

#[test]
fn mcp_takes_stored_files_by_id_and_uploads_only_where_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let csv = dir.path().join("people.csv");
    std::fs::write(&csv, CSV).unwrap();
    let put = envelope(&runpython(&[
        "artifacts",
        "put",
        csv.to_str().unwrap(),
        "--store",
        &store,
        "--json",
    ]));
    let id = put["id"].as_str().unwrap();
    let code = "open('people.csv').read().splitlines()[2]";
    let reply = mcp_call(
        &["--store", &store],
        json!({"code": code, "files": [{"name": "people.csv", "artifact_id": id}]}),
    );
    assert!(reply.to_string().contains("alan,41"), "{reply}");
    // Uploads: refused by default, accepted within --max-upload-bytes, refused over it.
    let upload = json!({"code": code, "files": [{"name": "people.csv", "content_base64": "bmFtZSxhZ2UKYWRhLDM2CmFsYW4sNDEK"}]});
    let refused = mcp_call(&["--no-store"], upload.clone());
    assert!(
        refused.to_string().contains("does not accept file uploads"),
        "{refused}"
    );
    let accepted = mcp_call(&["--no-store", "--max-upload-bytes", "4K"], upload);
    assert!(accepted.to_string().contains("alan,41"), "{accepted}");
    let big = "QUFB".repeat(2000); // 6,000 bytes
    let over = mcp_call(
        &["--no-store", "--max-upload-bytes", "4K"],
        json!({"code": "1", "files": [{"name": "big", "content_base64": big}]}),
    );
    assert!(
        over.to_string().contains("over this server's 4096"),
        "{over}"
    );
}

#[test]
fn an_mcp_call_that_plots_gets_the_chart_as_an_image_block() {
    use base64::Engine as _;
    let code = "import matplotlib.pyplot as plt\nplt.figure(figsize=(3, 2), dpi=100)\nplt.plot([1, 3, 2])\nplt.title('sales')\nplt.show()";
    let reply = mcp_call(&["--no-store"], json!({"code": code}));
    let content = reply["result"]["content"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let image = content
        .iter()
        .find(|c| c["type"] == "image")
        .unwrap_or_else(|| panic!("no image block: {reply}"));
    assert_eq!(image["mimeType"], "image/png");
    let png = base64::engine::general_purpose::STANDARD
        .decode(image["data"].as_str().unwrap())
        .unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let (w, h) = (
        u32::from_be_bytes(png[16..20].try_into().unwrap()),
        u32::from_be_bytes(png[20..24].try_into().unwrap()),
    );
    assert_eq!((w, h), (300, 200));
    // The envelope itself carries the display by reference, never the image's bytes.
    let structured = reply["result"]["structuredContent"].to_string();
    assert!(
        !structured.contains(image["data"].as_str().unwrap()),
        "{structured}"
    );
    assert_eq!(
        reply["result"]["structuredContent"]["displays"][0]["formats"]["image/png"]["width"],
        300
    );
    // With no image budget, the chart is not sent inline.
    let reply = mcp_call(
        &["--no-store", "--max-image-bytes", "0"],
        json!({"code": code}),
    );
    assert!(!reply.to_string().contains("\"type\":\"image\""), "{reply}");
}
