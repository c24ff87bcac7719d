//! Calls the Antithesis Rust SDK as a system under test would: assertions
//! (one always true, one always false, a sometimes, an unreachable never
//! reached), setup_complete, a random draw and an event carrying it.

use antithesis_sdk::prelude::*;
use serde_json::json;

fn main() {
    antithesis_init();
    assert_always!(true, "always true", &json!({"n": 1}));
    assert_always!(false, "always false", &json!({"n": 2}));
    assert_sometimes!(true, "sometimes true", &json!({}));
    if std::env::args().count() > 100 {
        assert_unreachable!("never reached", &json!({}));
    }
    lifecycle::setup_complete(&json!({"ready": true}));
    let value = random::get_random();
    lifecycle::send_event("drew", &json!({ "value": value }));
    println!("sdk-rust-example: drew {value}");
}
