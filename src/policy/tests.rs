//! Tests of the policy API as other modules use it: parsing, validation messages
//! (`file:line:col` + hint), scope / sensitive matching through [`Policy`], and the
//! example policies. Glob details are tested in `compile.rs`, `.intentignore` in
//! `ignore.rs`.

use super::*;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

const FILE: &str = "ws/.orchestration/active_intents.yaml";

fn parse(text: &str) -> Result<Policy, PolicyError> {
    Policy::parse(text, Path::new(FILE))
}

fn parse_ok(text: &str) -> Policy {
    parse(text).unwrap_or_else(|e| panic!("should parse:\n{e}"))
}

/// The error's full text; asserts the common shape on the way.
fn parse_err(text: &str) -> String {
    let e = match parse(text) {
        Ok(p) => panic!("should fail, parsed {} intents", p.intents().len()),
        Err(e) => e,
    };
    let s = e.to_string();
    assert!(s.starts_with(FILE), "error names the file: {s}");
    assert_eq!(s.lines().count(), 2, "message + hint: {s}");
    assert!(
        s.lines().nth(1).is_some_and(|l| l.starts_with("hint: ")),
        "hint line: {s}"
    );
    s
}

const BASIC: &str = "\
intents:
  - id: INT-001
    name: JWT Authentication Migration
    status: IN_PROGRESS
    owned_scope:
      - \"src/auth/**\"
      - \"src/middleware/jwt.ts\"
    constraints: [\"Must not use external auth providers\"]
    acceptance_criteria: [\"Unit tests in tests/auth/ pass\"]
  - id: INT-002
    name: Docs
    status: PAUSED
    owned_scope: [\"docs/\"]
";

#[test]
fn basic_policy_parses() {
    let p = parse_ok(BASIC);
    assert_eq!(p.source(), Path::new(FILE));
    let ids: Vec<&str> = p.intents().iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["INT-001", "INT-002"]);
    let i = p.intent("INT-001").expect("present");
    assert_eq!(i.name, "JWT Authentication Migration");
    assert_eq!(i.status, Status::InProgress);
    assert!(i.selectable());
    assert_eq!(i.owned_scope, ["src/auth/**", "src/middleware/jwt.ts"]);
    assert_eq!(i.constraints, ["Must not use external auth providers"]);
    assert_eq!(i.acceptance_criteria, ["Unit tests in tests/auth/ pass"]);
    assert_eq!(
        i.scope_match(Path::new("src/auth/a/b.ts")).as_deref(),
        Some("owned_scope \"src/auth/**\" of INT-001")
    );
    assert_eq!(
        i.scope_match(Path::new("src/middleware/jwt.ts")).as_deref(),
        Some("owned_scope \"src/middleware/jwt.ts\" of INT-001")
    );
    assert_eq!(i.scope_match(Path::new("src/middleware/cors.ts")), None);
    assert_eq!(
        i.scope_match(Path::new("")),
        None,
        "the root is in no scope"
    );
    assert_eq!(
        i.scope_match(Path::new(OsStr::from_bytes(b"src/auth/\xff")))
            .as_deref(),
        Some("owned_scope \"src/auth/**\" of INT-001")
    );
    let d = p.intent("INT-002").expect("present");
    assert!(!d.selectable());
    assert_eq!(
        d.scope_match(Path::new("docs")).as_deref(),
        Some("owned_scope \"docs/\" of INT-002")
    );
    assert!(p.intent("INT-003").is_none());
    assert!(p.intent("int-001").is_none(), "ids are exact");
    // defaults when `approval:` is absent
    let a = p.approval();
    assert_eq!(
        (a.out_of_scope, a.sensitive_read, a.delete, a.timeout_s),
        (OutOfScope::Deny, SensitiveRead::Ask, DeleteRule::Allow, 60)
    );
}

#[test]
fn status_serializes_as_written() {
    assert_eq!(
        serde_json::to_string(&Status::InProgress).expect("json"),
        "\"IN_PROGRESS\""
    );
    assert_eq!(
        serde_json::to_string(&Status::Done).expect("json"),
        "\"DONE\""
    );
    assert_eq!(Status::Paused.to_string(), "PAUSED");
}

#[test]
fn alternative_spellings() {
    let p =
        parse_ok("active_intents:\n  - id: A\n    status: IN_PROGRESS\n    scope: [\"lib/**\"]\n");
    let a = p.intent("A").expect("present");
    assert_eq!(a.owned_scope, ["lib/**"]);
    assert_eq!(
        a.scope_match(Path::new("lib/x")).as_deref(),
        Some("owned_scope \"lib/**\" of A")
    );

    let s = parse_err("intents: []\nactive_intents: []\n");
    assert!(
        s.starts_with(&format!("{FILE}:2:1: key \"intents\" is given twice")),
        "{s}"
    );
    assert!(
        s.contains("\"intents\" and \"active_intents\" are two spellings"),
        "{s}"
    );
    let s =
        parse_err("intents:\n  - id: A\n    status: DONE\n    owned_scope: [a]\n    scope: [b]\n");
    assert!(
        s.starts_with(&format!("{FILE}:5:5: key \"owned_scope\" is given twice")),
        "{s}"
    );
}

#[test]
fn unknown_keys_are_errors_with_position_and_suggestion() {
    // (text, expected first line, expected hint fragment)
    let table: &[(&str, &str, &str)] = &[
        (
            "intents: []\nintnets: []\n",
            ":2:1: unknown key \"intnets\" at the top level",
            "hint: did you mean \"intents\"? known keys here: intents (or active_intents), sensitive, approval",
        ),
        (
            "intents:\n  - id: A\n    status: IN_PROGRESS\n    owned_scop: [\"src/**\"]\n",
            ":4:5: unknown key \"owned_scop\" in an intent",
            "hint: did you mean \"owned_scope\"? known keys here: id, name, status, owned_scope (or scope), constraints, acceptance_criteria",
        ),
        (
            "approval:\n  out_of_scope: ask\n  timeout: 30\n",
            ":3:3: unknown key \"timeout\" in approval",
            "did you mean \"timeout_s\"?",
        ),
        (
            "intents:\n  - id: A\n    status: DONE\n    acceptance: []\n",
            ":4:5: unknown key \"acceptance\" in an intent",
            "known keys here: id,",
        ),
        ("zzzz: 1\n", ":1:1: unknown key \"zzzz\" at the top level", "hint: known keys here:"),
    ];
    for (text, first, hint) in table {
        let s = parse_err(text);
        assert!(s.starts_with(&format!("{FILE}{first}\n")), "got: {s}");
        assert!(s.contains(hint), "got: {s}");
    }
    // no suggestion when nothing is close
    let s = parse_err("zzzz: 1\n");
    assert!(!s.contains("did you mean"), "{s}");
}

#[test]
fn missing_and_mistyped_values() {
    let s = parse_err("intents:\n  - id: A\n    status: DONE\n  - name: no id\n    status: DONE\n");
    assert!(
        s.starts_with(&format!(
            "{FILE}:4:5: intent has no \"id\" key\nhint: every intent needs a unique id"
        )),
        "{s}"
    );
    let s = parse_err("intents:\n  - id: A\n    name: x\n");
    assert!(
        s.starts_with(&format!(
            "{FILE}:2:5: intent A has no \"status\" key\nhint: add `status: IN_PROGRESS`"
        )),
        "{s}"
    );
    let s = parse_err("intents:\n  - id: A\n    status: DONE\n    owned_scope: \"src/**\"\n");
    assert!(
        s.starts_with(&format!(
            "{FILE}:4:18: expected a list here\nhint: write a list"
        )),
        "{s}"
    );
    let s = parse_err("intents:\n  - id: [A]\n    status: DONE\n");
    assert!(
        s.starts_with(&format!(
            "{FILE}:2:9: expected a plain text value here\nhint: check the shape"
        )),
        "{s}"
    );
    let s = parse_err("intents:\n  - just a string\n");
    assert!(
        s.starts_with(&format!("{FILE}:2:5: expected a mapping")),
        "{s}"
    );
    let s = parse_err("intents: [\n");
    assert!(
        s.starts_with(&format!(
            "{FILE}:1:10: unclosed bracket '['\nhint: fix the yaml"
        )),
        "{s}"
    );
    let s = parse_err("intents: []\n---\nintents: []\n");
    assert!(
        s.starts_with(&format!("{FILE}:2:1: more than one yaml document")),
        "{s}"
    );
    let s = parse_err("- a\n- b\n");
    assert!(s.starts_with(&format!("{FILE}:1:1: ")), "{s}");
}

#[test]
fn semantic_errors_carry_the_entry_position() {
    let table: &[(&str, &str, &str)] = &[
        (
            "intents:\n  - id: A\n    status: DONE\n  - id: B\n    status: DONE\n  - id: A\n    status: DONE\n",
            ":6:9: duplicate intent id \"A\"",
            "hint: intent ids must be unique; \"A\" is first used on line 2",
        ),
        ("intents:\n  - id: \"\"\n    status: DONE\n", ":2:9: empty intent id", "e.g. `id: INT-001`"),
        (
            "intents:\n  - id: \"INT 1\"\n    status: DONE\n",
            ":2:9: intent id \"INT 1\" contains whitespace",
            "letters, digits",
        ),
        (
            "intents:\n  - id: A\n    status: IN_PROGRES\n",
            ":3:13: unknown status \"IN_PROGRES\" for intent A",
            "hint: did you mean \"IN_PROGRESS\"? status is one of IN_PROGRESS, PAUSED, DONE",
        ),
        (
            "intents:\n  - id: A\n    status: in_progress\n",
            ":3:13: unknown status \"in_progress\"",
            "did you mean \"IN_PROGRESS\"?",
        ),
        ("intents:\n  - id: A\n    status: ACTIVE\n", ":3:13: unknown status \"ACTIVE\"", "hint: status is one of"),
        (
            "intents:\n  - id: A\n    status: IN_PROGRESS\n    owned_scope:\n      - \"ok/**\"\n      - \"src/[\"\n",
            ":6:9: invalid glob \"src/[\": unclosed character class; missing ']' (intent A)",
            "write `[*]` for a literal `*`",
        ),
        (
            "intents:\n  - id: A\n    status: IN_PROGRESS\n    owned_scope: [\"/etc/**\"]\n",
            ":4:19: owned_scope glob \"/etc/**\" starts with \"/\" (intent A)",
            "hint: scope globs are relative to the workspace root; drop the leading /",
        ),
        (
            "intents:\n  - id: A\n    status: IN_PROGRESS\n    owned_scope:\n      - src/../../x\n",
            ":5:9: owned_scope glob \"src/../../x\" contains a \"..\" component (intent A)",
            "outside the workspace",
        ),
        (
            "sensitive:\n  - \"ok/**\"\n  - \"../up\"\n",
            ":3:5: sensitive glob \"../up\" contains a \"..\" component",
            "outside the workspace",
        ),
        (
            "approval:\n  out_of_scope: allow\n",
            ":2:17: unknown approval out_of_scope value \"allow\"",
            "hint: approval out_of_scope is one of deny, ask",
        ),
        (
            "approval:\n  sensitive_read: alow\n",
            ":2:19: unknown approval sensitive_read value \"alow\"",
            "did you mean \"allow\"? approval sensitive_read is one of deny, ask, allow",
        ),
        ("approval:\n  delete: deny\n", ":2:11: unknown approval delete value \"deny\"", "one of allow, ask"),
        ("approval:\n  timeout_s: 0\n", ":2:14: approval timeout_s must be a whole number of seconds from 1 to 86400, got \"0\"", "timeout_s: 60"),
        ("approval:\n  timeout_s: 86401\n", ":2:14: approval timeout_s must be", "timeout_s: 60"),
        ("approval:\n  timeout_s: -5\n", ":2:14: approval timeout_s must be a whole number of seconds from 1 to 86400, got \"-5\"", "timeout_s: 60"),
        ("approval:\n  timeout_s: 60s\n", ":2:14: approval timeout_s must be a whole number of seconds from 1 to 86400, got \"60s\"", "timeout_s: 60"),
        ("git: readonly\n", ":1:6: unknown git value \"readonly\"", "did you mean \"read-only\"?"),
    ];
    for (text, first, hint) in table {
        let s = parse_err(text);
        assert!(s.starts_with(&format!("{FILE}{first}")), "got: {s}");
        assert!(s.contains(hint), "got: {s}");
    }
}

#[test]
fn full_error_text() {
    let s = parse_err("intents:\n  - id: INT-001\n    status: IN_PROGRESS\n    owned_scop:\n      - \"src/auth/**\"\n");
    assert_eq!(
        s,
        format!(
            "{FILE}:4:5: unknown key \"owned_scop\" in an intent\n\
             hint: did you mean \"owned_scope\"? known keys here: id, name, status, owned_scope (or scope), \
             constraints, acceptance_criteria; unknown keys are errors so that a typo never silently empties a scope"
        )
    );
}

#[test]
fn approval_values() {
    let p = parse_ok("approval:\n  out_of_scope: ask\n  sensitive_read: deny\n  delete: ask\n  timeout_s: 86400\n");
    let a = p.approval();
    assert_eq!(
        (a.out_of_scope, a.sensitive_read, a.delete, a.timeout_s),
        (OutOfScope::Ask, SensitiveRead::Deny, DeleteRule::Ask, 86400)
    );
    let p = parse_ok("approval:\n  sensitive_read: allow\n  timeout_s: 1\n");
    let a = p.approval();
    assert_eq!(
        (a.out_of_scope, a.sensitive_read, a.delete, a.timeout_s),
        (OutOfScope::Deny, SensitiveRead::Allow, DeleteRule::Allow, 1)
    );
}

#[test]
fn documents_without_intents_are_valid_with_no_intents() {
    // (A file with no document at all is an error: see the test below.)
    for text in [
        "~\n",
        "intents:\n",
        "intents: []\n",
        "active_intents: []\nsensitive: []\n",
    ] {
        let p = parse_ok(text);
        assert!(p.intents().is_empty(), "{text:?}");
        assert_eq!(p.approval().timeout_s, 60, "{text:?}");
        assert_eq!(
            p.sensitive_match(Path::new("a/.env")).as_deref(),
            Some("sensitive default \".env\""),
            "{text:?}"
        );
    }
    // an IN_PROGRESS intent with an empty scope is allowed: it can be selected, writes nothing
    let p = parse_ok("intents:\n  - id: READ-ONLY\n    status: IN_PROGRESS\n");
    let i = p.intent("READ-ONLY").expect("present");
    assert!(i.selectable());
    assert!(i.owned_scope.is_empty());
    assert_eq!(i.scope_match(Path::new("anything")), None);
    assert!(p.summary_table().contains("(empty: no writes)"));
}

#[test]
fn sensitive_defaults_and_extras() {
    let p = parse_ok("sensitive:\n  - \"config/prod/**\"\n  - \"vault/\"\n  - \"*.sql\"\n");
    let table: &[(&str, Option<&str>)] = &[
        (
            "config/prod/db.yaml",
            Some("sensitive \"config/prod/**\" (policy line 2)"),
        ),
        ("config/dev/db.yaml", None),
        ("vault", Some("sensitive \"vault/\" (policy line 3)")),
        ("vault/a/b", Some("sensitive \"vault/\" (policy line 3)")),
        ("dump.sql", Some("sensitive \"*.sql\" (policy line 4)")),
        ("db/dump.sql", None), // anchored like scope globs
        ("DUMP.SQL", None),    // policy globs are case-sensitive as written
        ("deploy/server.key", Some("sensitive default \"*.key\"")),
        ("config/prod/.env", Some("sensitive default \".env\"")), // defaults are listed first
        ("src/SECRET.txt", None),                                 // code, not a secret by kind
        ("cargo-credential/src/secret.rs", None),
        ("docs/credential-provider-protocol.md", None),
        (".env.example", None),
        ("app/.env.sample", None),
        ("app/.env.production", Some("sensitive default \".env.*\"")),
        (
            "home/.aws/credentials",
            Some("sensitive default \".aws/credentials\""),
        ),
        ("certs/store.p12", Some("sensitive default \"*.p12\"")),
        ("x/.npmrc", Some("sensitive default \".npmrc\"")),
        ("src/main.rs", None),
    ];
    for (path, expected) in table {
        assert_eq!(
            p.sensitive_match(Path::new(path)).as_deref(),
            *expected,
            "{path}"
        );
    }
    let empty = Policy::empty();
    assert!(empty.intents().is_empty());
    assert_eq!(empty.source(), Path::new(""));
    assert_eq!(
        empty.sensitive_match(Path::new("x/id_rsa")).as_deref(),
        Some("sensitive default \"id_rsa*\"")
    );
    assert_eq!(
        empty.sensitive_match(Path::new("config/prod/db.yaml")),
        None
    );
}

#[test]
fn alias_bomb_is_rejected_with_a_clear_error() {
    // "billion laughs": 9^9 (387 million) strings if expanded.
    let mut text = String::from("intents:\n  - id: A\n    status: DONE\n    constraints:\n");
    text.push_str(
        "      - &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for (prev, name) in ["a", "b", "c", "d", "e", "f", "g", "h"]
        .iter()
        .zip(["b", "c", "d", "e", "f", "g", "h", "i"])
    {
        let refs = vec![format!("*{prev}"); 9].join(",");
        text.push_str(&format!("      - &{name} [{refs}]\n"));
    }
    let s = parse_err(&text);
    assert!(
        s.contains("the policy exceeds the yaml resource limits")
            || s.contains("too many yaml alias expansions"),
        "{s}"
    );
    assert!(s.contains("billion laughs"), "{s}");

    // A few aliases in a normal policy are fine.
    let p = parse_ok(
        "intents:\n  - id: A\n    status: IN_PROGRESS\n    constraints: &c [\"no new deps\"]\n  \
         - id: B\n    status: IN_PROGRESS\n    constraints: *c\n",
    );
    assert_eq!(p.intent("B").expect("present").constraints, ["no new deps"]);
}

#[test]
fn context_xml_is_escaped() {
    let p = parse_ok(
        "intents:\n  - id: INT-9\n    name: \"Fix <script> & 'quotes' \\\"here\\\"\"\n    status: IN_PROGRESS\n    \
         owned_scope: [\"src/{a,b}/**\"]\n    constraints: [\"a < b && c > d\", \"bell\\a\"]\n",
    );
    let xml = p.intent("INT-9").expect("present").context_xml();
    assert_eq!(
        xml.replace(super::ON_REFUSAL, ""),
        "<intent_context>\n  \
         <id>INT-9</id>\n  \
         <name>Fix &lt;script&gt; &amp; &apos;quotes&apos; &quot;here&quot;</name>\n  \
         <status>IN_PROGRESS</status>\n  \
         <owned_scope>\n    <glob>src/{a,b}/**</glob>\n  </owned_scope>\n  \
         <constraints>\n    <constraint>a &lt; b &amp;&amp; c &gt; d</constraint>\n    <constraint>bell\u{FFFD}</constraint>\n  </constraints>\n  \
         <acceptance_criteria/>\n\
         </intent_context>\n"
    );
}

#[test]
fn context_xml_matches_the_documented_shape() {
    let p = parse_ok(BASIC);
    let xml = p.intent("INT-001").expect("present").context_xml();
    // The refusal hint comes last, before the closing tag.
    assert!(
        xml.ends_with(&format!("{}</intent_context>\n", super::ON_REFUSAL)),
        "{xml}"
    );
    assert!(super::ON_REFUSAL.contains(".intentfs/last_error"));
    assert_eq!(
        xml.replace(super::ON_REFUSAL, ""),
        "<intent_context>\n  <id>INT-001</id>\n  <name>JWT Authentication Migration</name>\n  \
         <status>IN_PROGRESS</status>\n  <owned_scope>\n    <glob>src/auth/**</glob>\n    \
         <glob>src/middleware/jwt.ts</glob>\n  </owned_scope>\n  <constraints>\n    \
         <constraint>Must not use external auth providers</constraint>\n  </constraints>\n  \
         <acceptance_criteria>\n    <criterion>Unit tests in tests/auth/ pass</criterion>\n  \
         </acceptance_criteria>\n</intent_context>\n"
    );
}

#[test]
fn summary_table_lists_every_intent() {
    let table = parse_ok(BASIC).summary_table();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(
        lines[0].starts_with("ID       STATUS       NAME"),
        "{table}"
    );
    assert!(lines[1].starts_with("INT-001  IN_PROGRESS  JWT Authentication Migration  src/auth/**, src/middleware/jwt.ts"), "{table}");
    assert!(
        lines[2].starts_with("INT-002  PAUSED       Docs"),
        "{table}"
    );
    assert!(lines[2].ends_with("docs/"), "{table}");
    assert!(Policy::empty().summary_table().starts_with("no intents"));
}

#[test]
fn example_policies_parse() {
    let p = Policy::parse(
        include_str!("../../policies/example.yaml"),
        Path::new("policies/example.yaml"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let summary: Vec<(&str, Status)> = p
        .intents()
        .iter()
        .map(|i| (i.id.as_str(), i.status))
        .collect();
    assert_eq!(
        summary,
        [
            ("INT-001", Status::InProgress),
            ("INT-002", Status::InProgress),
            ("INT-003", Status::Paused)
        ]
    );
    let auth = p.intent("INT-001").expect("present");
    assert!(auth
        .scope_match(Path::new("tests/auth/login.test.ts"))
        .is_some());
    assert!(auth.scope_match(Path::new("docs/auth.md")).is_none());
    let docs = p.intent("INT-002").expect("present");
    assert!(docs.scope_match(Path::new("README.md")).is_some());
    assert!(docs.scope_match(Path::new("docs/README.md")).is_some());
    assert!(docs.scope_match(Path::new("src/README.md")).is_none());
    assert!(p
        .sensitive_match(Path::new("config/prod/app.yaml"))
        .is_some());
    assert_eq!(p.approval().out_of_scope, OutOfScope::Ask);

    let p = Policy::parse(
        include_str!("../../policies/allow-all.yaml"),
        Path::new("policies/allow-all.yaml"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let all = p.intent("ALL").expect("present");
    assert!(all.selectable());
    assert_eq!(
        all.scope_match(Path::new("any/where/x.rs")).as_deref(),
        Some("owned_scope \"**\" of ALL")
    );
    assert_eq!(
        all.scope_match(Path::new("")).as_deref(),
        Some("owned_scope \"**\" of ALL")
    );
}

#[test]
fn load_reads_files_and_reports_os_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("policy.yaml");
    let e = Policy::load(&path).expect_err("missing");
    let s = e.to_string();
    assert!(
        s.starts_with(&format!(
            "{}: cannot read policy file: no such file or directory",
            path.display()
        )),
        "{s}"
    );
    assert!(s.contains("\nhint: create it"), "{s}");
    assert!(e.position().is_none());

    std::fs::write(&path, BASIC).expect("write");
    let p = Policy::load(&path).expect("loads");
    assert_eq!(p.source(), path);
    assert_eq!(p.intents().len(), 2);

    std::fs::write(&path, b"intents:\n  - id: \xc3\x28\n").expect("write");
    let e = Policy::load(&path).expect_err("not utf-8");
    assert_eq!(e.position().map(|p| (p.line, p.column)), Some((2, 9)));
    assert!(e.to_string().contains("not valid utf-8"), "{e}");

    let e = Policy::load(dir.path()).expect_err("a directory");
    assert!(
        e.to_string()
            .contains("cannot read policy file: is a directory"),
        "{e}"
    );
}

#[test]
fn levenshtein_and_closest() {
    use super::error::{closest, levenshtein};
    assert_eq!(levenshtein("", ""), 0);
    assert_eq!(levenshtein("owned_scop", "owned_scope"), 1);
    assert_eq!(levenshtein("kitten", "sitting"), 3);
    assert_eq!(levenshtein("intnets", "intents"), 2);
    assert_eq!(levenshtein("é", "e"), 1, "counts characters, not bytes");
    assert_eq!(
        closest("timeout", &["out_of_scope", "timeout_s", "delete"]),
        Some("timeout_s")
    );
    assert_eq!(
        closest("xyz", &["out_of_scope", "timeout_s", "delete"]),
        None
    );
}

#[test]
fn an_empty_policy_file_is_an_error_not_a_policy_without_intents() {
    for text in ["", "\n\n", "# only a comment\n", "---\n# c\n...\n", "   \n"] {
        let e = Policy::parse(text, Path::new("p.yaml")).expect_err(text);
        let s = e.to_string();
        assert!(s.contains("empty"), "{text:?}: {s}");
        assert!(s.contains("p.yaml:1:1"), "{text:?}: {s}");
    }
    // An explicit empty list is a policy with no intents.
    let p = Policy::parse("active_intents: []\n", Path::new("p.yaml")).unwrap();
    assert!(p.intents().is_empty());
}

#[test]
fn companion_and_implied_directories_follow_the_globs() {
    let p = Policy::parse(
        "intents:\n  - id: A\n    status: IN_PROGRESS\n    owned_scope: [\"src/middleware/jwt.ts\", \"target/\", \"crate/src/**\", \"docs/*.md\", \"README.md\"]\n",
        Path::new("p.yaml"),
    )
    .unwrap();
    let a = p.intent("A").unwrap();
    for d in ["src/middleware", "", "crate/src", "crate/src/x", "docs"] {
        assert!(
            a.companion_dir(Path::new(d)),
            "{d:?} should be a companion directory"
        );
    }
    for d in ["src", "crate", "src/auth", "docs/sub", "target/x", "other"] {
        assert!(
            !a.companion_dir(Path::new(d)),
            "{d:?} should not be a companion directory"
        );
    }
    for d in ["crate", "crate/src", "src", "src/middleware", "target"] {
        assert!(a.implies_dir(Path::new(d)), "{d:?} should be implied");
    }
    for d in ["", "crate/src/x", "src/auth", "docs/x"] {
        assert!(!a.implies_dir(Path::new(d)), "{d:?} should not be implied");
    }
}

#[test]
fn temporary_names_are_what_tools_use_not_ordinary_files() {
    let p = Policy::parse(
        "intents:\n  - id: A\n    status: IN_PROGRESS\n    owned_scope: [\"src/middleware/jwt.ts\", \"target/\", \"docs/*.md\"]\n",
        Path::new("p.yaml"),
    )
    .unwrap();
    let a = p.intent("A").unwrap();
    let dir = Path::new("src/middleware");
    for n in [
        "sedAb12Cd",
        "XXAb12Cd",
        "tmpab_12cd3",
        "4913",
        ".jwt.ts.swp",
        "jwt.ts~",
        "#jwt.ts#",
        ".#jwt.ts",
        "jwt.ts.tmpc8756b4",
        "jwt.ts.bak",
        ".jwt.ts.Ab12Cd",
    ] {
        assert!(
            a.temp_name(dir, n, false),
            "{n} should pass for a temporary"
        );
    }
    for n in [
        "other.ts", "index.ts", "Makefile", "jwt.ts", "sed", "jwt", ".npmrc", ".envrc", "x~", "#x#",
    ] {
        assert!(
            !a.temp_name(dir, n, false),
            "{n} is an ordinary file, not a temporary"
        );
    }
    // Directories: only a sibling of an in-scope directory, or a name derived from one.
    assert!(
        a.temp_name(Path::new(""), "target7NaLVN", true),
        "cargo's sibling of target/"
    );
    assert!(!a.temp_name(Path::new(""), ".cargo", true));
    assert!(!a.temp_name(dir, "tmpab_12cd3", true));
    assert!(!a.temp_name(Path::new(""), "targetX", false));
    assert!(!a.temp_name(Path::new(""), "Cargo.lock", false));
    assert!(a.temp_name(Path::new("docs"), "index.md.tmp", false));
    assert!(!a.temp_name(Path::new("docs"), "notes.txt", false));
    assert!(
        !a.temp_name(Path::new("src/auth"), "sedAb12Cd", false),
        "not a companion directory"
    );
}

#[test]
fn versions_section_defaults_values_and_errors() {
    let d = parse_ok("intents: []\n");
    let v = d.versions();
    assert!(v.enabled);
    assert_eq!(v.max_file_size, 64 * 1024 * 1024);
    assert!(v.keep.is_none() && v.max_size.is_none());
    assert!(v.not_kept(Path::new("a.rs"), Some(10)).is_none());

    let p = parse_ok(
        "intents: []\nversions:\n  max_file_size: 2 MiB\n  exclude: [\"dist/**\", \"*.log\"]\n  keep: 30d\n  max_size: 10GiB\n",
    );
    let v = p.versions();
    assert_eq!(v.max_file_size, 2 * 1024 * 1024);
    assert_eq!(v.keep, Some(std::time::Duration::from_secs(30 * 86_400)));
    assert_eq!(v.max_size, Some(10 * 1024 * 1024 * 1024));
    let why = v.not_kept(Path::new("dist/app.js"), Some(1)).unwrap();
    assert_eq!(
        why,
        "excluded by versions.exclude \"dist/**\" (policy line 4)"
    );
    assert!(v
        .not_kept(Path::new("app.log"), None)
        .unwrap()
        .contains("\"*.log\""));
    let why = v.not_kept(Path::new("big.bin"), Some(3 << 20)).unwrap();
    assert_eq!(
        why,
        "over the 2 MiB cap (versions.max_file_size): 3145728 bytes"
    );
    assert!(v.not_kept(Path::new("big.bin"), Some(2 << 20)).is_none());

    let off = parse_ok("intents: []\nversions:\n  enabled: false\n");
    assert!(off
        .versions()
        .not_kept(Path::new("a"), Some(1))
        .unwrap()
        .contains("versions off"));

    let e = parse_err("intents: []\nversions:\n  max_file_size: lots\n");
    assert!(e.contains("versions.max_file_size"), "{e}");
    assert!(e.contains("3:"), "{e}");
    assert!(e.contains("64 MiB"), "{e}");
    let e = parse_err("intents: []\nversions:\n  keep: forever\n");
    assert!(e.contains("versions.keep") && e.contains("30d"), "{e}");
    let e = parse_err("intents: []\nversions:\n  max_file_sise: 1 MiB\n");
    assert!(e.contains("max_file_size"), "{e}");
}

#[test]
fn git_is_writable_unless_the_policy_says_read_only() {
    assert!(!Policy::parse("intents: []\n", Path::new(FILE))
        .unwrap()
        .git_read_only());
    assert!(!Policy::parse("git: writable\n", Path::new(FILE))
        .unwrap()
        .git_read_only());
    assert!(Policy::parse("git: read-only\n", Path::new(FILE))
        .unwrap()
        .git_read_only());
}
