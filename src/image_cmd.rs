//! `detvisor image build`: an OCI image layout (or a directory) -> a node image file.
//!
//! A node image is a reproducible gzip'd newc initramfs holding the image's root filesystem
//! and its OCI config at `/detvisor/image.json` (see `image_builder::node`). The detvisor
//! agent is deliberately *not* put in node images: `detvisor up` adds it once for the whole
//! guest and grafts each node's tree under a directory of its own.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{ArgGroup, Args, Subcommand};
use image_builder::{write_node_image_file, NodeImageSource};

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
    /// Where to write the node image: a new file or a regular file to replace (written to a
    /// temporary file of a unique name beside it, then renamed).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

pub fn run(cmd: ImageCommand) -> Result<u8> {
    match cmd {
        ImageCommand::Build(args) => build(&args),
    }
}

fn build(args: &BuildArgs) -> Result<u8> {
    let source = match (&args.oci, &args.rootfs) {
        (Some(oci), _) => NodeImageSource::Oci(oci.clone()),
        (None, Some(dir)) => NodeImageSource::Dir(dir.clone()),
        (None, None) => unreachable!("clap requires --oci or --rootfs"),
    };
    let report = write_node_image_file(&source, &args.out)
        .with_context(|| format!("building the node image {}", args.out.display()))?;
    eprintln!(
        "detvisor: wrote {}: {} entries ({} regular files), {} bytes, {}",
        args.out.display(),
        report.entries,
        report.regular_files,
        report.bytes,
        report.digest
    );
    Ok(0)
}
