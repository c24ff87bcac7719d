//! The campaign files in examples/ are valid: their spec, their fault
//! profile (drawn over their nodes) and the manifest each names.

use fuzzer::spec::{CampaignFile, HistoryChecker};
use std::path::{Path, PathBuf};

fn campaign_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files = Vec::new();
    for dir in ["raft", "etcd"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_owned();
            if name.starts_with("campaign-") && !name.ends_with("-manifest.toml") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn test_every_example_campaign_file_is_valid() {
    let files = campaign_files();
    assert_eq!(files.len(), 5, "{files:?}");
    for file in files {
        let campaign =
            CampaignFile::load(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert_eq!(campaign.warnings, Vec::<String>::new());
        let spec = &campaign.spec;
        let profile = &spec.faults;
        let manifest = run::manifest::load(&spec.manifest)
            .unwrap_or_else(|e| panic!("{}: {e:#}", spec.manifest.display()));
        campaign
            .check_manifest(&manifest)
            .unwrap_or_else(|e| panic!("{e}"));
        let nodes = manifest.node_names();
        if file.ends_with("etcd/campaign-watch-compact.toml") {
            // One member, no faults, no history: it measures going back to
            // moments, its checkpoints sized from memory.
            assert_eq!(spec.checker, HistoryChecker::None);
            assert!(spec.size_checkpoints_from_memory);
            let faults = profile.draw(7, vmm::VirtNanos::from_secs(60), &nodes, &[]);
            assert!(faults.is_empty(), "{faults:?}");
            continue;
        }
        assert_eq!(spec.checker, HistoryChecker::Kv, "{}", file.display());
        assert!(nodes.len() >= 3, "{nodes:?}");
        // Faults drawn over the nodes parse, and none names the workload.
        let faults = profile.draw(7, vmm::VirtNanos::from_secs(60), &nodes, &[]);
        assert!(
            !faults.is_empty(),
            "{}: a minute draws faults",
            file.display()
        );
        for fault in &faults {
            fault
                .scheduled(Some(vmm::VirtNanos(0)))
                .unwrap_or_else(|e| panic!("{fault}: {e}"));
            assert!(!fault.to_string().contains("pause workload"), "{fault}");
        }
    }
}
