//! The guards' reading of text: words as the guards compare them (numbers with their separators
//! kept whole), and the day words a date is named with, typing slips forgiven. Imports nothing of
//! the guards themselves, so that every guard can use it.

/// Lowercase words: letters, digits, apostrophes (typographic ones folded to `'`), `-` between
/// letters ("twenty-five"), and `.`, `,`, `/`, `:`, `-` between digits ("2.5", "1,000",
/// "05/03/2024", "10:30"), so a number and its separators stay one literal.
pub(crate) fn words(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut words = Vec::new();
    let mut word = String::new();
    for (i, &c) in chars.iter().enumerate() {
        let prev = i.checked_sub(1).map(|p| chars[p]);
        let next = chars.get(i + 1).copied();
        let joins = match c {
            '.' | ',' | '/' | ':' => {
                prev.is_some_and(|p| p.is_ascii_digit()) && next.is_some_and(|n| n.is_ascii_digit())
            }
            '-' => {
                let both = |f: fn(&char) -> bool| {
                    prev.as_ref().is_some_and(f) && next.as_ref().is_some_and(f)
                };
                both(char::is_ascii_digit) || both(|c| c.is_alphabetic())
            }
            _ => false,
        };
        // Checked first: U+02BC is a letter to Unicode, but typed as an apostrophe ("donʼt").
        if matches!(c, '\'' | '\u{2019}' | '\u{2018}' | '\u{02BC}') {
            word.push('\'');
        } else if c.is_alphanumeric() || joins {
            word.extend(c.to_lowercase());
        } else if !word.is_empty() {
            words.push(std::mem::take(&mut word));
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

pub(crate) const WEEKDAYS: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

/// "may" is left out: it is mostly a verb. "march" stays: as a verb it is rare in questions.
pub(crate) const MONTHS: [&str; 11] = [
    "january",
    "february",
    "march",
    "april",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

/// Days relative to now, and the other named parts of the calendar and the clock: "on weekdays" is
/// not "at weekends", "at noon" not "at midnight".
pub(crate) const RELATIVE_DAYS: [&str; 8] = [
    "today",
    "tomorrow",
    "yesterday",
    "tonight",
    "weekday",
    "weekend",
    "noon",
    "midnight",
];

/// A weekday, month or relative day, plurals folded ("sundays" → sunday). A weekday also matches
/// with one letter left out or two neighbours swapped ("mondys", "firday", "wendesday"), since
/// users type fast; not with a letter changed, which would make "sundry" a Sunday.
pub(crate) fn date_word(word: &str) -> Option<&'static str> {
    let singular = word.strip_suffix('s').unwrap_or(word);
    let exact = WEEKDAYS
        .iter()
        .chain(&MONTHS)
        .chain(&RELATIVE_DAYS)
        .find(|d| **d == word || **d == singular);
    if let Some(d) = exact {
        // Tonight is part of today: "open tonight?" asks of today.
        return Some(if *d == "tonight" { "today" } else { d });
    }
    WEEKDAYS
        .iter()
        .find(|d| [word, singular].iter().any(|w| is_slip_of(w, d)))
        .copied()
}

/// `typed` is `word` with one letter left out, or with two neighbouring letters swapped.
pub(crate) fn is_slip_of(typed: &str, word: &str) -> bool {
    let (t, w) = (typed.as_bytes(), word.as_bytes());
    if t.len() + 1 == w.len() {
        return (0..w.len()).any(|skip| {
            w.iter()
                .enumerate()
                .filter(|(i, _)| *i != skip)
                .map(|(_, b)| b)
                .eq(t.iter())
        });
    }
    if t.len() == w.len() {
        let differ: Vec<usize> = (0..t.len()).filter(|i| t[*i] != w[*i]).collect();
        return differ.len() == 2
            && differ[1] == differ[0] + 1
            && t[differ[0]] == w[differ[1]]
            && t[differ[1]] == w[differ[0]];
    }
    false
}
