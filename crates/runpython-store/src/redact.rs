//! Masking secret values in text before anything is persisted or returned.

use std::borrow::Cow;

/// Parts of an environment variable name that mark its value as secret (matched case-insensitively).
const SECRET_NAME_PARTS: &[&str] = &[
    "KEY",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "CREDENTIAL",
    "AUTH",
    "SESSION",
    "COOKIE",
    "PRIVATE",
    "SIGNATURE",
    "DSN",
];

/// Values shorter than this are never masked: masking `1` or `true` everywhere would destroy output
/// and reveal which common strings are secrets.
pub const MIN_SECRET_LEN: usize = 6;

/// Masks known secret values in text as `[REDACTED:NAME]`.
///
/// Build it from the host's environment with [`Redactor::from_env`] (secret-looking names only) and
/// add every variable explicitly passed through to the child with [`Redactor::add`]. When one secret
/// contains another, the longer one is masked whole.
#[derive(Clone, Default)]
pub struct Redactor {
    /// (value, name), longest value first so the longest match wins.
    secrets: Vec<(String, String)>,
}

impl std::fmt::Debug for Redactor {
    // Never print the values.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field("names", &self.names().collect::<Vec<_>>())
            .finish()
    }
}

impl Redactor {
    /// A redactor that masks nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// True when `name` looks like it holds a secret (`OPENAI_API_KEY`, `GITHUB_TOKEN`, `DB_PASSWORD`).
    pub fn is_secret_name(name: &str) -> bool {
        let upper = name.to_ascii_uppercase();
        SECRET_NAME_PARTS.iter().any(|part| upper.contains(part))
    }

    /// From (name, value) pairs such as `std::env::vars()`: keeps the secret-looking names whose
    /// values are at least [`MIN_SECRET_LEN`] characters.
    pub fn from_env<I, K, V>(vars: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut r = Self::new();
        for (name, value) in vars {
            if Self::is_secret_name(name.as_ref()) {
                r.add(name, value);
            }
        }
        r
    }

    /// Masks `value` as `[REDACTED:name]` whatever the name (for explicitly passed-through variables).
    /// Values shorter than [`MIN_SECRET_LEN`] are ignored.
    pub fn add(&mut self, name: impl AsRef<str>, value: impl AsRef<str>) -> &mut Self {
        let (name, value) = (name.as_ref(), value.as_ref());
        if value.chars().count() >= MIN_SECRET_LEN && !self.secrets.iter().any(|(v, _)| v == value)
        {
            let at = self
                .secrets
                .partition_point(|(v, _)| v.len() >= value.len());
            self.secrets.insert(at, (value.to_owned(), name.to_owned()));
        }
        self
    }

    /// Names of the variables whose values are masked.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.secrets.iter().map(|(_, n)| n.as_str())
    }

    /// True when nothing would be masked.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// `text` with every secret value replaced by `[REDACTED:NAME]`; borrowed when nothing matched.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if self.secrets.is_empty() {
            return Cow::Borrowed(text);
        }
        let (out, _) = self.redact_up_to(text, text.len());
        out
    }

    /// For text that arrives in pieces: the redacted form of the longest head of `text` that no
    /// later text can change (a secret may start in its last bytes and end in the next piece), and
    /// that head's length in bytes. Keep `text[consumed..]` and put it before the next piece; at
    /// the end of the stream call [`redact`](Self::redact) on what is left. Pieces redacted this way
    /// come out exactly as the whole text would.
    pub fn redact_prefix<'a>(&self, text: &'a str) -> (Cow<'a, str>, usize) {
        let longest = self.secrets.first().map_or(0, |(v, _)| v.len());
        if longest == 0 {
            return (Cow::Borrowed(text), text.len());
        }
        // A match may start at any byte before `stop`: all its bytes are in `text`.
        let mut stop = text.len().saturating_sub(longest - 1);
        while !text.is_char_boundary(stop) {
            stop -= 1;
        }
        self.redact_up_to(text, stop)
    }

    /// Redacts matches starting before `stop` (one may run past it); returns the redacted text up to
    /// where scanning stopped, and that position.
    fn redact_up_to<'a>(&self, text: &'a str, stop: usize) -> (Cow<'a, str>, usize) {
        let mut out = String::new();
        let mut copied = 0; // text[..copied] is already in `out`
        let mut i = 0;
        let bytes = text.as_bytes();
        while i < stop {
            let hit = self
                .secrets
                .iter()
                .find(|(v, _)| bytes[i..].starts_with(v.as_bytes()));
            match hit {
                Some((value, name)) => {
                    out.push_str(&text[copied..i]);
                    out.push_str("[REDACTED:");
                    out.push_str(name);
                    out.push(']');
                    i += value.len();
                    copied = i;
                }
                None => i += 1,
            }
        }
        // `i` is past a match or at `stop`: a character boundary either way.
        let end = i.max(stop);
        if copied == 0 && out.is_empty() {
            return (Cow::Borrowed(&text[..end]), end);
        }
        out.push_str(&text[copied..end]);
        (Cow::Owned(out), end)
    }

    /// A JSON value with secrets masked in every string and object key. Redacting the JSON text
    /// instead would miss secrets that JSON escapes (a `"` or `\` inside the value) and could break
    /// the JSON.
    pub fn redact_json(&self, value: &serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        match value {
            Value::String(s) => Value::String(self.redact(s).into_owned()),
            Value::Array(items) => {
                Value::Array(items.iter().map(|v| self.redact_json(v)).collect())
            }
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (self.redact(k).into_owned(), self.redact_json(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_env() -> Vec<(&'static str, &'static str)> {
        vec![
            ("OPENAI_API_KEY", "sk-live-abcdef123456"),
            ("GITHUB_TOKEN", "ghp_0123456789"),
            ("DB_PASSWORD", "hunter22"),
            ("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI"),
            ("MY_CREDENTIALS", "user:pa55word"),
            ("HTTP_AUTHORIZATION", "Bearer xyz123"),
            ("SHORT_TOKEN", "abc"),
            ("HOME", "/home/someone"),
            ("LANG", "C.UTF-8"),
        ]
    }

    #[test]
    fn secret_looking_host_values_are_masked_with_their_name() {
        let r = Redactor::from_env(host_env());
        let out = r.redact("key=sk-live-abcdef123456 tok=ghp_0123456789 pw=hunter22");
        assert_eq!(
            out,
            "key=[REDACTED:OPENAI_API_KEY] tok=[REDACTED:GITHUB_TOKEN] pw=[REDACTED:DB_PASSWORD]"
        );
        assert!(r
            .redact("Bearer xyz123")
            .contains("[REDACTED:HTTP_AUTHORIZATION]"));
    }

    #[test]
    fn ordinary_variables_and_short_values_are_left_alone() {
        let r = Redactor::from_env(host_env());
        let text = "home=/home/someone lang=C.UTF-8 abc";
        assert!(matches!(r.redact(text), Cow::Borrowed(t) if t == text));
        let names: Vec<_> = r.names().collect();
        assert!(!names.contains(&"SHORT_TOKEN") && !names.contains(&"HOME"));
    }

    #[test]
    fn passed_through_variables_are_masked_whatever_their_name() {
        let mut r = Redactor::from_env(host_env());
        r.add("DATABASE_URL", "postgres://u:p@db/x");
        assert_eq!(
            r.redact("connect postgres://u:p@db/x now"),
            "connect [REDACTED:DATABASE_URL] now"
        );
    }

    #[test]
    fn the_longest_overlapping_secret_is_masked_whole() {
        let mut r = Redactor::new();
        r.add("SHORT", "secret1").add("LONG", "secret12345");
        assert_eq!(
            r.redact("a secret12345 b secret1"),
            "a [REDACTED:LONG] b [REDACTED:SHORT]"
        );
    }

    #[test]
    fn every_occurrence_is_masked_including_adjacent_and_non_ascii_text() {
        let mut r = Redactor::new();
        r.add("K", "päss-wörd");
        assert_eq!(
            r.redact("→päss-wördpäss-wörd←"),
            "→[REDACTED:K][REDACTED:K]←"
        );
    }

    #[test]
    fn json_strings_and_keys_are_masked_and_the_json_stays_valid() {
        let mut r = Redactor::new();
        r.add("TOKEN", "quo\"te\\back");
        let v = serde_json::json!({"a": ["x quo\"te\\back y", 1, null], "quo\"te\\back": true});
        let out = r.redact_json(&v);
        assert_eq!(
            out,
            serde_json::json!({"a": ["x [REDACTED:TOKEN] y", 1, null], "[REDACTED:TOKEN]": true})
        );
    }

    #[test]
    fn text_redacted_in_pieces_comes_out_as_the_whole_text_would() {
        let mut r = Redactor::new();
        r.add("A", "päss-wörd")
            .add("B", "secret12345")
            .add("C", "secret1");
        let text = "x päss-wördsecret12345 y secret1 zsecret1234 päss-wör";
        for piece in 1..12 {
            let (mut out, mut carry) = (String::new(), String::new());
            let chars: Vec<char> = text.chars().collect();
            for chunk in chars.chunks(piece) {
                carry.extend(chunk);
                let (done, consumed) = r.redact_prefix(&carry);
                out.push_str(&done);
                carry.drain(..consumed);
            }
            out.push_str(&r.redact(&carry));
            assert_eq!(out, r.redact(text), "pieces of {piece}");
        }
    }

    #[test]
    fn debug_output_never_shows_secret_values() {
        let r = Redactor::from_env(host_env());
        let dbg = format!("{r:?}");
        assert!(dbg.contains("GITHUB_TOKEN") && !dbg.contains("ghp_"));
    }
}
