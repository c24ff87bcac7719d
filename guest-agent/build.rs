//! Builds the guest-side `libvoidstar.so` shim (agent/shim/libvoidstar.c)
//! with the system C compiler: no libc, no NEEDED entries. The agent embeds
//! it (`include_bytes!`) and installs it in every node; host tests load it
//! from `DETVISOR_SHIM_PATH`.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let source = PathBuf::from("shim/libvoidstar.c");
    println!("cargo:rerun-if-changed={}", source.display());
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let shim = out.join("libvoidstar.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(&cc)
        .args([
            "-O2",
            "-nostdlib",
            "-ffreestanding",
            "-fPIC",
            "-shared",
            "-fno-builtin",
            "-fno-stack-protector",
            "-fvisibility=hidden",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wl,-z,defs",
            "-Wl,--hash-style=both",
            "-Wl,--build-id=none",
            "-o",
        ])
        .arg(&shim)
        .arg(&source)
        .status()
        .unwrap_or_else(|e| panic!("running {cc} to build the libvoidstar shim: {e}"));
    assert!(
        status.success(),
        "{cc} failed to build {}",
        source.display()
    );
    println!("cargo:rustc-env=DETVISOR_SHIM_PATH={}", shim.display());
}
