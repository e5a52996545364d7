//! The Python behaviours that Hugging Face chat templates rely on beyond Jinja itself:
//! `tojson` as `json.dumps(x, ensure_ascii=False)` (Python's separators, no HTML escaping —
//! minijinja's own `tojson` escapes `<` and `>`, which would change ChatML text), and
//! `strftime_now(format)` (Llama 3 templates print today's date).

use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// `x | tojson(indent=None, ensure_ascii=False, separators=None, sort_keys=False)`.
pub fn tojson(value: &Value, kwargs: Kwargs) -> Result<String, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be a pair")),
        // json.dumps: ", " without indent, "," with it (the newline follows).
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        ensure_ascii: ensure_ascii.unwrap_or(false),
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    style.write(&mut out, value, 0)?;
    Ok(out)
}

struct JsonStyle {
    indent: Option<usize>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl JsonStyle {
    fn write(&self, out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => write_number(out, value),
            ValueKind::String => self.write_str(out, value.as_str().unwrap_or_default()),
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                let items = keys.into_iter().map(|k| {
                    let v = value.get_item(&k)?;
                    Ok((k, v))
                });
                let items = items.collect::<Result<Vec<_>, Error>>()?;
                self.write_container(out, ('{', '}'), items.len(), depth, |out, i| {
                    let (k, v) = &items[i];
                    self.write_str(out, &k.to_string());
                    out.push_str(&self.key_sep);
                    self.write(out, v, depth + 1)
                })?;
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.write_container(out, ('[', ']'), items.len(), depth, |out, i| {
                    self.write(out, &items[i], depth + 1)
                })?;
            }
            _ => {
                let msg = format!("tojson: cannot serialize a value of kind {}", value.kind());
                return Err(Error::new(ErrorKind::InvalidOperation, msg));
            }
        }
        Ok(())
    }

    fn write_container(
        &self,
        out: &mut String,
        (open, close): (char, char),
        len: usize,
        depth: usize,
        mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if len == 0 {
            out.push(close);
            return Ok(());
        }
        for i in 0..len {
            if i > 0 {
                out.push_str(&self.item_sep);
            }
            self.newline(out, depth + 1);
            item(out, i)?;
        }
        self.newline(out, depth);
        out.push(close);
        Ok(())
    }

    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(width) = self.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', width * depth));
        }
    }

    fn write_str(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Integers as integers; floats as Python prints them (`1.0`, not `1`).
fn write_number(out: &mut String, value: &Value) {
    if let Some(i) = value.as_i64().filter(|_| value.is_integer()) {
        let _ = write!(out, "{i}");
        return;
    }
    let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    match f {
        f if f.is_nan() => out.push_str("NaN"),
        f if f.is_infinite() => out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" }),
        f if f.fract() == 0.0 && f.abs() < 1e16 => {
            let _ = write!(out, "{f:.1}");
        }
        f => {
            let _ = write!(out, "{f}");
        }
    }
}

/// Jinja2's `is iterable`: whatever `iter()` takes, which `None` is not (minijinja iterates
/// none as an empty sequence, so `tools is iterable and tools | length > 0` failed on no tools).
pub fn is_iterable(value: &Value) -> bool {
    !value.is_none() && value.try_iter().is_ok()
}

/// `strftime_now(format)`: the current time, in UTC, formatted like Python's `strftime`.
pub fn strftime_now(format: String) -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    strftime(&format, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];

/// The directives chat templates use; any other `%x` is copied through unchanged.
pub fn strftime(format: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let weekday = (days + 4).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS[month as usize - 1];
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year.rem_euclid(100)),
            Some('m') => write!(out, "{month:02}"),
            Some('d') => write!(out, "{day:02}"),
            Some('-') if chars.clone().next() == Some('d') => {
                chars.next();
                write!(out, "{day}")
            }
            Some('e') => write!(out, "{day:>2}"),
            Some('j') => write!(out, "{day_of_year:03}"),
            Some('H') => write!(out, "{hour:02}"),
            Some('I') => write!(out, "{hour12:02}"),
            Some('M') => write!(out, "{minute:02}"),
            Some('S') => write!(out, "{second:02}"),
            Some('p') => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            Some('B') => write!(out, "{month_name}"),
            Some('b') | Some('h') => write!(out, "{}", &month_name[..3]),
            Some('A') => write!(out, "{}", WEEKDAYS[weekday]),
            Some('a') => write!(out, "{}", &WEEKDAYS[weekday][..3]),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(template: &str, ctx: Value) -> String {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        env.render_str(template, ctx).unwrap()
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let ctx = minijinja::context! { x => serde_json::json!({"a": [1, 2.5, 3.0], "b": "<tag> \"q\" é\n", "c": null, "d": true}) };
        // Python: json.dumps(x, ensure_ascii=False) with the keys in this (sorted) order.
        assert_eq!(
            render("{{ x | tojson }}", ctx.clone()),
            r#"{"a": [1, 2.5, 3.0], "b": "<tag> \"q\" é\n", "c": null, "d": true}"#
        );
        // Python: json.dumps(x, ensure_ascii=False, indent=2).
        assert_eq!(
            render("{{ x | tojson(indent=2) }}", ctx.clone()),
            "{\n  \"a\": [\n    1,\n    2.5,\n    3.0\n  ],\n  \"b\": \"<tag> \\\"q\\\" é\\n\",\n  \"c\": null,\n  \"d\": true\n}"
        );
        assert_eq!(render("{{ 'é😊' | tojson(ensure_ascii=true) }}", ctx), r#""\u00e9\ud83d\ude0a""#);
        assert_eq!(render("{{ [] | tojson(indent=4) }}", Value::UNDEFINED), "[]");
    }

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-07-23 14:05:09 UTC, a Tuesday; Python:
        // datetime.fromtimestamp(1721743509, timezone.utc).strftime(...)
        let t = 1_721_743_509;
        assert_eq!(strftime("%d %b %Y", t), "23 Jul 2024");
        assert_eq!(
            strftime("%A, %B %-d, %Y %H:%M:%S %p %j %y %I%%", t),
            "Tuesday, July 23, 2024 14:05:09 PM 205 24 02%"
        );
        assert_eq!(strftime("%Y-%m-%d %a", 0), "1970-01-01 Thu");
        assert_eq!(strftime("%Y-%m-%d", 951_782_400), "2000-02-29");
    }
}
