//! The guest of an `up` run: the agent plus every node's tree under
//! `/nodes/<name>`, and what the agent is asked to start for each node.

use super::{node_nic, node_root};
use crate::manifest::{Manifest, NodePlan, RootSource};
use anyhow::{bail, Context, Result};
use detvisor_agent::protocol::NodeSpec;
use image_builder::{ImageConfig, RootFs};
use std::collections::BTreeMap;
use std::path::Path;

/// A node's tree and image config from its source.
fn load_root(source: &RootSource) -> Result<(RootFs, ImageConfig)> {
    match source {
        RootSource::Image(path) => {
            let bytes = std::fs::read(path)
                .with_context(|| format!("cannot read node image {}", path.display()))?;
            let image = image_builder::NodeImage::load(&bytes)
                .with_context(|| format!("node image {}", path.display()))?;
            Ok((image.root, image.config))
        }
        RootSource::Oci(reference) => {
            let oci = image_builder::parse_oci_ref(reference)
                .with_context(|| format!("OCI reference {reference}"))?;
            let (config, layers) = image_builder::read_image(&oci)
                .with_context(|| format!("reading OCI layout {reference}"))?;
            let root = image_builder::flatten(&layers)
                .with_context(|| format!("flattening OCI layout {reference}"))?;
            Ok((root, config))
        }
        RootSource::Rootfs(dir) => {
            let root = RootFs::from_dir(dir)
                .with_context(|| format!("reading rootfs directory {}", dir.display()))?;
            Ok((root, ImageConfig::default()))
        }
    }
}

/// The agent's node requests and the overlay of the guest initramfs (the
/// agent plus every node's tree under `/nodes/<name>`), from a manifest.
pub fn assemble(manifest: &Manifest, agent: &Path) -> Result<(Vec<NodeSpec>, RootFs)> {
    let mut overlay = RootFs::new();
    let agent_bytes = std::fs::read(agent)
        .with_context(|| format!("cannot read the agent {}", agent.display()))?;
    overlay.add_file("detvisor-agent", 0o755, agent_bytes)?;
    overlay.add_dir("nodes", 0o755)?;
    let mut specs = Vec::new();
    for (index, node) in manifest.all_nodes().into_iter().enumerate() {
        let (root, config) =
            load_root(&node.source).with_context(|| format!("node {}", node.name))?;
        overlay
            .graft(&node_root(&node.name), &root)
            .with_context(|| format!("node {}", node.name))?;
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
        bail!(
            "node {}: no `command` in the manifest and none in its image",
            node.name
        );
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
    })
}
