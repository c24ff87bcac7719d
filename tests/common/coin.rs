//! The coin target, a system under test whose chance of failing is known by
//! construction (for `likelihood`): one busybox node whose workload says
//! its set-up is complete, flips coin A at [`FLIP_A`] and coin B at
//! [`FLIP_B`] after that (each a byte of /dev/urandom, the guest kernel's
//! CRNG, which a branch re-keys at its first instant: heads when the byte
//! is odd), and at [`ASSERT_AT`] asserts `Always` "not both heads". Its
//! records go through the SDKs' local output file
//! (`ANTITHESIS_SDK_LOCAL_OUTPUT`), then the workload ends and with it the
//! run.
//!
//! So on the history of a finding (both heads), a branch re-keyed before A
//! fails with probability 1/4, between A and B with 1/2 (A was heads), and
//! after B always. The times are since the set-up; the campaign's root is
//! its `setup_complete`, read up to 200 ms later (the agent reads the file
//! every 100 ms of guest time, the campaign looks every 100 ms), so four
//! points evenly spaced from the root to the failure (at about 8 s) fall
//! at about 0.15 s (before A), 2.1 s and 4.1 s (between) and 6 s (after
//! B), each a second or more from a flip.

use super::cluster::Cluster;
use std::path::PathBuf;

/// Seconds after the set-up that coin A is flipped.
pub const FLIP_A: u64 = 1;
/// Seconds after the set-up that coin B is flipped.
pub const FLIP_B: u64 = 5;
/// Seconds after the set-up that the assertion is made (and the run ends).
pub const ASSERT_AT: u64 = 8;
/// The assertion's message (its property's id).
pub const PROPERTY: &str = "not both heads";

/// The workload's script: `$1` of each flip is printed too, for people.
fn script() -> String {
    let assert = |condition: &str| {
        format!(
            "{{\"antithesis_assert\":{{\"assert_type\":\"always\",\"display_type\":\"Always\",\
             \"condition\":{condition},\"message\":\"{PROPERTY}\",\"location\":{{\"class\":\"\",\
             \"function\":\"coin\",\"file\":\"coin.sh\",\"begin_line\":1,\"begin_column\":0}},\
             \"hit\":true,\"must_hit\":true,\"id\":\"{PROPERTY}\",\"details\":{{\"a\":$a,\"b\":$b}}}}}}"
        )
    };
    format!(
        "out=$ANTITHESIS_SDK_LOCAL_OUTPUT\n\
         flip() {{ echo $(( $(od -An -N1 -tu1 /dev/urandom | tr -d ' ') % 2 )); }}\n\
         echo '{{\"antithesis_setup\":{{\"status\":\"complete\",\"details\":null}}}}' >> $out\n\
         sleep {FLIP_A}\n\
         a=$(flip); echo \"coin A: $a\"\n\
         sleep {}\n\
         b=$(flip); echo \"coin B: $b\"\n\
         sleep {}\n\
         if [ $a = 1 ] && [ $b = 1 ]; then echo \"{}\" >> $out; else echo \"{}\" >> $out; fi\n",
        FLIP_B - FLIP_A,
        ASSERT_AT - FLIP_B,
        assert("false").replace('"', "\\\""),
        assert("true").replace('"', "\\\""),
    )
}

/// The manifest: node `n1` idles; the workload runs the script inside it.
fn manifest() -> String {
    format!(
        "[[node]]\nname = \"n1\"\nrootfs = \"root\"\ncommand = [\"sleep\", \"100000\"]\n\
         env = {{ ANTITHESIS_SDK_LOCAL_OUTPUT = \"/tmp/sdk.jsonl\" }}\n\
         \n[workload]\nnode = \"n1\"\ncommand = [\"sh\", \"-c\", {:?}]\n",
        script()
    )
}

/// The coin target in a directory of its own, with a campaign file.
pub struct Coin {
    pub cluster: Cluster,
}

impl Coin {
    pub fn new(name: &str) -> Coin {
        Coin {
            cluster: Cluster::new(&format!("coin-{name}"), &manifest()),
        }
    }

    /// A campaign of the coin: rooted at its set-up, a slice that holds
    /// both flips and the assertion, no faults (the probabilities are the
    /// coins' alone).
    pub fn campaign_file(&self) -> PathBuf {
        let file = self.cluster.dir.join("coin-campaign.toml");
        let text = format!(
            "manifest = {:?}\nseed = 1\n\n[root]\nat = \"setup_complete\"\nwait = \"60s\"\n\n\
             [search]\nslice = \"{}s\"\nmax_depth = 1\n\n[checker]\nhistory = \"none\"\n\n\
             [faults]\n[faults.network]\nenabled = false\n[faults.node]\nenabled = false\n\
             [faults.clock]\nenabled = false\n[faults.disk]\nenabled = false\n",
            self.cluster.manifest(),
            ASSERT_AT + 2
        );
        std::fs::write(&file, text).unwrap();
        file
    }
}
