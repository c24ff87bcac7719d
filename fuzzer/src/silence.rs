//! A campaign that cannot fail must not look like a passing one: when the
//! root run and the first [`CHECKED_BRANCHES`] branches delivered no SDK
//! record and no history line, no assertion and no history check has
//! anything to judge, and the campaign says so (once on stderr, and in its
//! summary). The usual causes: a program that cannot load libvoidstar with
//! `ANTITHESIS_SDK_LOCAL_OUTPUT` unset or set to a relative path, history
//! lines printed on stderr.

use crate::tree::TreeNode;
use run::records::RecordBody;

/// Branches after the root whose records are looked at.
pub const CHECKED_BRANCHES: usize = 3;

/// The warning for a campaign whose moments are `nodes` (by id, the root
/// first), if it is due: `None` while the root and the first
/// [`CHECKED_BRANCHES`] branches are not all there, or when they delivered
/// an SDK record or a history line.
pub(crate) fn warning(nodes: &[TreeNode]) -> Option<String> {
    let checked = nodes.get(..=CHECKED_BRANCHES)?;
    let silent = checked
        .iter()
        .flat_map(|n| &n.records)
        .all(|r| !matches!(r.body, RecordBody::Sdk { .. } | RecordBody::History { .. }));
    silent.then(|| {
        format!(
            "the root run and the first {CHECKED_BRANCHES} branches delivered no SDK record and \
             no history line: no assertion and no history check can fail this campaign. \
             Check that the system's programs reach libvoidstar (dynamically linked) or set \
             ANTITHESIS_SDK_LOCAL_OUTPUT to an absolute path in a node's `env` or in \
             `[workload].env`, and that history lines go to stdout (docs/campaigns.md, \
             \"Properties: the Antithesis SDKs\")"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NodeRow;
    use run::records::GuestRecord;

    fn moment(id: u64, bodies: &[serde_json::Value]) -> TreeNode {
        let row = NodeRow {
            id,
            parent: id.checked_sub(1),
            depth: 0,
            path: Default::default(),
            end_exits: 0,
            end_ns: vmm::VirtNanos::ZERO,
            digest: String::new(),
            score: 0.0,
            stopped: false,
        };
        let records = bodies
            .iter()
            .map(|body| {
                serde_json::from_value::<GuestRecord>(serde_json::json!({
                    "exit": 1, "virtual_ns": 1, "node": "n1", "body": body,
                }))
                .expect("a record")
            })
            .collect();
        TreeNode { row, records }
    }

    fn output() -> serde_json::Value {
        serde_json::json!({"kind": "output", "log": "n1", "stream": "stdout", "text": "x\n"})
    }

    #[test]
    fn test_only_the_root_and_three_silent_branches_warn() {
        let silent: Vec<TreeNode> = (0..5).map(|id| moment(id, &[output()])).collect();
        assert_eq!(warning(&silent[..3]), None, "three moments: not yet");
        let text = warning(&silent[..4]).expect("root and 3 branches, all silent");
        assert!(text.contains("ANTITHESIS_SDK_LOCAL_OUTPUT"), "{text}");
        assert!(text.contains("docs/campaigns.md"), "{text}");
        assert!(warning(&silent).is_some(), "later moments change nothing");
    }

    #[test]
    fn test_an_sdk_record_or_a_history_line_in_the_first_moments_is_enough() {
        for (at, body) in [
            (
                0,
                serde_json::json!({"kind": "sdk", "json": {"antithesis_sdk": {}}}),
            ),
            (
                3,
                serde_json::json!({"kind": "history", "json": {"f": "put"}}),
            ),
        ] {
            let mut nodes: Vec<TreeNode> = (0..4).map(|id| moment(id, &[output()])).collect();
            nodes[at] = moment(at as u64, &[output(), body.clone()]);
            assert_eq!(warning(&nodes), None, "{body} at moment {at}");
        }
        // One in branch 4 is too late: the first four were silent.
        let mut nodes: Vec<TreeNode> = (0..5).map(|id| moment(id, &[output()])).collect();
        nodes[4] = moment(4, &[serde_json::json!({"kind": "sdk", "json": {"a": 1}})]);
        assert!(warning(&nodes).is_some());
    }
}
