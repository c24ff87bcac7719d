//! The guest of an `up` run: the agent plus every node's tree under
//! `/nodes/<name>`, and what the agent is asked to start for each node.

use super::prepare_error::PrepareError;
use super::{node_nic, node_root};
use crate::manifest::{Manifest, NodePlan, RootSource};
use guest_agent::protocol::{NodeDisk, NodeSpec};
use image_builder::{ImageConfig, RootFs};
use std::collections::BTreeMap;
use std::path::Path;

type Result<T, E = PrepareError> = std::result::Result<T, E>;

/// The largest node image (`image = ...`) read: 4 GiB, the most a newc
/// archive's files can hold together with the guest's RAM.
pub const MAX_NODE_IMAGE_BYTES: u64 = 4 << 30;

/// Checks, before anything is built, that every node image (`image = ...`)
/// is a regular file within [`MAX_NODE_IMAGE_BYTES`]: a FIFO is refused at
/// once instead of after the agent and the default image are built.
pub(super) fn check_node_images(manifest: &Manifest) -> Result<()> {
    for node in manifest.all_nodes() {
        if let RootSource::Image(path) = &node.source {
            let too_large = |file: std::fs::File| {
                let len = file.metadata().map_or(0, |m| m.len());
                (len > MAX_NODE_IMAGE_BYTES).then(|| hostfile::ReadError::TooLarge {
                    path: path.clone(),
                    limit: MAX_NODE_IMAGE_BYTES,
                })
            };
            let checked = match hostfile::open_regular(path) {
                Ok(file) => too_large(file),
                Err(e) => Some(e),
            };
            if let Some(e) = checked {
                return Err(PrepareError::Node {
                    name: node.name.clone(),
                    source: Box::new(PrepareError::ReadNodeImage(e)),
                });
            }
        }
    }
    Ok(())
}

/// A node's tree and image config from its source.
fn load_root(source: &RootSource) -> Result<(RootFs, ImageConfig)> {
    match source {
        RootSource::Image(path) => {
            // A regular file (a FIFO would hang), of bounded size.
            let bytes = hostfile::read_limited(path, MAX_NODE_IMAGE_BYTES)
                .map_err(PrepareError::ReadNodeImage)?;
            let image = image_builder::NodeImage::load(&bytes).map_err(|source| {
                PrepareError::NodeImage {
                    path: path.clone(),
                    source: Box::new(source),
                }
            })?;
            Ok((image.root, image.config))
        }
        RootSource::Oci(reference) => {
            let oci = |step, source| PrepareError::Oci {
                step,
                reference: reference.clone(),
                source: Box::new(source),
            };
            let parsed =
                image_builder::parse_oci_ref(reference).map_err(|e| oci("OCI reference", e))?;
            let (config, layers) =
                image_builder::read_image(&parsed).map_err(|e| oci("reading OCI layout", e))?;
            let root =
                image_builder::flatten(&layers).map_err(|e| oci("flattening OCI layout", e))?;
            Ok((root, config))
        }
        RootSource::Rootfs(dir) => {
            let root = RootFs::from_dir(dir).map_err(|source| PrepareError::ReadRootfs {
                dir: dir.clone(),
                source: Box::new(source),
            })?;
            Ok((root, ImageConfig::default()))
        }
    }
}

/// The agent's node requests and the overlay of the guest initramfs (the
/// agent plus every node's tree under `/nodes/<name>`), from a manifest.
pub fn assemble(manifest: &Manifest, agent: &Path) -> Result<(Vec<NodeSpec>, RootFs)> {
    let mut overlay = RootFs::new();
    let agent_bytes = std::fs::read(agent).map_err(|source| PrepareError::ReadAgent {
        path: agent.to_owned(),
        source,
    })?;
    overlay
        .add_file("detvisor-agent", 0o755, agent_bytes)
        .map_err(Box::new)?;
    overlay.add_dir("nodes", 0o755).map_err(Box::new)?;
    let mut specs = Vec::new();
    for (index, node) in manifest.all_nodes().into_iter().enumerate() {
        let (root, config) = load_root(&node.source).map_err(|source| PrepareError::Node {
            name: node.name.clone(),
            source: Box::new(source),
        })?;
        overlay
            .graft(&node_root(&node.name), &root)
            .map_err(|source| PrepareError::Node {
                name: node.name.clone(),
                source: Box::new(PrepareError::Overlay(Box::new(source))),
            })?;
        specs.push(node_spec(node, index, &config)?);
    }
    Ok((specs, overlay))
}

/// The agent's request for one node: the manifest's command and env over
/// the image's defaults.
fn node_spec(node: &NodePlan, index: usize, config: &ImageConfig) -> Result<NodeSpec> {
    let command = if node.command.is_empty() {
        config.argv()
    } else {
        node.command.clone()
    };
    if command.is_empty() {
        return Err(PrepareError::NoCommand {
            node: node.name.clone(),
        });
    }
    let mut env: BTreeMap<String, String> = config
        .env
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.extend(node.env.clone());
    Ok(NodeSpec {
        name: node.name.clone(),
        rootfs: node_root(&node.name),
        hostname: node.hostname.clone(),
        nic: Some(node_nic(index)),
        address: Some(node.address.clone()),
        env,
        command,
        disk: node.disk.as_ref().map(|disk| NodeDisk {
            serial: super::disk_serial(&node.name),
            mount: disk.mount.clone(),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_an_error_chain_names_each_cause_once() {
        let manifest = crate::manifest::parse(
            "[[node]]\nname='a'\nimage='/nonexistent/a.img'\n",
            Path::new("/"),
        )
        .unwrap();
        let agent = tempfile::NamedTempFile::new().unwrap();
        let e = assemble(&manifest, agent.path()).unwrap_err();
        assert_eq!(
            format!("{:#}", anyhow::Error::from(e)),
            "node a: cannot read the node image: /nonexistent/a.img: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn test_a_node_image_that_is_a_fifo_is_refused_without_hanging() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = crate::test_files::fifo(dir.path(), "a.img");
        let manifest = crate::manifest::parse(
            &format!("[[node]]\nname='a'\nimage='{}'\n", fifo.display()),
            Path::new("/"),
        )
        .unwrap();
        let agent = tempfile::NamedTempFile::new().unwrap();
        let e = assemble(&manifest, agent.path()).unwrap_err();
        assert!(
            format!("{:#}", anyhow::Error::from(e)).ends_with("a.img: not a regular file (a FIFO)")
        );
        // Checked before the guest is built, too.
        let e = check_node_images(&manifest).unwrap_err();
        assert_eq!(
            format!("{:#}", anyhow::Error::from(e)),
            format!(
                "node a: cannot read the node image: {}: not a regular file (a FIFO)",
                fifo.display()
            )
        );
        std::fs::remove_file(&fifo).unwrap();
        std::fs::write(&fifo, b"").unwrap();
        check_node_images(&manifest).unwrap();
    }
}
