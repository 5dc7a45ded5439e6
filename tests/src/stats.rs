//! The benchmark figures' arithmetic, shared by the harness and its parts.

/// The median of `samples` (the upper one of an even count); `samples` must not be empty.
pub fn p50(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// `x` to three decimals, as the figures are reported.
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// One sample of the interpreter floor: milliseconds to start `python -I -S -c pass` and see it exit
/// (the figure every start-up ratio is taken against).
pub fn floor_ms(python: &std::path::Path) -> std::io::Result<f64> {
    let t = std::time::Instant::now();
    std::process::Command::new(python)
        .args(["-I", "-S", "-c", "pass"])
        .stdin(std::process::Stdio::null())
        .status()?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
}
