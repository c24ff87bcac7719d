//! Reading an image out of an OCI image layout directory.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use oci_spec::image::{Descriptor, ImageConfiguration, ImageIndex, ImageManifest, OciLayout};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::digest::{sha256_digest, Hasher};
use crate::{ImageError, OciRef};

/// Annotation holding a manifest's tag in `index.json`.
pub const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";
/// Annotation `docker save` (containerd image store) adds with the full image name.
pub const CONTAINERD_NAME_ANNOTATION: &str = "io.containerd.image.name";

/// Media types of image manifests (OCI, and Docker schema 2 which has the same shape).
const MANIFEST_TYPES: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];
/// Media types of image indexes (OCI, and Docker manifest lists).
const INDEX_TYPES: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
/// Media types of image configs.
const CONFIG_TYPES: &[&str] = &[
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
];

/// How deep nested indexes are followed.
const MAX_INDEX_DEPTH: usize = 4;

/// The runtime-relevant part of the image config (`config` section of the config blob), plus
/// where it came from.
///
/// Serialised (with these snake_case field names; missing fields take their defaults) as the
/// `config` of a node image's `/detvisor/image.json` (see [`crate::node`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ImageConfig {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `KEY=value` strings.
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    /// `user`, `uid`, `user:group`, `uid:gid`, ... as in the image.
    pub user: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub stop_signal: Option<String>,
    /// The config's `os` (`linux`).
    pub os: String,
    /// The config's `architecture` (`amd64`).
    pub architecture: String,
    /// Digest of the selected image manifest.
    pub manifest_digest: String,
}

impl ImageConfig {
    /// The command line the image runs by default: entrypoint followed by cmd.
    pub fn argv(&self) -> Vec<String> {
        self.entrypoint.iter().chain(&self.cmd).cloned().collect()
    }
}

/// How a layer's tar stream is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    /// The compression a layer media type declares; `None` for a media type that is not a layer.
    pub fn from_media_type(media_type: &str) -> Option<Compression> {
        Some(match media_type {
            "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar"
            | "application/vnd.docker.image.rootfs.diff.tar" => Compression::None,
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip"
            | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Compression::Gzip,
            "application/vnd.oci.image.layer.v1.tar+zstd"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd"
            | "application/vnd.docker.image.rootfs.diff.tar.zstd" => Compression::Zstd,
            _ => return None,
        })
    }
}

/// One layer: its verified (compressed) bytes and what is known about them.
#[derive(Clone, Debug)]
pub struct LayerBlob {
    /// Digest of `data` (`sha256:...`), also the name used in errors.
    pub digest: String,
    pub media_type: String,
    /// The compression the media type declares. Informative: flattening goes by the data's
    /// magic number (gzip `1f 8b`, zstd `28 b5 2f fd`, else an uncompressed tar), as Docker
    /// does, since some tools mislabel layers (the digest is verified either way).
    pub compression: Compression,
    /// The config's `rootfs.diff_ids` entry: digest of the uncompressed tar, checked while
    /// flattening when present.
    pub diff_id: Option<String>,
    pub data: Vec<u8>,
}

impl LayerBlob {
    /// A layer from bytes in memory (digest computed here, no diff_id).
    pub fn new(media_type: &str, data: Vec<u8>) -> Result<Self, ImageError> {
        let compression = Compression::from_media_type(media_type).ok_or_else(|| {
            ImageError::UnknownMediaType {
                media_type: media_type.to_owned(),
                what: "a layer".to_owned(),
            }
        })?;
        Ok(LayerBlob {
            digest: sha256_digest(&data),
            media_type: media_type.to_owned(),
            compression,
            diff_id: None,
            data,
        })
    }
}

/// Knobs of [`read_image_with`].
#[derive(Clone, Debug)]
pub struct ReadOptions {
    /// Platform wanted when an index lists several (`linux`).
    pub os: String,
    /// Platform wanted when an index lists several (`amd64`).
    pub architecture: String,
    /// Largest layer blob read (compressed size), default 8 GiB.
    pub max_blob_size: u64,
    /// Largest JSON document read (index, manifest, config), default 64 MiB.
    pub max_json_size: u64,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            os: "linux".to_owned(),
            architecture: "amd64".to_owned(),
            max_blob_size: 8 << 30,
            max_json_size: 64 << 20,
        }
    }
}

/// Reads the image `r` names with [`ReadOptions::default`] (linux/amd64).
///
/// `index.json` -> (the tag, via the `org.opencontainers.image.ref.name` annotation, or the
/// only image) -> nested indexes, choosing the linux/amd64 manifest when several are listed ->
/// manifest -> config and layers. Every blob read is checked against its descriptor's size and
/// digest; the layers are returned in memory, verified, in the manifest's order (lowest first).
pub fn read_image(r: &OciRef) -> Result<(ImageConfig, Vec<LayerBlob>), ImageError> {
    read_image_with(r, &ReadOptions::default())
}

/// [`read_image`] with explicit options.
pub fn read_image_with(
    r: &OciRef,
    opts: &ReadOptions,
) -> Result<(ImageConfig, Vec<LayerBlob>), ImageError> {
    let layout = Layout {
        dir: &r.layout_dir,
        opts,
    };
    layout.check_header()?;
    let index_path = r.layout_dir.join("index.json");
    if !index_path.is_file() {
        return Err(ImageError::NotAnOciLayout {
            path: r.layout_dir.clone(),
            reason: "index.json is missing".to_owned(),
        });
    }
    let index: ImageIndex = layout.read_json_file(&index_path)?;
    let manifest_desc = layout.select_manifest(&index, r.tag.as_deref())?;
    let (manifest_bytes, manifest_path) = layout.read_blob(&manifest_desc, opts.max_json_size)?;
    let manifest: ImageManifest = parse_json(&manifest_bytes, &manifest_path)?;

    let config_desc = manifest.config();
    let config_type = config_desc.media_type().to_string();
    if !CONFIG_TYPES.contains(&config_type.as_str()) {
        return Err(ImageError::UnknownMediaType {
            media_type: config_type,
            what: format!("the config of manifest {}", manifest_desc.digest()),
        });
    }
    let (config_bytes, config_path) = layout.read_blob(config_desc, opts.max_json_size)?;
    let config: ImageConfiguration = parse_json(&config_bytes, &config_path)?;
    let os = config.os().to_string();
    let architecture = config.architecture().to_string();
    if os != opts.os || architecture != opts.architecture {
        return Err(ImageError::WrongPlatform {
            wanted: format!("{}/{}", opts.os, opts.architecture),
            actual: format!("{os}/{architecture}"),
        });
    }

    let diff_ids = config.rootfs().diff_ids();
    let use_diff_ids = diff_ids.len() == manifest.layers().len();
    let mut layers = Vec::with_capacity(manifest.layers().len());
    for (i, desc) in manifest.layers().iter().enumerate() {
        let media_type = desc.media_type().to_string();
        let compression = Compression::from_media_type(&media_type).ok_or_else(|| {
            ImageError::UnknownMediaType {
                media_type: media_type.clone(),
                what: format!("layer {}", desc.digest()),
            }
        })?;
        let (data, _) = layout.read_blob(desc, opts.max_blob_size)?;
        layers.push(LayerBlob {
            digest: desc.digest().to_string(),
            media_type,
            compression,
            diff_id: use_diff_ids.then(|| diff_ids[i].clone()),
            data,
        });
    }

    let c = config.config().clone().unwrap_or_default();
    let image_config = ImageConfig {
        entrypoint: c.entrypoint().clone().unwrap_or_default(),
        cmd: c.cmd().clone().unwrap_or_default(),
        env: c.env().clone().unwrap_or_default(),
        working_dir: c.working_dir().clone().filter(|w| !w.is_empty()),
        user: c.user().clone().filter(|u| !u.is_empty()),
        labels: c.labels().clone().unwrap_or_default().into_iter().collect(),
        stop_signal: c.stop_signal().clone().filter(|s| !s.is_empty()),
        os,
        architecture,
        manifest_digest: manifest_desc.digest().to_string(),
    };
    Ok((image_config, layers))
}

struct Layout<'a> {
    dir: &'a Path,
    opts: &'a ReadOptions,
}

#[derive(PartialEq)]
enum DescKind {
    Manifest,
    Index,
    Other,
}

fn desc_kind(d: &Descriptor) -> DescKind {
    let mt = d.media_type().to_string();
    if MANIFEST_TYPES.contains(&mt.as_str()) {
        DescKind::Manifest
    } else if INDEX_TYPES.contains(&mt.as_str()) {
        DescKind::Index
    } else {
        DescKind::Other
    }
}

fn annotation<'d>(d: &'d Descriptor, key: &str) -> Option<&'d str> {
    d.annotations().as_ref()?.get(key).map(String::as_str)
}

/// Whether descriptor `d` of `index.json` carries `tag`: its ref name is the tag, or its ref
/// name / containerd image name is a full reference ending in `:tag`.
fn tag_matches(d: &Descriptor, tag: &str) -> bool {
    if annotation(d, REF_NAME_ANNOTATION) == Some(tag) {
        return true;
    }
    [REF_NAME_ANNOTATION, CONTAINERD_NAME_ANNOTATION]
        .iter()
        .filter_map(|k| annotation(d, k))
        .any(
            |name| matches!(name.rsplit_once(':'), Some((_, t)) if t == tag && !name.contains('@')),
        )
}

fn tags(descs: &[Descriptor]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for d in descs {
        if let Some(t) = annotation(d, REF_NAME_ANNOTATION) {
            if !out.iter().any(|o| o == t) {
                out.push(t.to_owned());
            }
        }
    }
    out
}

fn platform_string(d: &Descriptor) -> String {
    match d.platform() {
        Some(p) => {
            let mut s = format!("{}/{}", p.os(), p.architecture());
            if let Some(v) = p.variant() {
                s.push('/');
                s.push_str(v);
            }
            s
        }
        None => "(unspecified)".to_owned(),
    }
}

fn parse_json<T: DeserializeOwned>(bytes: &[u8], path: &Path) -> Result<T, ImageError> {
    serde_json::from_slice(bytes).map_err(|source| ImageError::Json {
        path: path.to_owned(),
        source,
    })
}

impl Layout<'_> {
    fn check_header(&self) -> Result<(), ImageError> {
        let path = self.dir.join("oci-layout");
        if !self.dir.is_dir() {
            return Err(ImageError::NotAnOciLayout {
                path: self.dir.to_owned(),
                reason: "no such directory".to_owned(),
            });
        }
        if !path.is_file() {
            return Err(ImageError::NotAnOciLayout {
                path: self.dir.to_owned(),
                reason: "the oci-layout file is missing".to_owned(),
            });
        }
        let header: OciLayout = self.read_json_file(&path)?;
        let version = header.image_layout_version();
        if !version.starts_with("1.") {
            return Err(ImageError::NotAnOciLayout {
                path: self.dir.to_owned(),
                reason: format!("unsupported imageLayoutVersion {version:?}"),
            });
        }
        Ok(())
    }

    fn read_json_file<T: DeserializeOwned>(&self, path: &Path) -> Result<T, ImageError> {
        let io_err = |source| ImageError::Io {
            path: path.to_owned(),
            source,
        };
        let mut bytes = Vec::new();
        hostfile::open_regular(path)
            .map_err(ImageError::Read)?
            .take(self.opts.max_json_size + 1)
            .read_to_end(&mut bytes)
            .map_err(io_err)?;
        if bytes.len() as u64 > self.opts.max_json_size {
            return Err(ImageError::TooLarge {
                subject: path.display().to_string(),
                what: "JSON file size (bytes)",
                size: std::fs::metadata(path).map_or(bytes.len() as u64, |m| m.len()),
                limit: self.opts.max_json_size,
            });
        }
        parse_json(&bytes, path)
    }

    /// Reads the blob `d` describes, checking its size and digest.
    fn read_blob(&self, d: &Descriptor, limit: u64) -> Result<(Vec<u8>, PathBuf), ImageError> {
        let digest = d.digest().to_string();
        let mut hasher = Hasher::for_digest(&digest)?;
        let (alg, hex) = digest
            .split_once(':')
            .expect("checked by Hasher::for_digest");
        let path = self.dir.join("blobs").join(alg).join(hex);
        let size = d.size();
        if size > limit {
            return Err(ImageError::TooLarge {
                subject: format!("blob {digest}"),
                what: "size (bytes)",
                size,
                limit,
            });
        }
        // A regular file only: a FIFO would hang the build.
        let file = match hostfile::open_regular(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ImageError::MissingBlob { digest, path })
            }
            Err(e) => return Err(ImageError::Read(e)),
        };
        let mut data = Vec::with_capacity(size.min(64 << 20) as usize);
        if let Err(source) = file.take(size + 1).read_to_end(&mut data) {
            return Err(ImageError::Io { path, source });
        }
        if data.len() as u64 != size {
            let actual = std::fs::metadata(&path)
                .map(|m| m.len())
                .unwrap_or(data.len() as u64);
            return Err(ImageError::SizeMismatch {
                path,
                expected: size,
                actual,
            });
        }
        hasher.update(&data);
        let actual = hasher.finish();
        if actual != digest {
            return Err(ImageError::DigestMismatch {
                path,
                expected: digest,
                actual,
            });
        }
        Ok((data, path))
    }

    /// Follows `index.json` (and nested indexes) to one image manifest descriptor.
    fn select_manifest(
        &self,
        index: &ImageIndex,
        tag: Option<&str>,
    ) -> Result<Descriptor, ImageError> {
        let all = index.manifests();
        let mut candidates: Vec<&Descriptor> = all.iter().collect();
        if let Some(tag) = tag {
            candidates.retain(|d| tag_matches(d, tag));
            if candidates.is_empty() {
                return Err(ImageError::TagNotFound {
                    layout: self.dir.to_owned(),
                    tag: tag.to_owned(),
                    available: tags(all),
                });
            }
        } else {
            // Several differently tagged images, or several untagged ones that are not
            // platform variants of one image: the caller must say which.
            let names = tags(all);
            let untagged_without_platform = all
                .iter()
                .filter(|d| annotation(d, REF_NAME_ANNOTATION).is_none() && d.platform().is_none())
                .count();
            if names.len() > 1 || (all.len() > 1 && untagged_without_platform > 1) {
                return Err(ImageError::AmbiguousImage {
                    layout: self.dir.to_owned(),
                    count: all.len(),
                    available: names,
                });
            }
        }
        let mut desc = self.choose(candidates, "index.json")?;
        for _ in 0..MAX_INDEX_DEPTH {
            match desc_kind(&desc) {
                DescKind::Manifest => return Ok(desc),
                DescKind::Index => {
                    let (bytes, path) = self.read_blob(&desc, self.opts.max_json_size)?;
                    let nested: ImageIndex = parse_json(&bytes, &path)?;
                    desc = self.choose(
                        nested.manifests().iter().collect(),
                        &format!("index {}", desc.digest()),
                    )?;
                }
                DescKind::Other => {
                    return Err(ImageError::UnknownMediaType {
                        media_type: desc.media_type().to_string(),
                        what: format!("manifest {}", desc.digest()),
                    })
                }
            }
        }
        Err(ImageError::IndexTooDeep(MAX_INDEX_DEPTH))
    }

    /// Picks one descriptor among `cands`: the only one, else the only followable one, else the
    /// first whose platform matches.
    fn choose(&self, cands: Vec<&Descriptor>, what: &str) -> Result<Descriptor, ImageError> {
        if let [only] = cands[..] {
            return Ok(only.clone());
        }
        let usable: Vec<&Descriptor> = cands
            .iter()
            .copied()
            .filter(|d| desc_kind(d) != DescKind::Other)
            .collect();
        if let [only] = usable[..] {
            return Ok(only.clone());
        }
        let wanted = |d: &&&Descriptor| {
            d.platform().as_ref().is_some_and(|p| {
                p.os().to_string() == self.opts.os
                    && p.architecture().to_string() == self.opts.architecture
            })
        };
        if let Some(d) = usable.iter().find(wanted) {
            return Ok((*d).clone());
        }
        Err(ImageError::PlatformNotFound {
            wanted: format!("{}/{}", self.opts.os, self.opts.architecture),
            what: what.to_owned(),
            available: usable.iter().map(|d| platform_string(d)).collect(),
        })
    }
}
