//! `detvisor image build`: an OCI image layout (or a directory) -> a node image file.
//!
//! A node image is a reproducible gzip'd newc initramfs holding the image's root filesystem
//! and its OCI config at `/detvisor/image.json` (see `image_builder::node`). The detvisor
//! agent is deliberately *not* put in node images: `detvisor up` adds it once for the whole
//! guest and grafts each node's tree under a directory of its own.

use std::path::PathBuf;

use crate::progress::{Mode, Reporter};
use anyhow::{Context, Result};
use clap::{ArgGroup, Args, Subcommand};
use image_builder::{write_node_image_file, BuildProgress, NodeImageSource};
use indicatif::HumanBytes;

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
    /// Show no progress and no closing line (nothing on stderr but
    /// errors). Without it, a terminal gets a live display (layers
    /// unpacked, bytes, ETA) and anything else a line per step.
    #[arg(long)]
    pub quiet: bool,
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
    let mut reporter = Reporter::new(Mode::detect(args.quiet));
    reporter.start(None, 0, false);
    reporter.update(0, format!("reading {}", source_text(&source)));
    let report = write_node_image_file(&source, &args.out, &mut |step| {
        match step {
            // The layers are what takes long: a bar of them, with an ETA.
            BuildProgress::Read { layers, .. } => {
                reporter.start(Some(layers as u64), 0, true);
            }
            BuildProgress::Layer { done, .. } => reporter.update(done as u64, status(&step)),
            BuildProgress::Tree { .. } => {
                reporter.start(None, 0, false);
                reporter.update(0, status(&step));
            }
        }
        reporter.event(&line(&step));
    });
    reporter.finish();
    let report =
        report.with_context(|| format!("building the node image {}", args.out.display()))?;
    reporter.line(&format!(
        "detvisor: wrote {}: {} entries ({} regular files), {} bytes, {}",
        args.out.display(),
        report.entries,
        report.regular_files,
        report.bytes,
        report.digest
    ));
    Ok(0)
}

/// The source as the user gave it.
fn source_text(source: &NodeImageSource) -> String {
    match source {
        NodeImageSource::Oci(reference) => reference.clone(),
        NodeImageSource::Dir(dir) => dir.display().to_string(),
    }
}

/// What the display says while layers are unpacked, or while the image is
/// written.
fn status(step: &BuildProgress<'_>) -> String {
    match *step {
        BuildProgress::Read { layers, bytes } => {
            format!("{layers} layers, {} stored", HumanBytes(bytes))
        }
        BuildProgress::Layer {
            bytes_done,
            bytes_total,
            ..
        } => format!(
            "layers unpacked · {} of {}",
            HumanBytes(bytes_done),
            HumanBytes(bytes_total)
        ),
        BuildProgress::Tree { entries } => format!("{entries} entries: writing the node image"),
    }
}

/// A step as a plain line (stderr is not a terminal).
fn line(step: &BuildProgress<'_>) -> String {
    match *step {
        BuildProgress::Read { layers, bytes } => format!(
            "detvisor: read the image: {layers} layer{}, {} stored",
            if layers == 1 { "" } else { "s" },
            HumanBytes(bytes)
        ),
        BuildProgress::Layer {
            done,
            total,
            digest,
            bytes_done,
            bytes_total,
        } => format!(
            "detvisor: layer {done}/{total} unpacked ({:.19}): {} of {}",
            digest,
            HumanBytes(bytes_done),
            HumanBytes(bytes_total)
        ),
        BuildProgress::Tree { entries } => {
            format!("detvisor: {entries} entries: writing the node image")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_each_build_step_is_one_plain_line() {
        let digest = format!("sha256:{}", "ab".repeat(32));
        let steps = [
            BuildProgress::Read {
                layers: 2,
                bytes: 3 << 20,
            },
            BuildProgress::Layer {
                done: 1,
                total: 2,
                digest: &digest,
                bytes_done: 1 << 20,
                bytes_total: 3 << 20,
            },
            BuildProgress::Tree { entries: 40 },
        ];
        let lines: Vec<String> = steps.iter().map(line).collect();
        assert_eq!(
            lines,
            [
                "detvisor: read the image: 2 layers, 3.00 MiB stored",
                "detvisor: layer 1/2 unpacked (sha256:abababababab): 1.00 MiB of 3.00 MiB",
                "detvisor: 40 entries: writing the node image",
            ]
        );
        assert_eq!(status(&steps[1]), "layers unpacked · 1.00 MiB of 3.00 MiB");
        assert_eq!(
            line(&BuildProgress::Read {
                layers: 1,
                bytes: 10
            }),
            "detvisor: read the image: 1 layer, 10 B stored"
        );
    }

    #[test]
    fn test_image_build_takes_quiet() {
        use clap::Parser;
        let argv = [
            "detvisor", "image", "build", "--rootfs", "r", "--out", "o", "--quiet",
        ];
        let crate::Command::Image(ImageCommand::Build(args)) =
            crate::Cli::try_parse_from(argv).unwrap().command
        else {
            panic!("an image build");
        };
        assert!(args.quiet);
    }
}
