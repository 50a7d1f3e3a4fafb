//! The request sequence of `bench_serve._open_loop`, byte for byte: which request is due when,
//! whether it places or releases, and the HTTP/1.1 frame sent for it.

use std::collections::VecDeque;

/// What request `index` of the sequence does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `POST /v1/place` of an 8-GPU (tp 8) job of this name.
    Place(String),
    /// `POST /v1/release` of the job of this name, placed earlier in the sequence.
    Release(String),
}

impl Action {
    pub fn is_place(&self) -> bool {
        matches!(self, Action::Place(_))
    }

    /// The request as the Python generator's `_frame` writes it: the same request line,
    /// headers (in the same order) and JSON body (`json.dumps` with its default separators).
    pub fn frame(&self) -> Vec<u8> {
        let (path, body) = match self {
            Action::Place(name) => (
                "/v1/place",
                format!(
                    "{{\"job\": {{\"name\": {}, \"parallelism\": {{\"tp\": 8, \"dp\": 1}}}}}}",
                    json_string(name)
                ),
            ),
            Action::Release(name) => ("/v1/release", format!("{{\"job\": {}}}", json_string(name))),
        };
        format!(
            "POST {path} HTTP/1.1\r\nHost: gpuplace\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }
}

/// The `total` requests at `rate` per second: even ones place a job named
/// `<prefix><rate:g>-<index>`; odd ones release the job `keep` places from the end of the list
/// of jobs still placed (Python's `placed[-keep]`) once more than `keep` are placed, else place
/// one more.
pub fn sequence(rate: f64, total: usize, prefix: &str, keep: usize) -> Vec<Action> {
    assert!(keep >= 1, "keep must be at least 1");
    let rate_text = format_g(rate);
    let mut placed: VecDeque<String> = VecDeque::new();
    let mut actions = Vec::with_capacity(total);
    for index in 0..total {
        if index % 2 == 1 && placed.len() > keep {
            let victim = placed
                .remove(placed.len() - keep)
                .expect("the index is inside the list");
            actions.push(Action::Release(victim));
        } else {
            let name = format!("{prefix}{rate_text}-{index}");
            placed.push_back(name.clone());
            actions.push(Action::Place(name));
        }
    }
    actions
}

/// Python's `format(value, "g")`: 6 significant digits, trailing zeros removed, scientific
/// notation (`1e+06`, `1.5e-05`) when the exponent is below -4 or at least 6.
pub fn format_g(value: f64) -> String {
    const PRECISION: i32 = 6;
    if value == 0.0 {
        return if value.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    if value.is_nan() {
        return "nan".to_string();
    }
    if value.is_infinite() {
        return if value > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    // The exponent after rounding to 6 significant digits (9999995 rounds to 1e+07).
    let scientific = format!("{:.*e}", (PRECISION - 1) as usize, value);
    let (mantissa, exponent) = scientific.split_once('e').expect("{:e} writes an exponent");
    let exponent: i32 = exponent.parse().expect("{:e} writes an integer exponent");
    if (-4..PRECISION).contains(&exponent) {
        let decimals = (PRECISION - 1 - exponent) as usize;
        strip_zeros(&format!("{value:.decimals$}")).to_string()
    } else {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", strip_zeros(mantissa), exponent.abs())
    }
}

fn strip_zeros(number: &str) -> &str {
    if number.contains('.') {
        number.trim_end_matches('0').trim_end_matches('.')
    } else {
        number
    }
}

/// A JSON string as Python's `json.dumps` writes it (`ensure_ascii`: every non-ASCII character
/// as `\uXXXX`, astral ones as a surrogate pair).
pub fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(name: &str) -> Action {
        Action::Place(name.to_string())
    }

    fn release(name: &str) -> Action {
        Action::Release(name.to_string())
    }

    #[test]
    fn sequence_places_then_releases_the_job_keep_from_the_end() {
        // keep 2: placed grows to 3 (r10-0, r10-1, r10-2) before the first release, which
        // takes placed[-2] = r10-1; the oldest, r10-0, stays (as in the Python generator).
        let got = sequence(10.0, 10, "r", 2);
        let want = vec![
            place("r10-0"),
            place("r10-1"), // 1 placed, not more than 2: one more placement
            place("r10-2"),
            release("r10-1"), // placed [0, 1, 2]: placed[-2]
            place("r10-4"),
            release("r10-2"), // placed [0, 2, 4]
            place("r10-6"),
            release("r10-4"), // placed [0, 4, 6]
            place("r10-8"),
            release("r10-6"), // placed [0, 6, 8]
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn sequence_with_keep_one_releases_the_newest() {
        let got = sequence(2.5, 6, "warm", 1);
        let want = vec![
            place("warm2.5-0"),
            place("warm2.5-1"), // 1 placed: not more than keep
            place("warm2.5-2"),
            release("warm2.5-2"), // placed [0, 1, 2]: placed[-1]
            place("warm2.5-4"),
            release("warm2.5-4"),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn every_release_names_a_job_placed_before_and_not_yet_released() {
        let actions = sequence(1000.0, 5000, "r", 1024);
        let mut held = std::collections::HashSet::new();
        let mut releases = 0;
        for action in &actions {
            match action {
                Action::Place(name) => assert!(held.insert(name.clone()), "{name} placed twice"),
                Action::Release(name) => {
                    assert!(held.remove(name), "{name} released but not held");
                    releases += 1;
                }
            }
        }
        // Requests 0-1,024 all place; from 1,025 on, every odd request releases.
        assert_eq!(releases, (4999 - 1025) / 2 + 1);
        assert_eq!(held.len(), 1024);
    }

    #[test]
    fn frames_match_the_python_generator() {
        assert_eq!(
            String::from_utf8(place("r100-0").frame()).unwrap(),
            "POST /v1/place HTTP/1.1\r\nHost: gpuplace\r\nContent-Type: application/json\r\n\
             Content-Length: 62\r\n\r\n\
             {\"job\": {\"name\": \"r100-0\", \"parallelism\": {\"tp\": 8, \"dp\": 1}}}"
        );
        assert_eq!(
            String::from_utf8(release("r100-12").frame()).unwrap(),
            "POST /v1/release HTTP/1.1\r\nHost: gpuplace\r\nContent-Type: application/json\r\n\
             Content-Length: 18\r\n\r\n{\"job\": \"r100-12\"}"
        );
    }

    #[test]
    fn format_g_matches_python() {
        // Each value against Python's f"{value:g}".
        let cases = [
            (100.0, "100"),
            (1000.0, "1000"),
            (2.5, "2.5"),
            (0.1, "0.1"),
            (123456.0, "123456"),
            (1234567.0, "1.23457e+06"),
            (1e6, "1e+06"),
            (999999.5, "1e+06"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.0 / 3.0, "0.333333"),
            (33.333333333, "33.3333"),
            (0.5, "0.5"),
        ];
        for (value, want) in cases {
            assert_eq!(format_g(value), want, "{value}");
        }
    }

    #[test]
    fn json_strings_match_python() {
        // Against json.dumps(text).
        assert_eq!(json_string("r100-1"), "\"r100-1\"");
        assert_eq!(json_string("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
        assert_eq!(json_string("é😀"), "\"\\u00e9\\ud83d\\ude00\"");
    }
}
