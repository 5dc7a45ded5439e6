//! Previews of artifacts by kind, from their bytes: what a model reads before deciding to fetch more.
//!
//! CSV/TSV: columns, row count and first rows; JSON: its shape; images: format and dimensions; text: its
//! head; anything else: size and media type. Every preview is one bounded line of text.

use crate::artifact::{sniff, text_preview};

/// Longest preview of a structured kind, in characters.
const STRUCTURED_CHARS: usize = 400;

/// A preview of `bytes`, chosen by the artifact's `name` (its extension) and its magic bytes.
pub(crate) fn preview(name: &str, bytes: &[u8]) -> String {
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    if let Some((format, w, h)) = image_size(bytes) {
        return format!("{format} image, {w}×{h} pixels, {} bytes", bytes.len());
    }
    let structured = match ext.as_str() {
        "csv" => table_preview(bytes, b',', "CSV"),
        "tsv" | "tab" => table_preview(bytes, b'\t', "TSV"),
        "json" => json_preview(bytes),
        _ => None,
    };
    match structured {
        Some(text) => clip(&text, STRUCTURED_CHARS),
        None => text_preview(bytes),
    }
}

fn clip(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}…", &text[..cut]),
    }
}

/// Format and dimensions of a PNG, GIF, JPEG or WebP image.
pub(crate) fn image_size(b: &[u8]) -> Option<(&'static str, u32, u32)> {
    let be32 = |i: usize| {
        b.get(i..i + 4)
            .map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    };
    let be16 = |i: usize| {
        b.get(i..i + 2)
            .map(|s| u32::from(u16::from_be_bytes([s[0], s[1]])))
    };
    let le16 = |i: usize| {
        b.get(i..i + 2)
            .map(|s| u32::from(u16::from_le_bytes([s[0], s[1]])))
    };
    match sniff(b) {
        "image/png" if b.get(12..16) == Some(b"IHDR") => Some(("PNG", be32(16)?, be32(20)?)),
        "image/gif" => Some(("GIF", le16(6)?, le16(8)?)),
        "image/jpeg" => {
            // Walk the segments to the start-of-frame marker, which holds the dimensions.
            let mut i = 2;
            while i + 9 < b.len() {
                if b[i] != 0xFF {
                    return None;
                }
                let marker = b[i + 1];
                let len = usize::try_from(be16(i + 2)?).ok()?;
                let is_sof = matches!(marker, 0xC0..=0xCF) && !matches!(marker, 0xC4 | 0xC8 | 0xCC);
                if is_sof {
                    return Some(("JPEG", be16(i + 7)?, be16(i + 5)?));
                }
                i += 2 + len;
            }
            None
        }
        "image/webp" => match b.get(12..16)? {
            b"VP8X" => {
                let w = 1 + (u32::from(b[24]) | u32::from(b[25]) << 8 | u32::from(b[26]) << 16);
                let h = 1 + (u32::from(b[27]) | u32::from(b[28]) << 8 | u32::from(b[29]) << 16);
                Some(("WebP", w, h))
            }
            b"VP8 " => Some(("WebP", le16(26)? & 0x3FFF, le16(28)? & 0x3FFF)),
            b"VP8L" => {
                let bits = u32::from_le_bytes([*b.get(21)?, *b.get(22)?, *b.get(23)?, *b.get(24)?]);
                Some(("WebP", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1))
            }
            _ => None,
        },
        _ => None,
    }
}

/// Splits one CSV line on `sep`, honouring double quotes (enough for a preview, not a full parser).
fn split_row(line: &str, sep: u8) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            '"' => quoted = !quoted,
            c if !quoted && c as u32 == u32::from(sep) => fields.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    fields.push(field);
    fields
}

fn table_preview(bytes: &[u8], sep: u8, kind: &str) -> Option<String> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = split_row(lines.next()?, sep);
    let rows: Vec<Vec<String>> = lines.clone().take(3).map(|l| split_row(l, sep)).collect();
    let count = lines.count();
    let shown: Vec<String> = header.iter().take(12).map(|h| clip(h.trim(), 30)).collect();
    let more = header.len().saturating_sub(shown.len());
    let mut out = format!(
        "{kind}, {} columns ({}{}), {count} rows",
        header.len(),
        shown.join(", "),
        if more > 0 {
            format!(", +{more} more")
        } else {
            String::new()
        }
    );
    if !rows.is_empty() {
        let first: Vec<String> = rows
            .iter()
            .map(|r| {
                r.iter()
                    .take(12)
                    .map(|f| clip(f.trim(), 20))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .collect();
        out.push_str(&format!("; first rows: {}", first.join(" | ")));
    }
    Some(out)
}

fn json_preview(bytes: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    Some(format!("JSON {}", shape(&value, 0)))
}

fn shape(value: &serde_json::Value, depth: usize) -> String {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let keys: Vec<String> = map.keys().take(10).map(|k| clip(k, 30)).collect();
            let more = map.len().saturating_sub(keys.len());
            format!(
                "object with {} keys ({}{})",
                map.len(),
                keys.join(", "),
                if more > 0 {
                    format!(", +{more} more")
                } else {
                    String::new()
                }
            )
        }
        Value::Array(items) if depth == 0 => match items.first() {
            Some(first) => format!(
                "array of {} items, the first: {}",
                items.len(),
                shape(first, 1)
            ),
            None => "empty array".into(),
        },
        Value::Array(items) => format!("array of {} items", items.len()),
        Value::String(s) => format!("string of {} characters", s.chars().count()),
        Value::Number(n) => format!("number {n}"),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Null => "null".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_preview_lists_columns_rows_and_first_rows() {
        let csv = b"name,age,city\n\"Smith, Ada\",36,London\nBob,41,Paris\n";
        assert_eq!(
            preview("people.csv", csv),
            "CSV, 3 columns (name, age, city), 2 rows; first rows: Smith, Ada, 36, London | Bob, 41, Paris"
        );
        assert!(preview("t.tsv", b"a\tb\n1\t2\n").starts_with("TSV, 2 columns (a, b), 1 rows"));
    }

    #[test]
    fn json_preview_gives_the_shape() {
        assert_eq!(
            preview("r.json", br#"[{"x": 1, "y": 2}, {"x": 3, "y": 4}]"#),
            "JSON array of 2 items, the first: object with 2 keys (x, y)"
        );
        assert_eq!(
            preview("o.json", br#"{"a": 1}"#),
            "JSON object with 1 keys (a)"
        );
    }

    #[test]
    fn image_previews_give_format_and_dimensions() {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        png.extend(640u32.to_be_bytes());
        png.extend(480u32.to_be_bytes());
        assert_eq!(
            preview("chart.png", &png),
            "PNG image, 640×480 pixels, 24 bytes"
        );
        let gif = b"GIF89a\x20\x00\x10\x00";
        assert_eq!(image_size(gif), Some(("GIF", 32, 16)));
        // A minimal JPEG: SOI, an APP0 segment, then SOF0 with height 100 and width 200.
        let jpeg = [
            0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x04, 0x00, 0x00, 0xFF, 0xC0, 0x00, 0x11, 0x08, 0x00,
            100, 0x00, 200, 0x03,
        ];
        assert_eq!(image_size(&jpeg), Some(("JPEG", 200, 100)));
    }

    #[test]
    fn other_files_fall_back_to_text_head_or_size_and_type() {
        assert_eq!(preview("notes.txt", b"hello"), "hello");
        assert_eq!(
            preview("blob.bin", b"%PDF-1.7 \xff\xfe"),
            "11 bytes, application/pdf"
        );
    }
}
