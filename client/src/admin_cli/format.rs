//! How the admin tables print numbers, times and sizes, and the table builders every renderer
//! uses. Formatting only: no contract types and no HTTP here.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use comfy_table::{presets, CellAlignment, Table};

use crate::admin::truncate_chars;

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Milliseconds with precision that fits their size: `0.42 ms`, `5.10 ms`, `41.2 ms`, `411 ms`, `12.3 s`.
pub fn fmt_ms(ms: f64) -> String {
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else if ms < 100.0 {
        format!("{ms:.1} ms")
    } else if ms < 10_000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.1} s", ms / 1000.0)
    }
}

pub(super) fn fmt_opt_ms(ms: Option<f64>) -> String {
    ms.map(fmt_ms).unwrap_or_else(|| "-".to_owned())
}

/// A 0..=1 share as a percentage.
pub fn fmt_pct(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// An age as its two largest units: `12s`, `3m 12s`, `2h 3m`, `6days 23h`.
pub fn fmt_age(seconds: f64) -> String {
    let whole = Duration::from_secs(seconds.max(0.0).round() as u64);
    let text = humantime::format_duration(whole).to_string();
    text.split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

pub(super) fn fmt_since(then_ms: u64, now_ms: u64) -> String {
    format!(
        "{} ago",
        fmt_age(now_ms.saturating_sub(then_ms) as f64 / 1000.0)
    )
}

pub(super) fn fmt_timestamp(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// Bytes in binary units: `512 B`, `33.8 KiB`, `1.2 MiB`.
pub fn fmt_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// One line of a prompt for a table cell: whitespace collapsed, at most `max` characters.
pub fn one_line(text: &str, max: usize) -> String {
    truncate_chars(&text.split_whitespace().collect::<Vec<_>>().join(" "), max)
}

/// Table style: no borders, no column separators, only a rule under the header (like `kubectl`).
const RULE_UNDER_HEADER: &str = "     ─             ";

/// A borderless table with a rule under the header; `right` lists the columns that hold numbers.
pub(super) fn table(header: &[&str], right: &[usize]) -> Table {
    let mut table = Table::new();
    table.load_preset(RULE_UNDER_HEADER);
    table.set_header(header.to_vec());
    for (index, column) in table.column_iter_mut().enumerate() {
        // Two spaces between columns and none before the first keeps lines copy-pasteable.
        column.set_padding((0, 2));
        if right.contains(&index) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    table
}

/// Two columns, name and value, without a header.
pub(super) fn key_values(rows: Vec<(&str, String)>) -> Table {
    let mut table = Table::new();
    table.load_preset(presets::NOTHING);
    for (key, value) in rows {
        table.add_row(vec![key.to_owned(), value]);
    }
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    table
}

/// Appends `table` line by line. comfy-table pads every line to the full width, trailing padding
/// included, which is noise at the end of a line (and in copy-paste): trailing spaces go, and the
/// header rule is cut to the longest line.
pub(super) fn push_table(out: &mut String, table: &Table) {
    let lines: Vec<String> = table.lines().map(|l| l.trim_end().to_owned()).collect();
    let is_rule = |line: &str| !line.is_empty() && line.chars().all(|c| c == '─');
    let width = lines
        .iter()
        .filter(|l| !is_rule(l))
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(0);
    for line in lines {
        if is_rule(&line) {
            out.extend(std::iter::repeat_n('─', width));
        } else {
            out.push_str(&line);
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_formatted_for_people() {
        assert_eq!(fmt_ms(0.42), "0.42 ms");
        assert_eq!(fmt_ms(5.1), "5.10 ms");
        assert_eq!(fmt_ms(41.25), "41.2 ms");
        assert_eq!(fmt_ms(411.2), "411 ms");
        assert_eq!(fmt_ms(12345.6), "12.3 s");
        assert_eq!(fmt_pct(0.613), "61.3%");
        assert_eq!(fmt_pct(0.0), "0.0%");
        assert_eq!(fmt_age(192.0), "3m 12s");
        assert_eq!(fmt_age(12.0), "12s");
        assert_eq!(fmt_age(7384.0), "2h 3m");
        assert_eq!(fmt_age(0.0), "0s");
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(34567), "33.8 KiB");
        assert_eq!(fmt_bytes(5 * 1024 * 1024), "5.0 MiB");
        assert_eq!(one_line("a\n  b\tc", 10), "a b c");
        assert_eq!(one_line("abcdefghijkl", 5), "abcd…");
    }
}
