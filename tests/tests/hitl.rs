//! Human in the loop: suspend on an approval, persist, resume by deterministic replay of the journal.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use runpython_core::{tool_fn, Envelope, Error, RunPython, Status, Store};
use serde_json::{json, Value};

struct Fixture {
    _dir: tempfile::TempDir,
    python: RunPython,
    pay_calls: Arc<AtomicUsize>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&format!("file://{}", dir.path().display())).unwrap();
    let pay_calls = Arc::new(AtomicUsize::new(0));
    let calls = Arc::clone(&pay_calls);
    let python = RunPython::builder()
        .store(store)
        .approval("request_approval")
        .max_suspensions(3)
        .tool(tool_fn("pay", "Pays.", None, move |a| {
            let calls = Arc::clone(&calls);
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok(json!(format!(
                    "paid {}",
                    a.arg(0, "amount").cloned().unwrap_or(Value::Null)
                )))
            }
        }))
        .build()
        .unwrap();
    Fixture {
        _dir: dir,
        python,
        pay_calls,
    }
}

fn decision(id: &str, value: Value) -> HashMap<String, Value> {
    HashMap::from([(id.to_owned(), value)])
}

fn suspension_id(e: &Envelope) -> String {
    assert_eq!(e.status, Status::Suspended, "{:?}", e.error);
    e.suspension.as_ref().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

const PAYMENT: &str = "receipt = pay(10)\nok = request_approval('send 100 EUR?', amount=100)\nfinal = pay(100) if ok == 'yes' else 'not sent'\n[receipt, ok, final]";

#[tokio::test(flavor = "multi_thread")]
async fn approve_resumes_without_repeating_side_effects() {
    let f = fixture();
    let e = f.python.run(PAYMENT).await.unwrap();
    let s = e.suspension.clone().unwrap();
    assert_eq!(s["tool"], "request_approval");
    assert_eq!(
        s["args"],
        json!({"args": ["send 100 EUR?"], "kwargs": {"amount": 100}})
    );
    assert_eq!(s["run_id"], json!(e.run_id));
    assert_eq!(f.pay_calls.load(Ordering::SeqCst), 1);
    let done = f
        .python
        .resume(&e.run_id, decision(&suspension_id(&e), json!("yes")))
        .await
        .unwrap();
    assert_eq!(done.status, Status::Success, "{:?}", done.error);
    assert_eq!(done.run_id, e.run_id, "the resumed run keeps its id");
    assert_eq!(done.return_value, json!(["paid 10", "yes", "paid 100"]));
    assert_eq!(
        f.pay_calls.load(Ordering::SeqCst),
        2,
        "the first payment was replayed, not repeated"
    );
    let again = f
        .python
        .resume(&e.run_id, HashMap::new())
        .await
        .unwrap_err();
    assert!(again.to_string().contains("already finished"), "{again}");
}

#[tokio::test(flavor = "multi_thread")]
async fn reject_takes_the_other_branch() {
    let f = fixture();
    let e = f.python.run(PAYMENT).await.unwrap();
    let done = f
        .python
        .resume(&e.run_id, decision(&suspension_id(&e), json!("no")))
        .await
        .unwrap();
    assert_eq!(done.return_value, json!(["paid 10", "no", "not sent"]));
    assert_eq!(f.pay_calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_suspensions_in_one_script() {
    let f = fixture();
    let code = "a = request_approval('first')\nb = request_approval('second')\n[a, b]";
    let e = f.python.run(code).await.unwrap();
    let first = suspension_id(&e);
    let e = f
        .python
        .resume(&e.run_id, decision(&first, json!(1)))
        .await
        .unwrap();
    let second = suspension_id(&e);
    assert_ne!(first, second);
    assert_eq!(
        e.suspension.as_ref().unwrap()["args"]["args"],
        json!(["second"])
    );
    let done = f
        .python
        .resume(&e.run_id, decision(&second, json!(2)))
        .await
        .unwrap();
    assert_eq!(done.return_value, json!([1, 2]));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_script_that_calls_differently_on_replay_is_reported_as_diverged() {
    let f = fixture();
    // The first call's argument changes between runs, so the replay sees another call at step 0.
    let code = "import time\npay(time.time_ns())\nrequest_approval('go?')\n'done'";
    let e = f.python.run(code).await.unwrap();
    let done = f
        .python
        .resume(&e.run_id, decision(&suspension_id(&e), json!(true)))
        .await
        .unwrap();
    assert_eq!(done.status, Status::Error);
    let err = done.error.unwrap();
    assert_eq!(err.kind, "ReplayDiverged");
    assert!(
        err.message.contains("step 0") && err.message.contains("pay("),
        "{}",
        err.message
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn once_keeps_a_changing_value_stable_across_resume() {
    let f = fixture();
    let code = "import time\nt = once(time.time_ns)\npay(t)\nrequest_approval('go?')\nt";
    let e = f.python.run(code).await.unwrap();
    let done = f
        .python
        .resume(&e.run_id, decision(&suspension_id(&e), json!(true)))
        .await
        .unwrap();
    assert_eq!(done.status, Status::Success, "{:?}", done.error);
    assert_eq!(f.pay_calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn gathered_calls_before_a_suspension_are_replayed_in_any_order() {
    let f = fixture();
    let code = "import asyncio\nr = await asyncio.gather(*[pay(i) for i in range(8)])\nok = request_approval('go?')\n[len(r), ok]";
    let e = f.python.run(code).await.unwrap();
    assert_eq!(f.pay_calls.load(Ordering::SeqCst), 8);
    let done = f
        .python
        .resume(&e.run_id, decision(&suspension_id(&e), json!("y")))
        .await
        .unwrap();
    assert_eq!(done.return_value, json!([8, "y"]), "{:?}", done.error);
    assert_eq!(
        f.pay_calls.load(Ordering::SeqCst),
        8,
        "no gathered call ran twice"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_suspension_ids_and_too_many_suspensions_are_clear_errors() {
    let f = fixture();
    let e = f.python.run(PAYMENT).await.unwrap();
    let err = f
        .python
        .resume(&e.run_id, decision("s99", json!(1)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)));
    assert!(
        err.to_string().contains("s99") && err.to_string().contains("waits on"),
        "{err}"
    );
    let err = f
        .python
        .resume("01nosuchrun", HashMap::new())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no checkpoint"), "{err}");

    // max_suspensions(3): the fourth approval raises in the code instead of suspending.
    let code = "r = []\nfor i in range(5):\n    try:\n        r.append(request_approval(i))\n    except RuntimeError as e:\n        r.append(str(e))\n        break\nr";
    let mut e = f.python.run(code).await.unwrap();
    for round in 0..3 {
        e = f
            .python
            .resume(&e.run_id, decision(&suspension_id(&e), json!(round)))
            .await
            .unwrap();
    }
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    let r = e.return_value.as_array().unwrap();
    assert_eq!(&r[..3], &[json!(0), json!(1), json!(2)]);
    assert!(
        r[3].as_str().unwrap().contains("limit of 3 suspensions"),
        "{r:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn approval_without_a_store_is_a_configuration_error() {
    let err = RunPython::builder().approval("ask").build().unwrap_err();
    assert!(err.to_string().contains("need a store"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_inner_suspension_suspends_the_outer_run_and_resumes_through_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&format!("file://{}", dir.path().display())).unwrap();
    let python = RunPython::builder()
        .store(store)
        .approval("request_approval")
        .allow_nested(2)
        .build()
        .unwrap();
    let code = "inner = run_python(code=\"ok = request_approval('deploy?')\\n'deployed' if ok else 'held'\")\n\
                [inner['status'], inner['return_value']]";
    let e = python.run(code).await.unwrap();
    assert_eq!(e.status, Status::Suspended, "{:?}", e.error);
    let s = e.suspension.clone().unwrap();
    assert_eq!(s["tool"], "run_python");
    assert_eq!(s["args"]["suspension"]["tool"], "request_approval", "{s}");
    assert_eq!(s["args"]["suspension"]["args"]["args"], json!(["deploy?"]));
    let done = python
        .resume(&e.run_id, decision(&suspension_id(&e), json!(true)))
        .await
        .unwrap();
    assert_eq!(done.status, Status::Success, "{:?}", done.error);
    assert_eq!(done.return_value, json!(["success", "deployed"]));
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_suspended_run_removes_its_checkpoint() {
    let f = fixture();
    let e = f.python.run(PAYMENT).await.unwrap();
    assert_eq!(e.status, Status::Suspended);
    f.python
        .store()
        .unwrap()
        .delete_run(&e.run_id)
        .await
        .unwrap();
    let err = f
        .python
        .resume(&e.run_id, HashMap::new())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no checkpoint"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn large_results_are_kept_beside_the_journal_and_replayed_from_there() {
    let f = fixture();
    // A 200 KB result and a 100 KB once() value: both over the journal's inline threshold.
    let code = "big = pay('x' * 200_000)\nnonce = once(lambda: 'y' * 100_000)\n\
                ok = request_approval('go?')\n[len(big), big[:8], len(nonce), ok]";
    let e = f.python.run(code).await.unwrap();
    let id = suspension_id(&e);
    assert_eq!(f.pay_calls.load(Ordering::SeqCst), 1);
    let done = f
        .python
        .resume(&e.run_id, decision(&id, json!("yes")))
        .await
        .unwrap();
    assert_eq!(done.status, Status::Success, "{:?}", done.error);
    assert_eq!(
        done.return_value,
        json!([200_007, "paid \"xx", 100_000, "yes"]),
        "the replayed values are the journaled ones"
    );
    assert_eq!(f.pay_calls.load(Ordering::SeqCst), 1, "pay ran once");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resumed_run_sees_its_files_and_exact_values_again() {
    // Both were missing from the checkpoint: a resumed run had no files, and its tagged inputs came
    // back as plain dicts.
    let f = fixture();
    let code =
        "data = open('in.csv').read()\nok = request_approval('go?')\n(data, type(x).__name__, ok)";
    let request = runpython_core::RunRequest::new(code)
        .file("in.csv", b"a,b\n1,2\n".to_vec())
        .input("x", json!({"$rp": "tuple", "v": [1, 2]}))
        .typed();
    let e = f.python.run(request).await.unwrap();
    let resumed = f
        .python
        .resume(&e.run_id, decision(&suspension_id(&e), json!("yes")))
        .await
        .unwrap();
    assert_eq!(resumed.status, Status::Success, "{:?}", resumed.error);
    assert_eq!(
        resumed.return_typed,
        Some(json!({"$rp": "tuple", "v": ["a,b\n1,2\n", "tuple", "yes"]}))
    );
}
