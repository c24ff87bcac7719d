//! The manifest of a multi-node run (`detvisor up cluster.toml`): machine,
//! network defaults, nodes, the workload and a fault schedule, in TOML.
//! See docs/manifest.md for the format.
//!
//! Parsing rejects unknown keys (the error names the key and its line);
//! validation then checks what TOML cannot: unique, well-formed names and
//! addresses, exactly one image source per node, a workload node that exists.

use crate::faults::{Fault, FaultError};
use crate::units::{RamError, SizeError};
use devices::time::DurationError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// NICs and disks one guest can have together: the interrupt lines of
/// virtio slots, less the entropy device and the control channel.
pub const MAX_NODES: usize = devices::layout::VIRTIO_MMIO_IRQS.len() - 2;

/// The smallest and largest node disk: ext4 with its journal needs a few
/// MiB, and the VMM keeps every written block in memory.
pub const MIN_DISK_BYTES: u64 = 16 << 20;
pub const MAX_DISK_BYTES: u64 = 4 << 30;

/// The longest hostname the kernel takes (`HOST_NAME_MAX`).
pub const MAX_HOSTNAME: usize = 64;

/// Where a node's disk is mounted unless `data` says otherwise.
pub const DEFAULT_DATA_DIR: &str = "/data";

/// The node a workload with its own image runs as.
pub const WORKLOAD_NODE: &str = "workload";

/// The most `parallel_driver_` runs of a template at once unless the
/// manifest says.
pub const DEFAULT_PARALLEL_DRIVERS: u32 = 3;

/// Why a manifest was refused: reading it, its TOML, or what TOML cannot
/// check. A context (the file, a node, the workload) holds its cause.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read the manifest")]
    Read(#[source] hostfile::ReadError),
    #[error("manifest {}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: Box<ManifestError>,
    },
    /// TOML syntax or an unknown key (the message names its line).
    #[error("{0}")]
    Toml(toml::de::Error),
    #[error("no [[node]] declared: a manifest needs at least one node")]
    NoNodes,
    #[error("node {number} ({name:?})")]
    Node {
        number: usize,
        name: String,
        #[source]
        source: Box<ManifestError>,
    },
    #[error("node {number} ({name:?}): the name {WORKLOAD_NODE:?} is reserved for the workload's own node")]
    ReservedName { number: usize, name: String },
    #[error("node {number} ({name:?}): give one of `image`, `oci` or `rootfs`")]
    NoSource { number: usize, name: String },
    #[error("{count} nodes (counting the workload's own) is more than one guest has NICs for ({MAX_NODES})")]
    TooManyNodes { count: usize },
    #[error("{nodes} nodes and {disks} disks need more virtio slots than one guest has ({MAX_NODES} NICs and disks together)")]
    TooManyDisks { nodes: usize, disks: usize },
    #[error("disk")]
    DiskSize(#[source] SizeError),
    #[error("disk = {bytes} bytes: a disk is {MIN_DISK_BYTES}..{MAX_DISK_BYTES} bytes, whole MiB")]
    DiskBytes { bytes: u64 },
    #[error("data = {path:?}: the mount point must be an absolute path below / without `.` or `..` (e.g. /var/lib/etcd)")]
    DataDir { path: String },
    #[error("data = {path:?} needs a disk (disk = \"64M\")")]
    DataWithoutDisk { path: String },
    #[error("two nodes are named {name:?}")]
    DuplicateName { name: String },
    #[error("nodes {first:?} and {second:?} have the same address {ip}")]
    DuplicateAddress {
        first: String,
        second: String,
        ip: String,
    },
    #[error("machine.rtc_epoch {epoch} is outside 1970..9999 (unix seconds)")]
    RtcEpoch { epoch: i64 },
    #[error("machine.mem")]
    Mem(#[source] RamError),
    #[error("faults")]
    Faults(#[source] FaultError),
    #[error("workload: `command` is missing or empty (or give `template`)")]
    WorkloadCommand,
    #[error("workload: give `command` or `template`, not both (a template inside a node runs its own commands)")]
    WorkloadCommandAndTemplate,
    #[error("workload: template = {template:?} must be a directory name under /opt/antithesis/test/v1 (no `/`, not `.` or `..`)")]
    WorkloadTemplateName { template: String },
    #[error("workload: `{key}` only applies with `template`")]
    WorkloadTemplateOnly { key: &'static str },
    #[error("workload: parallel_drivers = {count}: give 1..={MAX_PARALLEL_DRIVERS}")]
    WorkloadParallelDrivers { count: u32 },
    #[error("workload")]
    Workload(#[source] Box<ManifestError>),
    #[error(
        "workload: give either `node` (run inside that node) or an image of its own, not both"
    )]
    WorkloadNodeAndImage,
    #[error("workload: node = {node:?} names no declared node")]
    WorkloadUnknownNode { node: String },
    #[error("workload: `address` only applies to a workload with its own image")]
    WorkloadAddress,
    #[error("workload: give `node` (run inside that node) or one of `image`, `oci`, `rootfs` (its own node)")]
    WorkloadNoSource,
    #[error("`image`, `oci` and `rootfs` exclude each other: give one")]
    SourcesExclusive,
    #[error("name {name:?} must be 1-32 characters of a-z, 0-9 and '-', not starting with '-'")]
    BadName { name: String },
    #[error("address {address:?} is not IPv4 (e.g. 192.0.2.1/24)")]
    NotIpv4 {
        address: String,
        #[source]
        source: std::net::AddrParseError,
    },
    #[error("address {address:?}: the prefix length must be 1..32")]
    BadPrefix { address: String },
    #[error("address {address:?} cannot be a node's address")]
    UnusableAddress { address: String },
    #[error("network.{field}")]
    Latency {
        field: &'static str,
        #[source]
        source: DurationError,
    },
    #[error("[network]: {0}")]
    Network(devices::switch::SwitchError),
    #[error("hostname = {hostname:?}: a hostname is 1..={MAX_HOSTNAME} bytes without NUL")]
    Hostname { hostname: String },
    #[error("command = [\"\", ...]: the program (the first word) is empty")]
    EmptyProgram,
    #[error("command word {index} ({word:?}) contains a NUL byte")]
    CommandNul { index: usize, word: String },
    #[error("env key {key:?} is not a variable name (give a non-empty name without `=` or NUL)")]
    EnvKey { key: String },
    #[error("env {key}: the value contains a NUL byte")]
    EnvValue { key: String },
}

type Result<T, E = ManifestError> = std::result::Result<T, E>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestFile {
    #[serde(default)]
    machine: MachineSection,
    #[serde(default)]
    network: NetworkSection,
    #[serde(default, rename = "node")]
    nodes: Vec<NodeSection>,
    workload: Option<WorkloadSection>,
    #[serde(default)]
    faults: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MachineSection {
    mem: Option<String>,
    rtc_epoch: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NetworkSection {
    #[serde(default = "default_latency")]
    latency: String,
    #[serde(default)]
    loss: f64,
    #[serde(default)]
    duplicate: f64,
    #[serde(default)]
    reorder: f64,
    #[serde(default = "default_reorder_delay")]
    reorder_delay: String,
}

fn default_latency() -> String {
    "1ms".into()
}

fn default_reorder_delay() -> String {
    "5ms".into()
}

impl Default for NetworkSection {
    fn default() -> Self {
        NetworkSection {
            latency: default_latency(),
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay: default_reorder_delay(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeSection {
    name: String,
    image: Option<String>,
    oci: Option<String>,
    rootfs: Option<String>,
    address: Option<String>,
    hostname: Option<String>,
    #[serde(default)]
    command: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// The size of the node's data disk (`"64M"`); none: no disk.
    disk: Option<String>,
    /// Where the disk is mounted in the node's root (default `/data`).
    data: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkloadSection {
    node: Option<String>,
    image: Option<String>,
    oci: Option<String>,
    rootfs: Option<String>,
    address: Option<String>,
    #[serde(default)]
    command: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// A test-composer template: `/opt/antithesis/test/v1/<template>/`.
    template: Option<String>,
    /// The most `parallel_driver_` runs at once (with `template`).
    parallel_drivers: Option<u32>,
    /// When the template's commands may start (with `template`).
    setup: Option<SetupSignal>,
}

/// The most `parallel_drivers` a manifest may ask for.
pub const MAX_PARALLEL_DRIVERS: u32 = 64;

/// Where a node's root filesystem comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum RootSource {
    /// A node image from `detvisor image build`.
    Image(PathBuf),
    /// An OCI image layout, `DIR` or `DIR:TAG` (DIR made absolute).
    Oci(String),
    /// A directory on the host.
    Rootfs(PathBuf),
}

impl std::fmt::Display for RootSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RootSource::Image(p) => write!(f, "image {}", p.display()),
            RootSource::Oci(r) => write!(f, "OCI layout {r}"),
            RootSource::Rootfs(p) => write!(f, "rootfs {}", p.display()),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct NodePlan {
    pub name: String,
    pub source: RootSource,
    /// IPv4 address with prefix length on the node's NIC.
    pub address: String,
    pub hostname: Option<String>,
    /// Empty: the image's own entrypoint and command.
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// The node's data disk, if it has one.
    #[serde(default)]
    pub disk: Option<DiskPlan>,
}

/// A node's data disk: an ext4 file system on its own virtio-blk disk,
/// mounted at `mount` inside the node's root.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct DiskPlan {
    pub size_bytes: u64,
    /// Absolute, inside the node's root.
    pub mount: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum WorkloadPlan {
    /// Runs inside a node's namespaces and root (like `nsenter`).
    InNode {
        node: String,
        command: Vec<String>,
        env: BTreeMap<String, String>,
    },
    /// Runs as a node of its own (named [`WORKLOAD_NODE`], with a NIC).
    OwnNode(NodePlan),
    /// A test-composer template's commands (see [`TemplatePlan`]).
    Template(TemplatePlan),
}

impl WorkloadPlan {
    /// The workload's own node, if it has one.
    pub fn own_node(&self) -> Option<&NodePlan> {
        match self {
            WorkloadPlan::OwnNode(node) => Some(node),
            WorkloadPlan::Template(plan) => plan.own_node.as_deref(),
            WorkloadPlan::InNode { .. } => None,
        }
    }
}

/// When a template's commands may start (and faults begin).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SetupSignal {
    /// Once every node runs (for systems that do not use the SDK).
    #[default]
    Immediate,
    /// When the system under test says `setup_complete` (the Antithesis
    /// SDK's `antithesis_setup` record).
    Sdk,
}

/// A workload in the Antithesis test-composer conventions: the commands of
/// `/opt/antithesis/test/v1/<template>/` as the node `node` sees it,
/// scheduled by `run::up::composer`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct TemplatePlan {
    pub template: String,
    /// The node the commands run in: a declared node, or
    /// [`WORKLOAD_NODE`] (then `own_node` is it).
    pub node: String,
    /// The workload's own node, when it has an image of its own.
    pub own_node: Option<Box<NodePlan>>,
    pub parallel_drivers: u32,
    pub setup: SetupSignal,
    /// Added to the node's environment for every command.
    pub env: BTreeMap<String, String>,
}

/// A validated manifest, paths resolved against the manifest's directory.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    pub mem: Option<String>,
    pub rtc_epoch: Option<i64>,
    pub network: devices::NetworkConfig,
    pub nodes: Vec<NodePlan>,
    pub workload: Option<WorkloadPlan>,
    /// Times since boot, node names checked, no two on one lane.
    pub faults: Vec<Fault>,
}

impl Manifest {
    /// Every node the guest runs, the workload's own node last.
    pub fn all_nodes(&self) -> Vec<&NodePlan> {
        let mut all: Vec<&NodePlan> = self.nodes.iter().collect();
        all.extend(self.workload.as_ref().and_then(WorkloadPlan::own_node));
        all
    }

    pub fn node_names(&self) -> Vec<String> {
        self.all_nodes().iter().map(|n| n.name.clone()).collect()
    }
}

/// The largest manifest read (a regular file only).
pub const MAX_MANIFEST_BYTES: u64 = 16 << 20;

/// Reads and validates a manifest file.
pub fn load(path: &Path) -> Result<Manifest> {
    let text =
        hostfile::read_text_limited(path, MAX_MANIFEST_BYTES).map_err(ManifestError::Read)?;
    let base = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    parse(&text, &base).map_err(|source| ManifestError::File {
        path: path.to_owned(),
        source: Box::new(source),
    })
}

/// Parses and validates manifest text; relative paths are taken from `base`.
pub fn parse(text: &str, base: &Path) -> Result<Manifest> {
    let file: ManifestFile = toml::from_str(text).map_err(ManifestError::Toml)?;
    if file.nodes.is_empty() {
        return Err(ManifestError::NoNodes);
    }
    let network = network_config(&file.network)?;
    let mut nodes = Vec::new();
    for (index, node) in file.nodes.iter().enumerate() {
        let (number, name) = (index + 1, node.name.clone());
        let what = |source| ManifestError::Node {
            number,
            name: name.clone(),
            source: Box::new(source),
        };
        check_name(&node.name).map_err(what)?;
        if let Some(hostname) = &node.hostname {
            check_hostname(hostname).map_err(what)?;
        }
        check_process(&node.command, &node.env).map_err(what)?;
        if node.name == WORKLOAD_NODE {
            return Err(ManifestError::ReservedName { number, name });
        }
        let source = root_source(&node.image, &node.oci, &node.rootfs, base)
            .map_err(what)?
            .ok_or_else(|| ManifestError::NoSource {
                number,
                name: name.clone(),
            })?;
        nodes.push(NodePlan {
            name: node.name.clone(),
            source,
            address: address_or_default(&node.address, index).map_err(what)?,
            hostname: node.hostname.clone(),
            command: node.command.clone(),
            env: node.env.clone(),
            disk: disk_plan(&node.disk, &node.data).map_err(what)?,
        });
    }
    let workload = match &file.workload {
        None => None,
        Some(w) => Some(workload_plan(w, &nodes, base)?),
    };
    let mut all: Vec<&NodePlan> = nodes.iter().collect();
    all.extend(workload.as_ref().and_then(WorkloadPlan::own_node));
    if all.len() > MAX_NODES {
        return Err(ManifestError::TooManyNodes { count: all.len() });
    }
    let disks = all.iter().filter(|n| n.disk.is_some()).count();
    if all.len() + disks > MAX_NODES {
        return Err(ManifestError::TooManyDisks {
            nodes: all.len(),
            disks,
        });
    }
    let mut names = std::collections::BTreeSet::new();
    let mut addresses = BTreeMap::new();
    for node in &all {
        if !names.insert(&node.name) {
            return Err(ManifestError::DuplicateName {
                name: node.name.clone(),
            });
        }
        let ip = node.address.split('/').next().unwrap_or_default();
        if let Some(other) = addresses.insert(ip.to_string(), &node.name) {
            return Err(ManifestError::DuplicateAddress {
                first: other.clone(),
                second: node.name.clone(),
                ip: ip.to_string(),
            });
        }
    }
    let manifest = Manifest {
        mem: file.machine.mem.clone(),
        rtc_epoch: file.machine.rtc_epoch,
        network,
        nodes,
        workload,
        faults: crate::faults::parse_faults(&file.faults).map_err(ManifestError::Faults)?,
    };
    if let Some(epoch) = manifest.rtc_epoch {
        // The CMOS clock counts years 1970..9999.
        crate::units::check_rtc_epoch(epoch)
            .map_err(|e| ManifestError::RtcEpoch { epoch: e.epoch })?;
    }
    if let Some(mem) = &manifest.mem {
        crate::units::parse_ram(mem).map_err(ManifestError::Mem)?;
    }
    crate::faults::schedule(&manifest.faults, &manifest.node_names())
        .map_err(ManifestError::Faults)?;
    Ok(manifest)
}

fn workload_plan(w: &WorkloadSection, nodes: &[NodePlan], base: &Path) -> Result<WorkloadPlan> {
    check_process(&w.command, &w.env)
        .map_err(|source| ManifestError::Workload(Box::new(source)))?;
    if let Some(template) = &w.template {
        return template_plan(w, template, nodes, base);
    }
    if w.parallel_drivers.is_some() {
        return Err(ManifestError::WorkloadTemplateOnly {
            key: "parallel_drivers",
        });
    }
    if w.setup.is_some() {
        return Err(ManifestError::WorkloadTemplateOnly { key: "setup" });
    }
    if w.command.is_empty() {
        return Err(ManifestError::WorkloadCommand);
    }
    let workload = |source| ManifestError::Workload(Box::new(source));
    let source = root_source(&w.image, &w.oci, &w.rootfs, base).map_err(workload)?;
    match (&w.node, source) {
        (Some(_), Some(_)) => Err(ManifestError::WorkloadNodeAndImage),
        (Some(node), None) => {
            if !nodes.iter().any(|n| &n.name == node) {
                return Err(ManifestError::WorkloadUnknownNode { node: node.clone() });
            }
            if w.address.is_some() {
                return Err(ManifestError::WorkloadAddress);
            }
            Ok(WorkloadPlan::InNode {
                node: node.clone(),
                command: w.command.clone(),
                env: w.env.clone(),
            })
        }
        (None, Some(source)) => Ok(WorkloadPlan::OwnNode(NodePlan {
            name: WORKLOAD_NODE.into(),
            source,
            address: address_or_default(&w.address, nodes.len()).map_err(workload)?,
            hostname: None,
            command: w.command.clone(),
            env: w.env.clone(),
            disk: None,
        })),
        (None, None) => Err(ManifestError::WorkloadNoSource),
    }
}

/// `[workload] template = "..."`: inside `node`, or on a node of its own
/// (whose main process is `command`, or its image's entrypoint).
fn template_plan(
    w: &WorkloadSection,
    template: &str,
    nodes: &[NodePlan],
    base: &Path,
) -> Result<WorkloadPlan> {
    if template.is_empty()
        || template == "."
        || template == ".."
        || template.contains('/')
        || template.contains('\0')
    {
        return Err(ManifestError::WorkloadTemplateName {
            template: template.to_owned(),
        });
    }
    let parallel_drivers = w.parallel_drivers.unwrap_or(DEFAULT_PARALLEL_DRIVERS);
    if !(1..=MAX_PARALLEL_DRIVERS).contains(&parallel_drivers) {
        return Err(ManifestError::WorkloadParallelDrivers {
            count: parallel_drivers,
        });
    }
    let workload = |source| ManifestError::Workload(Box::new(source));
    let source = root_source(&w.image, &w.oci, &w.rootfs, base).map_err(workload)?;
    let (node, own_node) = match (&w.node, source) {
        (Some(_), Some(_)) => return Err(ManifestError::WorkloadNodeAndImage),
        (Some(node), None) => {
            if !nodes.iter().any(|n| &n.name == node) {
                return Err(ManifestError::WorkloadUnknownNode { node: node.clone() });
            }
            if w.address.is_some() {
                return Err(ManifestError::WorkloadAddress);
            }
            if !w.command.is_empty() {
                return Err(ManifestError::WorkloadCommandAndTemplate);
            }
            (node.clone(), None)
        }
        (None, Some(source)) => (
            WORKLOAD_NODE.to_owned(),
            Some(Box::new(NodePlan {
                name: WORKLOAD_NODE.into(),
                source,
                address: address_or_default(&w.address, nodes.len()).map_err(workload)?,
                hostname: None,
                command: w.command.clone(),
                env: w.env.clone(),
                disk: None,
            })),
        ),
        (None, None) => return Err(ManifestError::WorkloadNoSource),
    };
    Ok(WorkloadPlan::Template(TemplatePlan {
        template: template.to_owned(),
        node,
        own_node,
        parallel_drivers,
        setup: w.setup.unwrap_or_default(),
        env: w.env.clone(),
    }))
}

fn root_source(
    image: &Option<String>,
    oci: &Option<String>,
    rootfs: &Option<String>,
    base: &Path,
) -> Result<Option<RootSource>> {
    let given = [image.is_some(), oci.is_some(), rootfs.is_some()];
    if given.iter().filter(|g| **g).count() > 1 {
        return Err(ManifestError::SourcesExclusive);
    }
    let resolve = |p: &str| {
        if Path::new(p).is_absolute() {
            PathBuf::from(p)
        } else {
            base.join(p)
        }
    };
    Ok(if let Some(image) = image {
        Some(RootSource::Image(resolve(image)))
    } else if let Some(oci) = oci {
        // DIR:TAG; a colon inside an absolute path's directory is unlikely,
        // so the tag is what follows the last colon after the last slash.
        let (dir, tag) = match oci.rsplit_once(':') {
            Some((dir, tag)) if !tag.contains('/') => (dir, Some(tag)),
            _ => (oci.as_str(), None),
        };
        let dir = resolve(dir).display().to_string();
        Some(RootSource::Oci(match tag {
            Some(tag) => format!("{dir}:{tag}"),
            None => dir,
        }))
    } else {
        rootfs.as_ref().map(|r| RootSource::Rootfs(resolve(r)))
    })
}

/// A node's disk from its `disk` size and `data` mount point.
fn disk_plan(size: &Option<String>, data: &Option<String>) -> Result<Option<DiskPlan>> {
    let Some(size) = size else {
        return match data {
            Some(path) => Err(ManifestError::DataWithoutDisk { path: path.clone() }),
            None => Ok(None),
        };
    };
    let bytes = crate::units::parse_size(size).map_err(ManifestError::DiskSize)?;
    if !(MIN_DISK_BYTES..=MAX_DISK_BYTES).contains(&bytes) || bytes % (1 << 20) != 0 {
        return Err(ManifestError::DiskBytes { bytes });
    }
    let mount = data.clone().unwrap_or_else(|| DEFAULT_DATA_DIR.to_owned());
    let parts: Vec<&str> = mount.split('/').skip(1).collect();
    let ok = mount.starts_with('/')
        && !parts.is_empty()
        && parts
            .iter()
            .all(|p| !p.is_empty() && *p != "." && *p != "..");
    if !ok {
        return Err(ManifestError::DataDir { path: mount });
    }
    Ok(Some(DiskPlan {
        size_bytes: bytes,
        mount,
    }))
}

/// What the agent would refuse only after boot: a hostname it cannot set.
fn check_hostname(hostname: &str) -> Result<()> {
    if hostname.is_empty() || hostname.len() > MAX_HOSTNAME || hostname.contains('\0') {
        return Err(ManifestError::Hostname {
            hostname: hostname.to_owned(),
        });
    }
    Ok(())
}

/// What the agent would refuse only after boot: a command it cannot exec
/// (an empty program, a NUL byte) or an environment it cannot pass (an
/// empty name, one with `=`, a NUL byte). An empty command is the image's own.
fn check_process(command: &[String], env: &BTreeMap<String, String>) -> Result<()> {
    if command.first().is_some_and(|program| program.is_empty()) {
        return Err(ManifestError::EmptyProgram);
    }
    if let Some((index, word)) = command.iter().enumerate().find(|(_, w)| w.contains('\0')) {
        return Err(ManifestError::CommandNul {
            index,
            word: word.clone(),
        });
    }
    for (key, value) in env {
        if key.is_empty() || key.contains('=') || key.contains('\0') {
            return Err(ManifestError::EnvKey { key: key.clone() });
        }
        if value.contains('\0') {
            return Err(ManifestError::EnvValue { key: key.clone() });
        }
    }
    Ok(())
}

fn check_name(name: &str) -> Result<()> {
    if !crate::units::is_node_name(name) {
        return Err(ManifestError::BadName {
            name: name.to_owned(),
        });
    }
    Ok(())
}

fn address_or_default(address: &Option<String>, index: usize) -> Result<String> {
    let Some(address) = address else {
        return Ok(format!("192.0.2.{}/24", index + 1));
    };
    let (ip, prefix) = address.split_once('/').unwrap_or((address, "24"));
    let ip: Ipv4Addr = ip.parse().map_err(|source| ManifestError::NotIpv4 {
        address: address.clone(),
        source,
    })?;
    let prefix: u8 = prefix
        .parse()
        .ok()
        .filter(|p| (1..=32).contains(p))
        .ok_or_else(|| ManifestError::BadPrefix {
            address: address.clone(),
        })?;
    if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() || ip.is_loopback() {
        return Err(ManifestError::UnusableAddress {
            address: address.clone(),
        });
    }
    Ok(format!("{ip}/{prefix}"))
}

fn network_config(n: &NetworkSection) -> Result<devices::NetworkConfig> {
    let parse = |field, text| {
        crate::units::parse_latency(text).map_err(|source| ManifestError::Latency { field, source })
    };
    let latency = parse("latency", &n.latency)?;
    let reorder_delay = parse("reorder_delay", &n.reorder_delay)?;
    let mut config = devices::NetworkConfig::reliable(latency);
    config.loss = n.loss;
    config.duplicate = n.duplicate;
    config.reorder = n.reorder;
    config.reorder_delay = reorder_delay;
    config.validate().map_err(ManifestError::Network)?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[machine]
mem = "1G"

[network]
latency = "1ms..3ms"
loss = 0.01

[[node]]
name = "n1"
image = "etcd.img"
command = ["etcd", "--name", "n1"]
env = { A = "1" }

[[node]]
name = "n2"
rootfs = "/srv/n2"
address = "192.0.2.20/24"

[workload]
node = "n1"
command = ["sh", "-c", "true"]
"#;

    fn err(text: &str) -> String {
        format!(
            "{:#}",
            anyhow::Error::from(parse(text, Path::new("/m")).unwrap_err())
        )
    }

    #[test]
    fn test_good_manifest_resolves_paths_and_defaults() {
        let m = parse(GOOD, Path::new("/m")).unwrap();
        assert_eq!(m.mem.as_deref(), Some("1G"));
        assert_eq!(m.nodes.len(), 2);
        assert_eq!(m.nodes[0].source, RootSource::Image("/m/etcd.img".into()));
        assert_eq!(m.nodes[0].address, "192.0.2.1/24");
        assert_eq!(m.nodes[1].source, RootSource::Rootfs("/srv/n2".into()));
        assert_eq!(m.nodes[1].address, "192.0.2.20/24");
        assert_eq!(m.network.loss, 0.01);
        assert!(matches!(m.workload, Some(WorkloadPlan::InNode { ref node, .. }) if node == "n1"));
        assert_eq!(m.node_names(), vec!["n1", "n2"]);
    }

    #[test]
    fn test_example_manifests_parse() {
        for (name, text) in [
            (
                "cluster.toml",
                include_str!("../../examples/etcd/cluster.toml"),
            ),
            (
                "partition.toml",
                include_str!("../../examples/etcd/partition.toml"),
            ),
            ("crash.toml", include_str!("../../examples/etcd/crash.toml")),
        ] {
            let m = parse(text, Path::new("/ex")).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            assert_eq!(m.nodes.len(), 3, "{name}");
            assert_eq!(m.nodes[2].source, RootSource::Image("/ex/etcd.img".into()));
        }
    }

    #[test]
    fn test_a_node_disk_has_a_size_and_a_mount_point() {
        let m = parse(
            "[[node]]\nname='a'\nrootfs='r'\ndisk='64M'\ndata='/var/lib/etcd'\n\
             [[node]]\nname='b'\nrootfs='r'\ndisk='16M'\n[[node]]\nname='c'\nrootfs='r'\n",
            Path::new("/m"),
        )
        .unwrap();
        let disk = |i: usize| m.nodes[i].disk.clone();
        assert_eq!(
            disk(0),
            Some(DiskPlan {
                size_bytes: 64 << 20,
                mount: "/var/lib/etcd".into()
            })
        );
        assert_eq!(disk(1).unwrap().mount, DEFAULT_DATA_DIR);
        assert_eq!(disk(2), None);
    }

    #[test]
    fn test_workload_with_its_own_image_is_a_node() {
        let m = parse(
            "[[node]]\nname='a'\nrootfs='r'\n[workload]\noci='layout:v1'\ncommand=['x']\n",
            Path::new("/m"),
        )
        .unwrap();
        let Some(WorkloadPlan::OwnNode(node)) = &m.workload else {
            panic!("expected an own-node workload");
        };
        assert_eq!(node.name, WORKLOAD_NODE);
        assert_eq!(node.source, RootSource::Oci("/m/layout:v1".into()));
        assert_eq!(node.address, "192.0.2.2/24");
        assert_eq!(m.node_names(), vec!["a", "workload"]);
    }

    #[test]
    fn test_a_template_workload_runs_in_a_node_or_its_own() {
        let m = parse(
            "[[node]]\nname='a'\nrootfs='r'\n[workload]\nnode='a'\ntemplate='basic'\n\
             parallel_drivers=5\nsetup='sdk'\nenv={X='1'}\n",
            Path::new("/m"),
        )
        .unwrap();
        assert_eq!(
            m.workload,
            Some(WorkloadPlan::Template(TemplatePlan {
                template: "basic".into(),
                node: "a".into(),
                own_node: None,
                parallel_drivers: 5,
                setup: SetupSignal::Sdk,
                env: [("X".to_string(), "1".to_string())].into(),
            }))
        );
        assert_eq!(m.node_names(), vec!["a"]);
        let m = parse(
            "[[node]]\nname='a'\nrootfs='r'\n[workload]\nimage='t.img'\ntemplate='basic'\n\
             command=['sleep','infinity']\n",
            Path::new("/m"),
        )
        .unwrap();
        let Some(WorkloadPlan::Template(plan)) = &m.workload else {
            panic!("a template workload");
        };
        assert_eq!(plan.node, WORKLOAD_NODE);
        assert_eq!(plan.setup, SetupSignal::Immediate);
        assert_eq!(plan.parallel_drivers, DEFAULT_PARALLEL_DRIVERS);
        let own = plan.own_node.as_ref().unwrap();
        assert_eq!(own.source, RootSource::Image("/m/t.img".into()));
        assert_eq!(own.command, ["sleep", "infinity"]);
        assert_eq!(m.node_names(), vec!["a", "workload"]);
    }

    #[test]
    fn test_template_errors_name_the_key() {
        let base = "[[node]]\nname='a'\nrootfs='r'\n[workload]\nnode='a'\n";
        assert_eq!(
            err(&format!("{base}template='t'\ncommand=['x']\n")),
            "workload: give `command` or `template`, not both (a template inside a node runs \
             its own commands)"
        );
        assert!(err(&format!("{base}template='../t'\n")).contains("template = \"../t\""));
        assert!(err(&format!("{base}template=''\n")).contains("template = \"\""));
        assert_eq!(
            err(&format!("{base}command=['x']\nparallel_drivers=2\n")),
            "workload: `parallel_drivers` only applies with `template`"
        );
        assert_eq!(
            err(&format!("{base}command=['x']\nsetup='sdk'\n")),
            "workload: `setup` only applies with `template`"
        );
        assert!(err(&format!("{base}template='t'\nparallel_drivers=0\n"))
            .contains("parallel_drivers = 0: give 1..=64"));
        let e = err(&format!("{base}template='t'\nsetup='later'\n"));
        assert!(
            e.contains("unknown variant `later`, expected `immediate` or `sdk`")
                && e.contains("line 7"),
            "{e}"
        );
        assert!(
            err("[[node]]\nname='a'\nrootfs='r'\n[workload]\ntemplate='t'\n")
                .contains("give `node`")
        );
    }

    #[test]
    fn test_unknown_keys_are_named() {
        let e = err("[[node]]\nname='a'\nrootfs='r'\ncomand=['x']\n");
        assert!(e.contains("unknown field `comand`"), "{e}");
        assert!(e.contains("line 4"), "{e}");
        let e = err("[netwrk]\n[[node]]\nname='a'\nrootfs='r'\n");
        assert!(e.contains("unknown field `netwrk`"), "{e}");
    }

    #[test]
    fn test_an_error_chain_names_each_cause_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.toml");
        std::fs::write(&path, "[[node]]\nname='a'\nrootfs='r'\naddress='x/24'\n").unwrap();
        let e = format!("{:#}", anyhow::Error::from(load(&path).unwrap_err()));
        assert_eq!(
            e,
            format!(
                "manifest {}: node 1 (\"a\"): address \"x/24\" is not IPv4 (e.g. 192.0.2.1/24): \
                 invalid IPv4 address syntax",
                path.display()
            )
        );
        assert_eq!(
            err("[network]\nlatency='fast'\n[[node]]\nname='a'\nrootfs='r'\n"),
            "network.latency: unparsable duration \"fast\": expected a decimal number and a unit \
             (ns, us or µs, ms, s, m or min, h; no unit means seconds), e.g. 12.5s, 250ms or 600"
        );
        assert_eq!(
            err("faults=['at=1s pause zz']\n[[node]]\nname='a'\nrootfs='r'\n"),
            "faults: fault at=1s pause zz: no node is named \"zz\" (nodes: a)"
        );
    }

    #[test]
    fn test_semantic_errors_name_the_problem() {
        assert!(err("").contains("no [[node]]"));
        assert!(err("[[node]]\nname='A'\nrootfs='r'\n").contains("name \"A\" must be"));
        assert!(err("[[node]]\nname='a'\n").contains("give one of `image`, `oci` or `rootfs`"));
        assert!(err("[[node]]\nname='a'\nrootfs='r'\nimage='i'\n").contains("exclude each other"));
        assert!(
            err("[[node]]\nname='a'\nrootfs='r'\n[[node]]\nname='a'\nrootfs='r'\n")
                .contains("two nodes are named \"a\"")
        );
        assert!(err(
            "[[node]]\nname='a'\nrootfs='r'\naddress='192.0.2.2'\n[[node]]\nname='b'\nrootfs='r'\n"
        )
        .contains("same address 192.0.2.2"));
        assert!(
            err("[[node]]\nname='a'\nrootfs='r'\naddress='300.1.1.1/24'\n").contains("not IPv4")
        );
        assert!(
            err("[[node]]\nname='a'\nrootfs='r'\n[workload]\nnode='b'\ncommand=['x']\n")
                .contains("names no declared node")
        );
        assert!(
            err("[[node]]\nname='a'\nrootfs='r'\n[workload]\nnode='a'\n")
                .contains("`command` is missing")
        );
        assert!(err("[network]\nloss=2.0\n[[node]]\nname='a'\nrootfs='r'\n").contains("[network]"));
        assert!(
            err("[network]\nlatency='fast'\n[[node]]\nname='a'\nrootfs='r'\n")
                .contains("network.latency")
        );
        assert!(
            err("faults=['at=1s pause zz']\n[[node]]\nname='a'\nrootfs='r'\n")
                .contains("no node is named \"zz\"")
        );
        assert!(
            err("[machine]\nmem='lots'\n[[node]]\nname='a'\nrootfs='r'\n").contains("machine.mem")
        );
        assert!(
            err("[[node]]\nname='a'\nrootfs='r'\ndisk='1G'\ndata='/var/../x'\n")
                .contains("data = \"/var/../x\": the mount point")
        );
        assert!(err("[[node]]\nname='a'\nrootfs='r'\ndisk='1K'\n").contains("whole MiB"));
        assert!(err("[[node]]\nname='a'\nrootfs='r'\ndata='/d'\n").contains("needs a disk"));
        let disks: String = (0..5)
            .map(|i| format!("[[node]]\nname='n{i}'\nrootfs='r'\ndisk='16M'\n"))
            .collect();
        assert!(
            err(&disks).contains("5 nodes and 5 disks"),
            "{}",
            err(&disks)
        );
        let many: String = (0..=MAX_NODES)
            .map(|i| format!("[[node]]\nname='n{i}'\nrootfs='r'\n"))
            .collect();
        assert!(err(&many).contains("NICs for"));
    }

    #[test]
    fn test_what_the_agent_would_refuse_is_refused_before_boot() {
        let node = |extra: &str| err(&format!("[[node]]\nname='a'\nrootfs='r'\n{extra}\n"));
        assert_eq!(
            node("hostname=''"),
            "node 1 (\"a\"): hostname = \"\": a hostname is 1..=64 bytes without NUL"
        );
        assert!(node(&format!("hostname='{}'", "h".repeat(65))).contains("hostname = "));
        assert!(node("hostname=\"a\\u0000b\"").contains("hostname = \"a\\0b\""));
        assert_eq!(
            node("command=['']"),
            "node 1 (\"a\"): command = [\"\", ...]: the program (the first word) is empty"
        );
        assert!(node("command=['sh', \"a\\u0000\"]").contains("command word 1"));
        assert!(node("env={'A=B'='c'}").contains("env key \"A=B\" is not a variable name"));
        assert!(node("env={''='c'}").contains("env key \"\" is not a variable name"));
        assert!(node("env={A=\"x\\u0000\"}").contains("env A: the value contains a NUL"));
        let workload = |extra: &str| {
            err(&format!(
                "[[node]]\nname='a'\nrootfs='r'\n[workload]\nnode='a'\n{extra}\n"
            ))
        };
        assert!(workload("command=['']").starts_with("workload: command = [\"\""));
        assert!(workload("command=['x']\nenv={'='='1'}").starts_with("workload: env key"));
        // The boundaries are accepted.
        parse(
            &format!(
                "[[node]]\nname='a'\nrootfs='r'\nhostname='{}'\ncommand=['sh']\nenv={{A=''}}\n",
                "h".repeat(64)
            ),
            Path::new("/"),
        )
        .unwrap();
    }

    #[test]
    fn test_a_manifest_that_is_a_fifo_or_a_directory_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = crate::test_files::fifo(dir.path(), "m.toml");
        let e = format!("{:#}", anyhow::Error::from(load(&fifo).unwrap_err()));
        assert!(e.ends_with("m.toml: not a regular file (a FIFO)"), "{e}");
        let e = format!("{:#}", anyhow::Error::from(load(dir.path()).unwrap_err()));
        // Each cause once.
        assert_eq!(
            e,
            format!(
                "cannot read the manifest: {}: not a regular file (a directory)",
                dir.path().display()
            )
        );
    }

    #[test]
    fn test_machine_mem_range_and_alignment_name_the_key() {
        let mem = |m: &str| {
            err(&format!(
                "[machine]\nmem='{m}'\n[[node]]\nname='a'\nrootfs='r'\n"
            ))
        };
        assert!(
            mem("1M").starts_with("machine.mem: guest RAM of 1M"),
            "{}",
            mem("1M")
        );
        assert!(
            mem("65G").starts_with("machine.mem: guest RAM of 65G"),
            "{}",
            mem("65G")
        );
        assert!(
            mem("256M1K").starts_with("machine.mem: unparsable"),
            "{}",
            mem("256M1K")
        );
        let unaligned = mem(&format!("{}", (256 << 20) + 1));
        assert!(
            unaligned.contains("a whole number of 4K pages"),
            "{unaligned}"
        );
        assert!(unaligned.starts_with("machine.mem: "), "{unaligned}");
    }
}
