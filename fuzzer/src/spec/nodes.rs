//! A campaign file against its manifest's nodes, before any VM starts:
//! every node an `exclude` names exists, some node is left for faults to
//! name, and a disk category turned on has a disk to fault.

use super::{CampaignFile, SpecError};
use run::manifest::{Manifest, WORKLOAD_NODE};

impl CampaignFile {
    /// [`CampaignFile::check_nodes`] over `manifest`'s nodes.
    pub fn check_manifest(&self, manifest: &Manifest) -> Result<(), SpecError> {
        let nodes = manifest.node_names();
        let with_disks: Vec<String> = manifest
            .all_nodes()
            .into_iter()
            .filter(|n| n.disk.is_some())
            .map(|n| n.name.clone())
            .collect();
        self.check_nodes(&nodes, &with_disks)
    }

    /// Refuses a name in `faults.exclude` or `search.exclude` that is none
    /// of `nodes` (nor the workload, which may run inside a node), every
    /// node excluded while a category draws faults, and
    /// `[faults.disk] enabled = true` written with no node left that has a
    /// disk (`nodes_with_disks`).
    pub fn check_nodes(
        &self,
        nodes: &[String],
        nodes_with_disks: &[String],
    ) -> Result<(), SpecError> {
        let spec = &self.spec;
        let lists = [
            ("faults.exclude", &spec.faults.exclude),
            ("search.exclude", &spec.exclude),
        ];
        for (key, names) in lists {
            for (i, name) in names.iter().enumerate() {
                if name != WORKLOAD_NODE && !nodes.contains(name) {
                    return Err(self.keys.refuse(
                        &format!("{key}[{i}]"),
                        &format!("{name:?}"),
                        format!(
                            "no node is named {name:?} (the manifest's nodes: {}; or {WORKLOAD_NODE:?})",
                            nodes.join(", ")
                        ),
                    ));
                }
            }
        }
        let excluded = |n: &&String| lists.iter().any(|(_, names)| names.contains(n));
        let eligible: Vec<&String> = nodes.iter().filter(|n| !excluded(n)).collect();
        let default_exclude = format!("{:?}", spec.faults.exclude);
        if eligible.is_empty() && spec.faults.draws_any() {
            return Err(self.keys.refuse(
                "faults.exclude",
                &default_exclude,
                format!(
                    "every node of the manifest ({}) is excluded, so no fault can be drawn: exclude fewer, or set enabled = false in each [faults.<category>]",
                    nodes.join(", ")
                ),
            ));
        }
        let disk = &spec.faults.disk;
        if self.keys.is_set("faults.disk.enabled")
            && disk.enabled
            && !eligible.iter().any(|n| nodes_with_disks.contains(n))
        {
            let why = if nodes_with_disks.is_empty() {
                "no node of the manifest has a disk".to_owned()
            } else {
                format!(
                    "every node with a disk ({}) is excluded",
                    nodes_with_disks.join(", ")
                )
            };
            return Err(self.keys.refuse(
                "faults.disk.enabled",
                &true,
                format!("{why}: no disk fault can be drawn (give a node `disk = \"64M\"`, or set enabled = false)"),
            ));
        }
        Ok(())
    }
}
