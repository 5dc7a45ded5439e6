//! JSON numbers as the host compares them. The workspace keeps numbers as their JSON text
//! (serde_json's `arbitrary_precision`), so integers of any size cross the bridge exactly; a float
//! the child wrote (`1e-05`, Python's repr) is rewritten as serde_json writes that `f64`
//! (`0.00001`), so values from the code equal the same values built on the host.

use serde_json::{Number, Value};

/// Rewrites every float in `value` (a number with a fraction or an exponent) as serde_json writes
/// its `f64`; integers, whatever their size, are left as written. Floats are exact either way: both
/// forms are the shortest text of the same `f64`.
pub fn canonical_floats(value: &mut Value) {
    match value {
        Value::Number(number) => {
            let text = number.to_string();
            if text.contains(['.', 'e', 'E']) {
                if let Some(canonical) = number.as_f64().and_then(Number::from_f64) {
                    *number = canonical;
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(canonical_floats),
        Value::Object(map) => map.values_mut().for_each(canonical_floats),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn floats_equal_the_hosts_and_integers_keep_every_digit() {
        let mut value: Value = serde_json::from_str(
            r#"[1.000010000100001e-05, 2.5, 1e300, 1267650600228229401496703205376, -3]"#,
        )
        .unwrap();
        canonical_floats(&mut value);
        assert_eq!(value[0], json!(1.000010000100001e-05));
        assert_eq!(value[1], json!(2.5));
        assert_eq!(value[2], json!(1e300));
        assert_eq!(value[3].to_string(), "1267650600228229401496703205376");
        assert_eq!(value[4], json!(-3));
    }
}
