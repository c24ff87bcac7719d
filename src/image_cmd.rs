//! `detvisor image build`: an OCI image layout (or a directory) -> a node image file.
//!
//! A node image is a reproducible gzip'd newc initramfs holding the image's root filesystem
//! and its OCI config at `/detvisor/image.json` (see `image_builder::node`). The detvisor
//! agent is deliberately *not* put in node images: `detvisor up` adds it once for the whole
//! guest and grafts each node's tree under a directory of its own.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{ArgGroup, Args, Subcommand};
use image_builder::{
    flatten, parse_oci_ref, read_image, sha256_digest, write_node_image, ImageConfig, ImageError,
    RootFs,
};

#[derive(Subcommand, Debug)]
pub enum ImageCommand {
    /// Build a node image (a reproducible gzip'd newc initramfs with the image's config at
    /// /detvisor/image.json) from an OCI image layout or a directory. The detvisor agent is
    /// not included: `detvisor up` adds it once for the whole guest.
    Build(BuildArgs),
}

#[derive(Args, Debug)]
#[command(group(ArgGroup::new("source").required(true).args(["oci", "rootfs"])))]
pub struct BuildArgs {
    /// OCI image layout directory, with an optional tag: ./etcd-oci:latest (linux/amd64).
    #[arg(long, value_name = "LAYOUT[:TAG]")]
    pub oci: Option<String>,
    /// A host directory to use as the root filesystem (owners become root, sockets are
    /// skipped, the config is empty).
    #[arg(long, value_name = "DIR")]
    pub rootfs: Option<PathBuf>,
    /// Where to write the node image (written to FILE.partial, then renamed).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

pub fn run(cmd: ImageCommand) -> Result<u8> {
    match cmd {
        ImageCommand::Build(args) => build(&args),
    }
}

fn build(args: &BuildArgs) -> Result<u8> {
    let (config, root) = match (&args.oci, &args.rootfs) {
        (Some(oci), _) => {
            let r = parse_oci_ref(oci).map_err(flat)?;
            let (config, layers) = read_image(&r)
                .map_err(flat)
                .with_context(|| format!("cannot read OCI image {oci}"))?;
            let root = flatten(&layers)
                .map_err(flat)
                .with_context(|| format!("cannot flatten the layers of OCI image {oci}"))?;
            (config, root)
        }
        // The errors name the host path.
        (None, Some(dir)) => (ImageConfig::default(), RootFs::from_dir(dir).map_err(flat)?),
        (None, None) => unreachable!("clap requires --oci or --rootfs"),
    };
    let mut bytes = Vec::new();
    write_node_image(&config, &root, &mut bytes)
        .map_err(flat)
        .context("cannot build the node image")?;
    write_atomically(&args.out, &bytes)?;
    let files = root
        .entries()
        .filter(|(_, node)| node.data().is_some())
        .count();
    eprintln!(
        "detvisor: wrote {}: {} entries ({files} regular files), {} bytes, {}",
        args.out.display(),
        root.len(),
        bytes.len(),
        sha256_digest(&bytes)
    );
    Ok(0)
}

/// The error as one message: `ImageError` messages already include their I/O or JSON cause,
/// which `{:#}` would print a second time from the source chain.
fn flat(e: ImageError) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// Writes `bytes` to `out` through `out.partial` and a rename, so that `out` is either the
/// old file or the complete new one; the partial file is removed on failure.
fn write_atomically(out: &Path, bytes: &[u8]) -> Result<()> {
    let mut name = out
        .file_name()
        .with_context(|| format!("--out {} does not name a file", out.display()))?
        .to_owned();
    name.push(".partial");
    let partial = out.with_file_name(name);
    let result = (|| -> std::io::Result<()> {
        let mut f = fs::File::create(&partial)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&partial, out)
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&partial);
        return Err(e).with_context(|| format!("cannot write {}", out.display()));
    }
    Ok(())
}
