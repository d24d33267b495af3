//! Text an agent controls (file names, agent names, reasons), made safe to show a person:
//! a leaf used by the CLI's tables and the desktop prompts alike.

/// `s` with control characters shown escaped (`\u{1b}`, `\n`), so a crafted name cannot
/// move a terminal's cursor, erase or fake a row of a table, or add lines to a prompt.
pub fn visible(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_owned();
    }
    s.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::visible;

    #[test]
    fn control_characters_are_shown_escaped() {
        assert_eq!(visible("src/a.rs"), "src/a.rs");
        assert_eq!(visible("x\u{1b}[2K\r\ny"), "x\\u{1b}[2K\\r\\ny");
        assert_eq!(visible("tab\there"), "tab\\there");
        assert_eq!(visible("ünïcode"), "ünïcode");
    }
}
