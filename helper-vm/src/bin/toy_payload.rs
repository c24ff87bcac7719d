//! A long-lived helper VM payload that serves the toy protocol of `tests/toy` on the channel:
//! what `tests/channel.rs` boots in the helper VM (a bin target so that the test finds it as
//! `CARGO_BIN_EXE_toy_payload`). Run inside L1 only (it opens /dev/virtio-ports/detvisor.0);
//! `serve` is its only argument.

#[path = "../../tests/toy/mod.rs"]
mod toy;

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args != ["serve"] {
        eprintln!("usage: toy_payload serve (inside the helper VM)");
        return std::process::ExitCode::from(2);
    }
    match helper_vm::channel::serve(toy::handle) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("toy payload: {e}");
            std::process::ExitCode::from(3)
        }
    }
}
