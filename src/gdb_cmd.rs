//! `detvisor gdb MOMENT --listen ADDR`: a gdb remote server on a moment
//! (the `gdb-server` library; this file holds its arguments and printing).

use crate::RunPlaceArgs;
use anyhow::{Context, Result};
use clap::Args;
use gdb_server::{GdbTarget, Timeline};
use helper_vm::client::Placed;
use run::client::InProcess;
use run::moment::Moment;

#[derive(Args, Debug)]
pub struct GdbArgs {
    /// Where the session starts: DIR@<time>, DIR@exit:<n>, DIR@exit:<n>+insn:<k> or DIR/<id>
    /// (reverse execution goes back to it, no further).
    moment: Moment,
    /// Where gdb connects (`target remote ADDR`); port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:1234")]
    listen: String,
    #[command(flatten)]
    place: RunPlaceArgs,
}

pub fn cmd_gdb(args: GdbArgs) -> Result<u8> {
    let listener = gdb_server::bind(&args.listen)?;
    let local = listener.local_addr().context("the listener's address")?;
    // The guests run on the run library's own thread (or in a helper VM):
    // this thread, which holds the socket, is never under the VMM's
    // seccomp filter (docs/security.md).
    let runner = Placed::new(
        helper_vm::placement(args.place.place.host_vm),
        InProcess::new,
        args.place.stall_timeout,
        !args.place.place.no_seccomp,
        false,
    );
    let moment = args.moment.to_string();
    eprintln!("detvisor: gdb: restoring {moment}");
    let timeline = Timeline::open(Box::new(runner), args.moment)?;
    let at = timeline.position();
    eprintln!(
        "detvisor: gdb: at {}, virtual {}; listening on {local} (gdb vmlinux -ex 'target remote {local}')",
        timeline.start(),
        at.virtual_ns
    );
    let mut target = GdbTarget::new(timeline);
    let ended = gdb_server::serve(&listener, &mut target, |peer| {
        eprintln!("detvisor: gdb: connected from {peer}");
    })?;
    eprintln!("detvisor: gdb: {ended:?}");
    target.timeline.close()?;
    Ok(0)
}
