//! The in-memory root filesystem tree and its path resolution.
//!
//! Paths are stored physically (every symlink on the way resolved), relative to the root,
//! without a leading `/`: `"etc/passwd"`; the root itself is `""`. A path maps to an inode id,
//! and several paths map to the same inode for hardlinks.
//!
//! Resolution rules (used both for layer entries and for the `add_*` API):
//! - The path itself is first normalised lexically (like Go's `filepath.Clean`, which is what
//!   Docker does): a leading `/` is dropped, `.` and empty components are skipped, `..` removes
//!   the previous component; a `..` that would climb above the root is an error.
//! - Parent components are resolved *inside the tree*: a symlink is followed with its target
//!   interpreted in the image (an absolute target starts again at the image root, a relative
//!   one at the symlink's directory), the way Docker and containerd apply layers through a
//!   chroot. So `link -> /etc` followed by `link/passwd` writes the tree's `etc/passwd`, which
//!   keeps merged-`/usr` images (`bin -> usr/bin`) working. But a symlink target whose `..`
//!   climbs above the image root is *rejected* (not clamped at `/` the way a chroot would) since
//!   only a crafted layer does that; so is a chain of more than 40 symlinks.
//! - The last component is never followed: a new entry replaces a symlink, it does not write
//!   through it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;

use crate::ImageError;

/// The `layer` named in errors raised by the [`RootFs`] API rather than by a layer.
pub const CALLER: &str = "(added by caller)";

/// Longest path accepted (Linux `PATH_MAX`).
pub const MAX_PATH_LEN: usize = 4096;
/// Longest path component accepted (Linux `NAME_MAX`).
pub const MAX_NAME_LEN: usize = 255;
/// Most symlinks followed while resolving one path (Linux `MAXSYMLINKS`).
pub const MAX_SYMLINK_HOPS: usize = 40;

/// What a node is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// A directory (its children are the paths below it).
    Dir,
    /// A regular file with its content.
    File { data: Vec<u8> },
    /// A symbolic link; the target is stored as is and never followed outside the tree.
    Symlink { target: String },
    /// A character device node.
    CharDevice { major: u32, minor: u32 },
    /// A block device node.
    BlockDevice { major: u32, minor: u32 },
    /// A named pipe.
    Fifo,
}

/// One inode of the tree: kind, permission bits and owner. Modification times are not kept
/// (they are all 0 in the output).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub kind: NodeKind,
    /// Permission bits including setuid/setgid/sticky (`mode & 0o7777`); no file-type bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl Node {
    /// A directory owned by root.
    pub fn dir(mode: u32) -> Self {
        Self::new(NodeKind::Dir, mode)
    }

    /// A regular file owned by root.
    pub fn file(mode: u32, data: Vec<u8>) -> Self {
        Self::new(NodeKind::File { data }, mode)
    }

    /// A symlink owned by root, mode 0777.
    pub fn symlink(target: impl Into<String>) -> Self {
        Self::new(
            NodeKind::Symlink {
                target: target.into(),
            },
            0o777,
        )
    }

    fn new(kind: NodeKind, mode: u32) -> Self {
        Node {
            kind,
            mode: mode & 0o7777,
            uid: 0,
            gid: 0,
        }
    }

    /// This node with another owner.
    pub fn owned_by(mut self, uid: u32, gid: u32) -> Self {
        self.uid = uid;
        self.gid = gid;
        self
    }

    /// The `S_IFMT` file-type bits of this node.
    pub fn file_type_bits(&self) -> u32 {
        match self.kind {
            NodeKind::Dir => 0o040000,
            NodeKind::File { .. } => 0o100000,
            NodeKind::Symlink { .. } => 0o120000,
            NodeKind::CharDevice { .. } => 0o020000,
            NodeKind::BlockDevice { .. } => 0o060000,
            NodeKind::Fifo => 0o010000,
        }
    }

    /// `st_mode`: file-type bits | permission bits.
    pub fn st_mode(&self) -> u32 {
        self.file_type_bits() | (self.mode & 0o7777)
    }

    pub fn is_dir(&self) -> bool {
        matches!(self.kind, NodeKind::Dir)
    }

    /// The content of a regular file.
    pub fn data(&self) -> Option<&[u8]> {
        match &self.kind {
            NodeKind::File { data } => Some(data),
            _ => None,
        }
    }

    /// The target of a symlink.
    pub fn symlink_target(&self) -> Option<&str> {
        match &self.kind {
            NodeKind::Symlink { target } => Some(target),
            _ => None,
        }
    }
}

pub(crate) type InodeId = u64;

#[derive(Clone, Debug)]
struct Inode {
    node: Node,
    links: u32,
}

/// An in-memory root filesystem: the flattened image plus whatever the caller adds.
///
/// Nothing is ever written to the host filesystem; [`crate::write_initramfs`] serialises it.
#[derive(Clone, Debug)]
pub struct RootFs {
    paths: BTreeMap<String, InodeId>,
    inodes: HashMap<InodeId, Inode>,
    next_id: InodeId,
}

impl Default for RootFs {
    fn default() -> Self {
        Self::new()
    }
}

/// Where a name being resolved comes from, for error messages.
#[derive(Clone, Copy)]
pub(crate) struct Ctx<'a> {
    pub layer: &'a str,
    pub entry: &'a str,
}

impl Ctx<'_> {
    pub(crate) fn invalid(&self, reason: impl Into<String>) -> ImageError {
        ImageError::InvalidEntry {
            layer: self.layer.to_owned(),
            entry: self.entry.to_owned(),
            reason: reason.into(),
        }
    }
}

/// How a walk over directory components ended.
enum Walk {
    /// The physical path of the directory.
    Found(String),
    /// `path` does not exist; `from_link` when the component came from a symlink target.
    Missing { path: String, from_link: bool },
    /// `path` exists but is neither a directory nor a symlink.
    NotDir { path: String },
}

/// Why a walk failed outright.
enum WalkError {
    Escape { symlink: String, target: String },
    Loop { symlink: String },
}

impl WalkError {
    fn into_image_error(self, ctx: Ctx<'_>) -> ImageError {
        match self {
            WalkError::Escape { symlink, target } => ImageError::SymlinkEscape {
                layer: ctx.layer.to_owned(),
                entry: ctx.entry.to_owned(),
                symlink,
                target,
            },
            WalkError::Loop { symlink } => ImageError::SymlinkLoop {
                layer: ctx.layer.to_owned(),
                entry: ctx.entry.to_owned(),
                symlink,
            },
        }
    }
}

/// Lexical normalisation of an entry path into components (see the module docs).
/// `Ok(None)` when a `..` climbs above the root.
pub(crate) fn normalize(path: &str, ctx: Ctx<'_>) -> Result<Option<Vec<String>>, ImageError> {
    if path.len() > MAX_PATH_LEN {
        return Err(ctx.invalid(format!(
            "path of {} bytes is longer than {MAX_PATH_LEN}",
            path.len()
        )));
    }
    if path.contains('\0') {
        return Err(ctx.invalid("path contains a NUL byte"));
    }
    let mut out: Vec<String> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if out.pop().is_none() {
                    return Ok(None);
                }
            }
            _ => {
                if c.len() > MAX_NAME_LEN {
                    return Err(ctx.invalid(format!(
                        "path component of {} bytes is longer than {MAX_NAME_LEN}",
                        c.len()
                    )));
                }
                out.push(c.to_owned());
            }
        }
    }
    Ok(Some(out))
}

/// Like [`normalize`], with an escape turned into [`ImageError::PathTraversal`].
pub(crate) fn normalize_entry(path: &str, ctx: Ctx<'_>) -> Result<Vec<String>, ImageError> {
    normalize(path, ctx)?.ok_or_else(|| ImageError::PathTraversal {
        layer: ctx.layer.to_owned(),
        entry: ctx.entry.to_owned(),
    })
}

pub(crate) fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

impl RootFs {
    /// An empty tree: just the root directory (0755, root:root).
    pub fn new() -> Self {
        let mut fs = RootFs {
            paths: BTreeMap::new(),
            inodes: HashMap::new(),
            next_id: 0,
        };
        let id = fs.alloc(Node::dir(0o755));
        fs.paths.insert(String::new(), id);
        fs
    }

    // ----- public API -----

    /// Adds or replaces a regular file (owned by root) at `path`, creating missing parent
    /// directories (0755). Replacing a directory is refused.
    pub fn add_file(&mut self, path: &str, mode: u32, data: Vec<u8>) -> Result<(), ImageError> {
        self.add_node(path, Node::file(mode, data))
    }

    /// Creates a directory (owned by root) at `path` with its parents, or sets the mode of an
    /// existing one.
    pub fn add_dir(&mut self, path: &str, mode: u32) -> Result<(), ImageError> {
        self.add_node(path, Node::dir(mode))
    }

    /// Adds or replaces a symlink at `path` pointing at `target` (stored as is).
    pub fn add_symlink(&mut self, path: &str, target: &str) -> Result<(), ImageError> {
        self.add_node(path, Node::symlink(target))
    }

    /// Adds any node at `path` (parents created as 0755 root directories, resolved through
    /// symlinks inside the tree). A directory over a directory keeps its children and takes
    /// the new mode and owner; a non-directory replaces a non-directory; replacing a directory
    /// by a non-directory is refused (use [`RootFs::remove`] first).
    pub fn add_node(&mut self, path: &str, node: Node) -> Result<(), ImageError> {
        let ctx = Ctx {
            layer: CALLER,
            entry: path,
        };
        if let NodeKind::Symlink { target } = &node.kind {
            check_link_target(target, ctx)?;
        }
        let comps = normalize_entry(path, ctx)?;
        let target = self.entry_path(&comps, ctx)?;
        if !node.is_dir() && self.lookup(&target).is_some_and(Node::is_dir) {
            return Err(ctx.invalid(
                "is a directory in the tree; remove it before replacing it by a non-directory",
            ));
        }
        self.put(target, node, ctx)
    }

    /// Adds `path` as another name (hardlink) of the existing non-directory `target`, which
    /// is resolved like [`RootFs::get`] (its last component is not followed). Replaces a
    /// non-directory at `path`.
    pub fn add_hardlink(&mut self, path: &str, target: &str) -> Result<(), ImageError> {
        let ctx = Ctx {
            layer: CALLER,
            entry: path,
        };
        let id = self.hardlink_target(target, ctx)?;
        let comps = normalize_entry(path, ctx)?;
        let dest = self.entry_path(&comps, ctx)?;
        if self.lookup(&dest).is_some_and(Node::is_dir) {
            return Err(ctx.invalid(
                "is a directory in the tree; remove it before replacing it by a hardlink",
            ));
        }
        self.put_link(dest, id, ctx)
    }

    /// Removes `path` (and everything below it). Returns whether it existed.
    pub fn remove(&mut self, path: &str) -> Result<bool, ImageError> {
        let ctx = Ctx {
            layer: CALLER,
            entry: path,
        };
        let comps = normalize_entry(path, ctx)?;
        let Some((name, parent)) = comps.split_last() else {
            return Err(ctx.invalid("the root cannot be removed"));
        };
        let Some(dir) = self.lookup_dir(parent, ctx)? else {
            return Ok(false);
        };
        let p = join(&dir, name);
        let existed = self.paths.contains_key(&p);
        self.remove_subtree(&p);
        Ok(existed)
    }

    /// The node at `path` (`lstat` semantics: parent symlinks are resolved inside the tree, the
    /// last component is not followed). `None` when absent or when the path cannot be resolved.
    pub fn get(&self, path: &str) -> Option<&Node> {
        self.lookup(&self.physical(path)?)
    }

    /// How many paths share the inode at `path` (hardlinks); resolved like [`RootFs::get`].
    pub fn link_count(&self, path: &str) -> Option<u32> {
        let id = self.lookup_id(&self.physical(path)?)?;
        Some(self.links_of(id))
    }

    /// The physical path of `path` (parents resolved, last component not followed).
    fn physical(&self, path: &str) -> Option<String> {
        let ctx = Ctx {
            layer: CALLER,
            entry: path,
        };
        let comps = normalize(path, ctx).ok()??;
        let Some((name, parent)) = comps.split_last() else {
            return Some(String::new());
        };
        let dir = self.lookup_dir(parent, ctx).ok()??;
        Some(join(&dir, name))
    }

    /// The root directory's node.
    pub fn root(&self) -> &Node {
        self.lookup("").expect("the root always exists")
    }

    /// Every path below the root with its node, sorted bytewise by path (so a directory comes
    /// before its contents). Paths are relative (`"etc/passwd"`) and physical.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &Node)> + '_ {
        self.paths
            .iter()
            .filter(|(p, _)| !p.is_empty())
            .map(|(p, id)| (p.as_str(), &self.inodes[id].node))
    }

    /// Number of paths below the root.
    pub fn len(&self) -> usize {
        self.paths.len() - 1
    }

    /// Whether the tree holds nothing but the root.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries with their inode ids, sorted (for the cpio writer).
    pub(crate) fn entries_with_ids(&self) -> impl Iterator<Item = (&str, InodeId, &Node)> + '_ {
        self.paths
            .iter()
            .filter(|(p, _)| !p.is_empty())
            .map(|(p, id)| (p.as_str(), *id, &self.inodes[id].node))
    }

    pub(crate) fn links_of(&self, id: InodeId) -> u32 {
        self.inodes[&id].links
    }

    /// Puts all of `other` under `prefix` (`"/nodes/etcd-1"`; `"/"` or `""` for the root),
    /// creating the missing parents of `prefix` as 0755 root directories.
    ///
    /// The directory at `prefix` takes the mode and owner of `other`'s root. `other`'s entries
    /// are copied with their kinds, modes and owners; paths that share an inode in `other`
    /// (hardlinks) share one in `self` too. They land at their physical place below `prefix`
    /// and are never resolved through symlinks of `self` (parents of `prefix` are, inside the
    /// tree, like any `add_*` path). Symlink targets are kept verbatim: an absolute target like
    /// `/usr/lib` is meant to be resolved inside the node's own root (its chroot) later.
    ///
    /// What `other` brings wins, with layer semantics: a directory over a directory merges (the
    /// new mode and owner, both sets of children), anything else replaces what was there with
    /// everything below it; likewise a symlink or file at `prefix` itself is replaced by the
    /// directory.
    pub fn graft(&mut self, prefix: &str, other: &RootFs) -> Result<(), ImageError> {
        let ctx = Ctx {
            layer: CALLER,
            entry: prefix,
        };
        let comps = normalize_entry(prefix, ctx)?;
        let base = self.entry_path(&comps, ctx)?;
        self.put(base.clone(), other.root().clone(), ctx)?;
        let mut copied: HashMap<InodeId, InodeId> = HashMap::new();
        for (path, id, node) in other.entries_with_ids() {
            let ctx = Ctx {
                layer: CALLER,
                entry: path,
            };
            let dest = join(&base, path);
            match copied.get(&id) {
                Some(&new_id) => self.put_link(dest, new_id, ctx)?,
                None => {
                    self.put(dest.clone(), node.clone(), ctx)?;
                    let new_id = self.lookup_id(&dest).expect("just put");
                    copied.insert(id, new_id);
                }
            }
        }
        Ok(())
    }

    // ----- crate-internal operations used by flattening -----

    /// The node of a live inode, for in-place changes (all its paths see them).
    pub(crate) fn node_mut(&mut self, id: InodeId) -> &mut Node {
        &mut self.inodes.get_mut(&id).expect("live inode").node
    }

    /// Whether anything lies below the physical path `dir`.
    pub(crate) fn has_children(&self, dir: &str) -> bool {
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        self.paths
            .range::<str, _>((Bound::Included(prefix.as_str()), Bound::Unbounded))
            .find(|(p, _)| !p.is_empty())
            .is_some_and(|(p, _)| p.starts_with(&prefix))
    }

    /// The node at a physical path.
    pub(crate) fn lookup(&self, path: &str) -> Option<&Node> {
        self.paths.get(path).map(|id| &self.inodes[id].node)
    }

    pub(crate) fn lookup_id(&self, path: &str) -> Option<InodeId> {
        self.paths.get(path).copied()
    }

    /// Resolves the parent of the normalised `comps` (creating missing directories) and returns
    /// the physical path of the entry itself (`""` for the root).
    pub(crate) fn entry_path(
        &mut self,
        comps: &[String],
        ctx: Ctx<'_>,
    ) -> Result<String, ImageError> {
        match comps.split_last() {
            None => Ok(String::new()),
            Some((name, parent)) => {
                let dir = self.create_dir_path(parent, ctx)?;
                Ok(join(&dir, name))
            }
        }
    }

    /// Resolves directory components without creating anything: `Ok(None)` when a component is
    /// missing or not a directory.
    pub(crate) fn lookup_dir(
        &self,
        comps: &[String],
        ctx: Ctx<'_>,
    ) -> Result<Option<String>, ImageError> {
        match self.walk(comps).map_err(|e| e.into_image_error(ctx))? {
            Walk::Found(p) => Ok(Some(p)),
            Walk::Missing { .. } | Walk::NotDir { .. } => Ok(None),
        }
    }

    /// Resolves directory components, creating missing ones (0755 root) like `mkdir -p`.
    fn create_dir_path(&mut self, comps: &[String], ctx: Ctx<'_>) -> Result<String, ImageError> {
        loop {
            match self.walk(comps).map_err(|e| e.into_image_error(ctx))? {
                Walk::Found(p) => return Ok(p),
                Walk::Missing {
                    path,
                    from_link: false,
                } => {
                    let id = self.alloc(Node::dir(0o755));
                    self.paths.insert(path, id);
                }
                Walk::Missing {
                    path,
                    from_link: true,
                } => {
                    return Err(ImageError::DanglingSymlink {
                        layer: ctx.layer.to_owned(),
                        entry: ctx.entry.to_owned(),
                        path,
                    })
                }
                Walk::NotDir { path } => {
                    return Err(ImageError::NotADirectory {
                        layer: ctx.layer.to_owned(),
                        entry: ctx.entry.to_owned(),
                        path,
                    })
                }
            }
        }
    }

    /// Walks directory components from the root, following symlinks inside the tree.
    fn walk(&self, comps: &[String]) -> Result<Walk, WalkError> {
        let mut resolved: Vec<String> = Vec::new();
        let mut pending: VecDeque<(String, bool)> =
            comps.iter().map(|c| (c.clone(), false)).collect();
        let mut hops = 0;
        let mut last_link = (String::new(), String::new());
        while let Some((c, from_link)) = pending.pop_front() {
            match c.as_str() {
                "" | "." => continue,
                ".." => {
                    if resolved.pop().is_none() {
                        let (symlink, target) = last_link;
                        return Err(WalkError::Escape { symlink, target });
                    }
                    continue;
                }
                _ => {}
            }
            resolved.push(c);
            let path = resolved.join("/");
            let Some(node) = self.lookup(&path) else {
                return Ok(Walk::Missing { path, from_link });
            };
            match &node.kind {
                NodeKind::Dir => {}
                NodeKind::Symlink { target } => {
                    hops += 1;
                    if hops > MAX_SYMLINK_HOPS {
                        return Err(WalkError::Loop { symlink: path });
                    }
                    if target.is_empty() {
                        return Ok(Walk::Missing {
                            path,
                            from_link: true,
                        });
                    }
                    resolved.pop();
                    if target.starts_with('/') {
                        resolved.clear();
                    }
                    for part in target.split('/').rev() {
                        pending.push_front((part.to_owned(), true));
                    }
                    last_link = (path, target.clone());
                }
                _ => return Ok(Walk::NotDir { path }),
            }
        }
        Ok(Walk::Found(resolved.join("/")))
    }

    /// The inode a hardlink's `target` names: inside the root, already in the tree, not a
    /// directory.
    pub(crate) fn hardlink_target(
        &self,
        target: &str,
        ctx: Ctx<'_>,
    ) -> Result<InodeId, ImageError> {
        let escape = || ImageError::HardlinkEscape {
            layer: ctx.layer.to_owned(),
            entry: ctx.entry.to_owned(),
            target: target.to_owned(),
        };
        let missing = || ImageError::HardlinkTargetMissing {
            layer: ctx.layer.to_owned(),
            entry: ctx.entry.to_owned(),
            target: target.to_owned(),
        };
        let comps = normalize(target, ctx)?.ok_or_else(escape)?;
        let Some((name, parent)) = comps.split_last() else {
            return Err(ctx.invalid("a hardlink to the image root (a directory)"));
        };
        let dir = match self.lookup_dir(parent, ctx) {
            Ok(Some(dir)) => dir,
            Ok(None) => return Err(missing()),
            Err(ImageError::SymlinkEscape { .. }) => return Err(escape()),
            Err(e) => return Err(e),
        };
        let path = join(&dir, name);
        let id = self.lookup_id(&path).ok_or_else(missing)?;
        if self.inodes[&id].node.is_dir() {
            return Err(ctx.invalid(format!("a hardlink to the directory {target:?}")));
        }
        Ok(id)
    }

    fn alloc(&mut self, node: Node) -> InodeId {
        let id = self.next_id;
        self.next_id += 1;
        self.inodes.insert(id, Inode { node, links: 1 });
        id
    }

    /// Puts `node` at the physical `path` with changeset semantics: a directory over a
    /// directory only takes the new attributes; anything else removes what was there (with
    /// everything below it) and creates the new node.
    pub(crate) fn put(&mut self, path: String, node: Node, ctx: Ctx<'_>) -> Result<(), ImageError> {
        if let Some(id) = self.lookup_id(&path) {
            let inode = self.inodes.get_mut(&id).expect("paths map to live inodes");
            if inode.node.is_dir() && node.is_dir() {
                inode.node.mode = node.mode;
                inode.node.uid = node.uid;
                inode.node.gid = node.gid;
                return Ok(());
            }
        }
        if path.is_empty() {
            return Err(ctx.invalid("the image root can only be a directory"));
        }
        self.remove_subtree(&path);
        let id = self.alloc(node);
        self.paths.insert(path, id);
        Ok(())
    }

    /// Makes the physical `path` another name of inode `id` (a hardlink), replacing whatever
    /// was at `path`.
    pub(crate) fn put_link(
        &mut self,
        path: String,
        id: InodeId,
        ctx: Ctx<'_>,
    ) -> Result<(), ImageError> {
        if path.is_empty() {
            return Err(ctx.invalid("the image root cannot be a hardlink"));
        }
        // Count the new link first so that replacing `path` (even by itself, or a directory
        // holding the target) cannot free the inode.
        self.inodes.get_mut(&id).expect("live inode").links += 1;
        self.remove_subtree(&path);
        self.paths.insert(path, id);
        Ok(())
    }

    /// Removes `path` and everything below it.
    pub(crate) fn remove_subtree(&mut self, path: &str) {
        if path.is_empty() {
            self.remove_children("");
            return;
        }
        if let Some(id) = self.paths.remove(path) {
            self.unref(id);
        }
        self.remove_children(path);
    }

    /// Removes everything below the directory `path` (an opaque whiteout).
    pub(crate) fn remove_children(&mut self, path: &str) {
        let prefix = if path.is_empty() {
            String::new()
        } else {
            format!("{path}/")
        };
        let doomed: Vec<String> = self
            .paths
            .range::<str, _>((Bound::Included(prefix.as_str()), Bound::Unbounded))
            .take_while(|(p, _)| p.starts_with(&prefix))
            .filter(|(p, _)| !p.is_empty())
            .map(|(p, _)| p.clone())
            .collect();
        for p in doomed {
            if let Some(id) = self.paths.remove(&p) {
                self.unref(id);
            }
        }
    }

    fn unref(&mut self, id: InodeId) {
        let inode = self.inodes.get_mut(&id).expect("live inode");
        inode.links -= 1;
        if inode.links == 0 {
            self.inodes.remove(&id);
        }
    }
}

/// Symlink targets are stored as is but must be sane.
pub(crate) fn check_link_target(target: &str, ctx: Ctx<'_>) -> Result<(), ImageError> {
    if target.len() > MAX_PATH_LEN {
        return Err(ctx.invalid(format!(
            "link target of {} bytes is longer than {MAX_PATH_LEN}",
            target.len()
        )));
    }
    if target.contains('\0') {
        return Err(ctx.invalid("link target contains a NUL byte"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_and_get_through_symlinked_parents() {
        let mut fs = RootFs::new();
        fs.add_dir("/usr/bin", 0o755).unwrap();
        fs.add_symlink("/bin", "usr/bin").unwrap();
        fs.add_file("/bin/sh", 0o755, b"#!".to_vec()).unwrap();
        assert_eq!(fs.get("/usr/bin/sh").unwrap().data(), Some(&b"#!"[..]));
        assert_eq!(fs.get("bin/sh").unwrap().data(), Some(&b"#!"[..]));
        assert!(fs.lookup("bin/sh").is_none(), "stored physically");
        let paths: Vec<&str> = fs.entries().map(|(p, _)| p).collect();
        assert_eq!(paths, ["bin", "usr", "usr/bin", "usr/bin/sh"]);
    }

    #[test]
    fn dir_over_dir_keeps_children_file_over_dir_refused() {
        let mut fs = RootFs::new();
        fs.add_file("a/b", 0o644, vec![]).unwrap();
        fs.add_dir("a", 0o700).unwrap();
        assert_eq!(fs.get("a").unwrap().mode, 0o700);
        assert!(fs.get("a/b").is_some());
        assert!(matches!(
            fs.add_file("a", 0o644, vec![]),
            Err(ImageError::InvalidEntry { .. })
        ));
        assert!(fs.remove("a").unwrap());
        assert!(fs.is_empty());
    }

    #[test]
    fn api_rejects_escapes_and_loops() {
        let mut fs = RootFs::new();
        assert!(matches!(
            fs.add_file("../x", 0o644, vec![]),
            Err(ImageError::PathTraversal { .. })
        ));
        fs.add_symlink("up", "../..").unwrap();
        assert!(matches!(
            fs.add_file("up/x", 0o644, vec![]),
            Err(ImageError::SymlinkEscape { .. })
        ));
        fs.add_symlink("l1", "l2").unwrap();
        fs.add_symlink("l2", "l1").unwrap();
        assert!(matches!(
            fs.add_file("l1/x", 0o644, vec![]),
            Err(ImageError::SymlinkLoop { .. })
        ));
        fs.add_symlink("dangling", "/nowhere").unwrap();
        assert!(matches!(
            fs.add_file("dangling/x", 0o644, vec![]),
            Err(ImageError::DanglingSymlink { .. })
        ));
        fs.add_file("f", 0o644, vec![]).unwrap();
        assert!(matches!(
            fs.add_file("f/x", 0o644, vec![]),
            Err(ImageError::NotADirectory { .. })
        ));
    }

    #[test]
    fn hardlinks_share_inodes_and_survive_removal() {
        let mut fs = RootFs::new();
        fs.add_file("a", 0o644, b"data".to_vec()).unwrap();
        fs.add_hardlink("b", "/a").unwrap();
        assert_eq!(fs.link_count("a"), Some(2));
        fs.add_hardlink("b", "a").unwrap();
        fs.add_hardlink("b", "b").unwrap();
        assert_eq!(fs.link_count("b"), Some(2));
        fs.remove("a").unwrap();
        assert_eq!(fs.get("b").unwrap().data(), Some(&b"data"[..]));
        assert_eq!(fs.link_count("b"), Some(1));
        fs.add_dir("d", 0o755).unwrap();
        assert!(matches!(
            fs.add_hardlink("x", "d"),
            Err(ImageError::InvalidEntry { .. })
        ));
        assert!(matches!(
            fs.add_hardlink("x", "../b"),
            Err(ImageError::HardlinkEscape { .. })
        ));
        assert!(matches!(
            fs.add_hardlink("x", "nope"),
            Err(ImageError::HardlinkTargetMissing { .. })
        ));
    }

    #[test]
    fn graft_puts_a_tree_under_a_prefix() {
        let mut node = RootFs::new();
        node.add_dir("usr/bin", 0o755).unwrap();
        node.add_file("usr/bin/etcd", 0o755, b"etcd".to_vec())
            .unwrap();
        node.add_hardlink("usr/bin/etcdctl", "usr/bin/etcd")
            .unwrap();
        node.add_symlink("bin", "/usr/bin").unwrap();
        node.add_symlink("lib", "../../escape").unwrap();
        node.add_node("data", Node::dir(0o700).owned_by(1000, 1000))
            .unwrap();

        let mut guest = RootFs::new();
        guest
            .add_file("sbin/agent", 0o755, b"agent".to_vec())
            .unwrap();
        guest.add_file("nodes/a/stale", 0o644, vec![]).unwrap();
        guest.add_symlink("nodes/a/usr", "/sbin").unwrap();
        guest.graft("/nodes/a", &node).unwrap();
        guest.graft("nodes/b/", &node).unwrap();

        let paths: Vec<&str> = guest.entries().map(|(p, _)| p).collect();
        assert_eq!(
            paths,
            [
                "nodes",
                "nodes/a",
                "nodes/a/bin",
                "nodes/a/data",
                "nodes/a/lib",
                "nodes/a/stale",
                "nodes/a/usr",
                "nodes/a/usr/bin",
                "nodes/a/usr/bin/etcd",
                "nodes/a/usr/bin/etcdctl",
                "nodes/b",
                "nodes/b/bin",
                "nodes/b/data",
                "nodes/b/lib",
                "nodes/b/usr",
                "nodes/b/usr/bin",
                "nodes/b/usr/bin/etcd",
                "nodes/b/usr/bin/etcdctl",
                "sbin",
                "sbin/agent",
            ],
            "the guest's symlink at nodes/a/usr was replaced, not written through"
        );
        assert_eq!(guest.get("sbin/agent").unwrap().data(), Some(&b"agent"[..]));
        // Symlinks verbatim, hardlinks per node, owners and modes kept.
        assert_eq!(
            guest.get("nodes/a/bin").unwrap().symlink_target(),
            Some("/usr/bin")
        );
        assert_eq!(
            guest.get("nodes/b/lib").unwrap().symlink_target(),
            Some("../../escape")
        );
        assert_eq!(guest.link_count("nodes/a/usr/bin/etcdctl"), Some(2));
        assert_eq!(guest.link_count("nodes/b/usr/bin/etcd"), Some(2));
        let data = guest.get("nodes/b/data").unwrap();
        assert_eq!((data.mode, data.uid, data.gid), (0o700, 1000, 1000));

        // Grafting at the root merges; a prefix that escapes is refused.
        let mut merged = RootFs::new();
        merged.add_file("keep", 0o644, vec![]).unwrap();
        merged.graft("/", &node).unwrap();
        assert_eq!(merged.len(), node.len() + 1);
        assert!(matches!(
            merged.graft("../x", &node),
            Err(ImageError::PathTraversal { .. })
        ));
    }
}
