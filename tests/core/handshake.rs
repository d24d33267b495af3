//! The intent handshake through the control files, and what an identity may do before it.

use intentfs::guard::Code;
use intentfs::ledger::MutationType;

use super::*;

#[test]
fn handshake_selects_the_intent_and_ledgers_the_switch() {
    let c = core(POLICY, &[]);
    assert_eq!(c.ctl(&c.me, "intent"), "");
    c.select("INT-001");
    assert_eq!(c.ctl(&c.me, "intent"), "INT-001\n");
    assert!(c.ctl(&c.me, "context").contains("src/**"));
    // Switching is a second entry, `from` the first.
    c.select("INT-002");
    let sw = c.of(MutationType::Intent);
    assert_eq!(sw.len(), 2, "{sw:?}");
    assert_eq!(sw[0].intent_id.as_deref(), Some("INT-001"));
    assert_eq!(
        sw[0].detail.as_ref().unwrap()["from"],
        serde_json::Value::Null
    );
    assert_eq!(sw[1].detail.as_ref().unwrap()["from"], "INT-001");
    assert_eq!(sw[1].detail.as_ref().unwrap()["to"], "INT-002");
    assert_eq!(sw[1].agent.as_ref().unwrap().identity, "default");
    c.assert_ledger_clean();
}

#[test]
fn handshake_refuses_unknown_and_paused_intents() {
    let c = core(POLICY, &[]);
    c.select("INT-001");
    for bad in ["INT-404", "INT-003"] {
        match c.select_as(&c.me, bad) {
            Err(e) => assert_eq!(e.errno(), libc::EINVAL, "{bad}"),
            Ok(()) => panic!("{bad} was selected"),
        }
        // The selection stands, and the refusal is on record and in last_error.
        assert_eq!(c.ctl(&c.me, "intent"), "INT-001\n");
        let d = c.of(MutationType::Denial);
        let last = d.last().unwrap();
        assert_eq!(last.code.as_deref(), Some("INVALID_INTENT"));
        assert!(c.ctl(&c.me, "last_error").contains(bad));
    }
    assert_eq!(c.of(MutationType::Intent).len(), 1);
}

#[test]
fn nothing_changes_before_the_handshake() {
    let c = core(POLICY, &[("src/a.rs", "a\n")]);
    let before = tree(&c.ws);
    assert_eq!(code(c.create("src/new.rs", "x")), Code::NoIntent);
    c.assert_denial("src/new.rs", Code::NoIntent, "create");
    assert_eq!(code(c.overwrite("src/a.rs", "b\n")), Code::NoIntent);
    c.assert_denial("src/a.rs", Code::NoIntent, "open-write");
    assert_eq!(code(c.unlink("src/a.rs")), Code::NoIntent);
    assert_eq!(code(c.mkdir("src/d")), Code::NoIntent);
    assert_eq!(tree(&c.ws), before);
    // Reading needs no intent.
    assert_eq!(c.read("src/a.rs").unwrap(), b"a\n");
    // After the handshake the same create goes through.
    c.select("INT-001");
    c.create("src/new.rs", "x").unwrap();
    assert_eq!(c.backing("src/new.rs"), "x");
    c.assert_ledger_clean();
}
