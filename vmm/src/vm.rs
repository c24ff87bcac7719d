//! The VM: KVM file descriptors, guest memory, and the vCPU run loop.
//!
//! Only this module calls KVM_RUN. Each exit is converted to an owned
//! [`Exit`] at once, handed to the pure [`Machine`], recorded, and the
//! answer written back into the kvm_run page before re-entering the guest.
//! Interrupts are injected only here, only between a guest-caused exit and
//! the next entry.

use crate::boot::{self, BootError, BootInputs};
use crate::cpu_model::{self, MsrAccess};
use crate::entropy::{self, stream, EntropyStream};
use crate::exit::MachineState;
use crate::exit::{
    AccessData, Completion, Exit, ExitAction, ExitFailure, InterruptAction, Machine, Perturbation,
    StopReason,
};
use crate::irq_window::{self, WindowGuard};
use crate::kvm_util;
use crate::record::RecorderState;
use crate::record::{self, ChainHash, ExitRecord, RecordConfig, Recorder, NO_HASH, NO_VECTOR};
use crate::vcpu_state::{self, VcpuState};
use devices::DevicesState;
use devices::GuestMemory;
use devices::{Devices, DevicesConfig, NetworkConfig, VirtNanos};
use kvm_bindings::{
    kvm_msr_entry, kvm_userspace_memory_region, Msrs, KVM_MSR_EXIT_REASON_FILTER,
    KVM_MSR_EXIT_REASON_INVAL, KVM_MSR_EXIT_REASON_UNKNOWN,
};
use kvm_ioctls::{
    Cap, Kvm, MsrFilterDefaultAction, MsrFilterRange, MsrFilterRangeFlags, SyncReg, VcpuExit,
    VcpuFd, VmFd,
};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use thiserror::Error;
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

#[derive(Debug, Error)]
pub enum VmError {
    #[error("cannot open /dev/kvm: {0}")]
    OpenKvm(#[source] kvm_ioctls::Error),
    #[error("KVM lacks a capability detvisor needs: {0}")]
    MissingCapability(&'static str),
    #[error("KVM call {call} failed: {source}")]
    Kvm {
        call: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("injecting an interrupt failed: {0}")]
    Inject(#[source] std::io::Error),
    #[error("cannot allocate {bytes} bytes of guest memory: {reason}")]
    Memory { bytes: u64, reason: String },
    #[error(transparent)]
    Boot(#[from] BootError),
    #[error(transparent)]
    VcpuState(#[from] vcpu_state::VcpuStateError),
    #[error("dirty pages were asked for, but dirty logging was never started")]
    DirtyLogOff,
    #[error("this checkpoint is not the session's live one (another checkpoint or a snapshot read the dirty log since, or it is of another session): take a new one")]
    StaleCheckpoint,
    #[error("cannot resume this snapshot: {0}")]
    Incompatible(String),
    #[error("returning guest page {page} to its checkpoint: {source}")]
    ResetPage {
        page: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("setting up devices: {0}")]
    Devices(#[source] devices::DevicesError),
    #[error("setting up the network: {0}")]
    Network(String),
}

/// What a resumed run may set anew.
#[derive(Clone, Debug, Default)]
pub struct ResumeConfig {
    pub until: Option<VirtNanos>,
    pub record: RecordConfig,
}

fn kvm_err(call: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Kvm { call, source }
}

/// Everything that defines a run. Two runs with equal configs are identical.
#[derive(Clone, Debug)]
pub struct VmConfig {
    pub kernel: PathBuf,
    /// The complete initrd image (detvisor's command archive already appended).
    pub initrd: Vec<u8>,
    pub cmdline: String,
    pub ram_bytes: u64,
    pub seed: u64,
    pub until: Option<VirtNanos>,
    pub rtc_epoch_unix_secs: i64,
    pub record: RecordConfig,
    pub perturbation: Option<Perturbation>,
    /// NICs and the switch between them (none: no network devices).
    pub network: Option<NetworkSpec>,
    /// A virtio console as the machine's control channel (`/dev/hvc0`):
    /// the in-guest agent's under `up`, the fork-shell listener's under
    /// `run`; driven through [`Session::send_to_agent`] and
    /// [`Session::take_agent_output`].
    pub agent_channel: bool,
}

/// What a finished run reports.
#[derive(Clone, Debug)]
pub struct RunOutcome {
    pub stop: StopReason,
    pub virtual_time: VirtNanos,
    pub exits: u64,
    pub exits_by_kind: std::collections::BTreeMap<String, u64>,
    pub injected_interrupts: u64,
    /// Interrupt-window exits that followed an `STI` byte and were stepped
    /// past (host-dependent: not part of the digest).
    pub irq_windows_stepped: u64,
    /// Instructions single-stepped for them.
    pub single_steps: u64,
    pub wall: Duration,
    /// Wall time spent creating the VM and writing boot data.
    pub wall_setup: Duration,
    /// Wall time spent hashing the final state.
    pub wall_finish: Duration,
    pub digest: String,
    /// The parts of the digest, for telling which part of two runs differs:
    /// the exit records alone, final guest memory, final device state, console output.
    pub digest_parts: DigestParts,
    pub console_bytes: u64,
    pub unhandled_accesses: u64,
    /// Guest RAM the host had backed at the end (the rest was never touched).
    pub guest_resident_bytes: u64,
    pub records: Vec<ExitRecord>,
}

/// The components the run digest is made of (hex).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DigestParts {
    pub records: String,
    pub memory: String,
    pub devices: String,
    pub console: String,
}

/// Console output: forwarded live, and hashed into the digest.
struct ConsoleSink {
    shared: Arc<Mutex<ConsoleCapture>>,
}

struct ConsoleCapture {
    out: Box<dyn Write + Send>,
    hash: ChainHash,
    bytes: u64,
}

impl Write for ConsoleSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut capture = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        capture.hash.update(buf);
        capture.bytes += buf.len() as u64;
        // The host side of the console may go away (a closed pipe); the
        // guest's history must not depend on that, so errors are dropped.
        let _ = capture.out.write_all(buf);
        if buf.contains(&b'\n') {
            let _ = capture.out.flush();
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let mut capture = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        let _ = capture.out.flush();
        Ok(())
    }
}

/// Where the response to an exit goes in the kvm_run page.
enum ResponseSlot<'a> {
    None,
    Data(&'a mut [u8]),
    Msr {
        error: &'a mut u8,
        data: Option<&'a mut u64>,
    },
}

fn convert_exit(exit: VcpuExit<'_>) -> (Exit, ResponseSlot<'_>) {
    match exit {
        VcpuExit::IoIn(port, data) => (
            Exit::IoIn {
                port,
                len: data.len().min(8) as u8,
            },
            ResponseSlot::Data(data),
        ),
        VcpuExit::IoOut(port, data) => (
            Exit::IoOut {
                port,
                data: AccessData::new(data),
            },
            ResponseSlot::None,
        ),
        VcpuExit::MmioRead(addr, data) => (
            Exit::MmioRead {
                addr,
                len: data.len().min(8) as u8,
            },
            ResponseSlot::Data(data),
        ),
        VcpuExit::MmioWrite(addr, data) => (
            Exit::MmioWrite {
                addr,
                data: AccessData::new(data),
            },
            ResponseSlot::None,
        ),
        VcpuExit::X86Rdmsr(msr) => (
            Exit::RdMsr { index: msr.index },
            ResponseSlot::Msr {
                error: msr.error,
                data: Some(msr.data),
            },
        ),
        VcpuExit::X86Wrmsr(msr) => (
            Exit::WrMsr {
                index: msr.index,
                value: msr.data,
            },
            ResponseSlot::Msr {
                error: msr.error,
                data: None,
            },
        ),
        VcpuExit::Hlt => (Exit::Hlt, ResponseSlot::None),
        VcpuExit::IrqWindowOpen => (Exit::IrqWindowOpen, ResponseSlot::None),
        VcpuExit::Shutdown => (Exit::Shutdown, ResponseSlot::None),
        VcpuExit::SystemEvent(_, _) => (Exit::Shutdown, ResponseSlot::None),
        VcpuExit::Intr => (Exit::Interrupted, ResponseSlot::None),
        VcpuExit::Debug(_) => (Exit::SingleStep, ResponseSlot::None),
        VcpuExit::InternalError => (
            Exit::Fatal {
                reason: ExitFailure::InternalError { suberror: 0 },
            },
            ResponseSlot::None,
        ),
        VcpuExit::FailEntry(reason, _) => (
            Exit::Fatal {
                reason: ExitFailure::FailEntry { reason },
            },
            ResponseSlot::None,
        ),
        VcpuExit::Unsupported(code) => (
            Exit::Fatal {
                reason: ExitFailure::Unexpected { exit_reason: code },
            },
            ResponseSlot::None,
        ),
        other => (
            Exit::Fatal {
                reason: ExitFailure::Unexpected {
                    exit_reason: exit_reason_code(&other),
                },
            },
            ResponseSlot::None,
        ),
    }
}

/// Whether the byte before `rip` is `STI`'s opcode, i.e. whether the guest
/// may be in an STI shadow at this boundary. The guest runs with flat code
/// segments (base 0, 64-bit or compatibility mode), so RIP is the linear
/// address; a byte that is not mapped cannot have just executed.
fn follows_sti(vcpu: &VcpuFd, memory: &GuestMemory, rip: u64) -> bool {
    let Some(linear) = rip.checked_sub(1) else {
        return false;
    };
    match vcpu.translate_gva(linear) {
        Ok(t) if t.valid != 0 => memory
            .read_obj::<u8>(GuestAddress(t.physical_address))
            .is_ok_and(|byte| byte == irq_window::STI_OPCODE),
        _ => false,
    }
}

/// `follows_sti`, for kernel code only (CPL 0): user space cannot execute
/// `STI` (IOPL 0), and stepping user code could leave the trap flag in a
/// frame it saves (SYSCALL's R11, PUSHF), which would later trap for real.
fn follows_sti_in_kernel(vcpu: &VcpuFd, memory: &GuestMemory, rip: u64) -> bool {
    follows_sti(vcpu, memory, rip)
        && vcpu
            .get_sregs()
            .is_ok_and(|sregs| sregs.cs.selector & 3 == 0)
}

/// Turns KVM's single-stepping of the guest on or off.
fn set_single_step(vcpu: &VcpuFd, on: bool) -> Result<(), VmError> {
    let control = if on {
        kvm_bindings::KVM_GUESTDBG_ENABLE | kvm_bindings::KVM_GUESTDBG_SINGLESTEP
    } else {
        0
    };
    let debug = kvm_bindings::kvm_guest_debug {
        control,
        ..Default::default()
    };
    vcpu.set_guest_debug(&debug)
        .map_err(kvm_err("KVM_SET_GUEST_DEBUG"))
}

fn exit_reason_code(exit: &VcpuExit<'_>) -> u32 {
    match exit {
        VcpuExit::Unknown => kvm_bindings::KVM_EXIT_UNKNOWN,
        VcpuExit::Exception => kvm_bindings::KVM_EXIT_EXCEPTION,
        VcpuExit::Hypercall(_) => kvm_bindings::KVM_EXIT_HYPERCALL,
        _ => u32::MAX,
    }
}

fn complete(slot: ResponseSlot<'_>, completion: &Completion) {
    match (slot, completion) {
        (ResponseSlot::Data(buf), Completion::Data(data)) => {
            let n = buf.len().min(data.len());
            buf[..n].copy_from_slice(&data.as_slice()[..n]);
            // Bytes beyond what an access can carry read as all-ones.
            buf[n..].fill(0xff);
        }
        (ResponseSlot::Msr { error, data }, Completion::Msr(access)) => match access {
            MsrAccess::Value(v) => {
                *error = 0;
                if let Some(d) = data {
                    *d = *v;
                }
            }
            MsrAccess::GeneralProtection => *error = 1,
        },
        _ => {}
    }
}

fn regs_hash(regs: &kvm_bindings::kvm_regs) -> u64 {
    let words = [
        regs.rax,
        regs.rbx,
        regs.rcx,
        regs.rdx,
        regs.rsi,
        regs.rdi,
        regs.rsp,
        regs.rbp,
        regs.r8,
        regs.r9,
        regs.r10,
        regs.r11,
        regs.r12,
        regs.r13,
        regs.r14,
        regs.r15,
        regs.rip,
        regs.rflags,
    ];
    let mut bytes = [0u8; 18 * 8];
    for (chunk, w) in bytes.chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&w.to_le_bytes());
    }
    record::hash64(&bytes)
}

const PAGE_SIZE: usize = 4096;

/// Hash of guest RAM: every non-zero 4 KiB page, with its page number.
///
/// Pages the host never backed (per /proc/self/pagemap) are zero by construction and
/// are skipped without being touched, and zero pages that are backed are
/// skipped too, so the hash depends only on contents, never on which pages
/// the host happened to populate (transparent huge pages, read faults).
/// Cost is proportional to the memory the guest and VMM actually touched.
fn memory_hash(mem: &GuestMemory, backing: &MemoryBacking) -> u64 {
    memory_hash_and_residency(mem, backing).0
}

/// The memory hash, and how many bytes of guest RAM the host has backed.
fn memory_hash_and_residency(mem: &GuestMemory, backing: &MemoryBacking) -> (u64, u64) {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut resident_pages = 0u64;
    let base = mem
        .iter()
        .next()
        .map_or(std::ptr::null_mut(), |r| r.as_ptr());
    for region in mem.iter() {
        let (ptr, len) = (region.as_ptr(), region.len() as usize);
        let host_offset = (ptr as usize).wrapping_sub(base as usize) as u64;
        visit_candidate_pages(ptr, len, host_offset, backing, |page, chunk| {
            resident_pages += 1;
            if chunk.iter().all(|b| *b == 0) {
                return;
            }
            let gpa = region.start_addr().0 + (page * PAGE_SIZE) as u64;
            hasher.update(&gpa.to_le_bytes());
            hasher.update(chunk);
        });
    }
    (hasher.digest(), resident_pages * PAGE_SIZE as u64)
}

/// Calls `f(page index, page bytes)` for each page of guest RAM at
/// `ptr..ptr+len` (at `host_offset` in the RAM's host mapping, i.e. in a
/// snapshot's memory file) that may be non-zero (`candidate_pages`), in
/// order; the other pages are not touched.
fn visit_candidate_pages(
    ptr: *mut u8,
    len: usize,
    host_offset: u64,
    backing: &MemoryBacking,
    mut f: impl FnMut(usize, &[u8]),
) {
    let candidates = candidate_pages(ptr, len, host_offset, backing);
    // SAFETY: callers pass (part of) the live guest RAM mapping, owned by
    // the session, which outlives this borrow; the vCPU is stopped (callers
    // hold the session), so nothing writes to it meanwhile.
    let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
    for (page, chunk) in bytes.chunks_exact(PAGE_SIZE).enumerate() {
        if candidates[page] {
            f(page, chunk);
        }
    }
}

/// Per page of `ptr..ptr+len` (guest RAM at `host_offset` of its host
/// mapping): whether it may be non-zero (the others are zero and are best
/// not touched).
fn candidate_pages(
    ptr: *mut u8,
    len: usize,
    host_offset: u64,
    backing: &MemoryBacking,
) -> Vec<bool> {
    match backing {
        MemoryBacking::Anonymous => resident_pages_of(ptr, len),
        MemoryBacking::File { data_ranges } => {
            file_backed_candidates(ptr, len, host_offset, data_ranges)
        }
    }
}

/// Pages of an anonymous mapping the host has backed: present or swapped out
/// in /proc/self/pagemap (mincore would miss swapped pages); the others are
/// zero. If pagemap cannot be read, every page is a candidate.
fn resident_pages_of(ptr: *mut u8, len: usize) -> Vec<bool> {
    match pagemap_entries(ptr, len) {
        Some(entries) => entries
            .iter()
            .map(|e| e & (PAGEMAP_PRESENT | PAGEMAP_SWAPPED) != 0)
            .collect(),
        None => vec![true; len / PAGE_SIZE],
    }
}

const PAGEMAP_PRESENT: u64 = 1 << 63;
const PAGEMAP_SWAPPED: u64 = 1 << 62;
const PAGEMAP_FILE_OR_SHARED: u64 = 1 << 61;

/// This process's /proc/self/pagemap entries for the pages of `ptr..ptr+len`.
fn pagemap_entries(ptr: *mut u8, len: usize) -> Option<Vec<u64>> {
    use std::os::unix::fs::FileExt;
    let pages = len / PAGE_SIZE;
    let mut raw = vec![0u8; pages * 8];
    std::fs::File::open("/proc/self/pagemap")
        .and_then(|f| f.read_exact_at(&mut raw, (ptr as u64 / PAGE_SIZE as u64) * 8))
        .ok()?;
    Some(
        raw.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunk")))
            .collect(),
    )
}

/// Pages of a private file mapping that may be non-zero: those inside the
/// file's data ranges, and those the guest has written since the mapping was
/// made (present and anonymous in /proc/self/pagemap: copy-on-write copies).
/// Holes the guest never wrote are zero and are not touched (touching them
/// would fault each one in). If pagemap cannot be read, every page is a candidate.
fn file_backed_candidates(
    ptr: *mut u8,
    len: usize,
    host_offset: u64,
    data_ranges: &[(u64, u64)],
) -> Vec<bool> {
    let pages = len / PAGE_SIZE;
    let mut candidates = vec![false; pages];
    for &(start, end) in data_ranges {
        if end <= host_offset {
            continue;
        }
        let first = start.saturating_sub(host_offset) as usize / PAGE_SIZE;
        let last = (end.saturating_sub(host_offset) as usize).div_ceil(PAGE_SIZE);
        for flag in candidates.iter_mut().take(last).skip(first) {
            *flag = true;
        }
    }
    let Some(copies) = private_copies(ptr, len) else {
        return vec![true; pages];
    };
    for (flag, copied) in candidates.iter_mut().zip(copies) {
        *flag |= copied;
    }
    candidates
}

/// Per page of a private file mapping: whether it is a copy-on-write copy
/// (written since the mapping was made: present or swapped, anonymous in
/// /proc/self/pagemap). `None` if pagemap cannot be read.
fn private_copies(ptr: *mut u8, len: usize) -> Option<Vec<bool>> {
    Some(
        pagemap_entries(ptr, len)?
            .iter()
            .map(|e| {
                e & (PAGEMAP_PRESENT | PAGEMAP_SWAPPED) != 0 && e & PAGEMAP_FILE_OR_SHARED == 0
            })
            .collect(),
    )
}

fn devices_hash(devices: &Devices) -> u64 {
    let bytes = serde_json::to_vec(&devices.state()).unwrap_or_default();
    record::hash64(&bytes)
}

/// A created, booted-but-not-started VM.
struct Vm {
    vm: VmFd,
    vcpu: VcpuFd,
    memory: GuestMemory,
    /// Whether KVM logs the guest's writes to RAM (see `Session::start_dirty_log`).
    dirty_log: bool,
    /// The host mapping behind `memory` when the VMM made it (RAM split
    /// around the MMIO hole); dropped after everything that uses it.
    _mapping: Option<HostMapping>,
}

/// Guest RAM: the regions KVM and the devices see, host-contiguous in
/// region order (so page `n` of RAM is at byte `n * 4096` of one mapping and
/// of a snapshot's memory file), and the mapping behind them when the VMM
/// made it itself.
pub struct GuestRam {
    memory: GuestMemory,
    mapping: Option<HostMapping>,
}

impl GuestRam {
    fn unowned(memory: GuestMemory) -> Self {
        GuestRam {
            memory,
            mapping: None,
        }
    }

    /// RAM of `len` bytes split around the MMIO hole over a new mapping
    /// (anonymous, or of `file`) that it owns.
    fn split_over_new_mapping(len: u64, file: Option<&std::fs::File>) -> Result<Self, VmError> {
        let mapping = HostMapping::map(len, file)?;
        // SAFETY: the mapping is read-write and lives in the returned value,
        // beside the memory over it (and the `Vm` drops it last).
        let memory = unsafe { split_guest_memory(mapping.ptr, len)? };
        Ok(GuestRam {
            memory,
            mapping: Some(mapping),
        })
    }
}

/// A mapping the VMM made for guest RAM larger than the space below the
/// MMIO hole; its regions point into it without owning it. Unmapped on drop.
struct HostMapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value alone; the raw
// pointer is only used to unmap it on drop.
unsafe impl Send for HostMapping {}
// SAFETY: as above; `&HostMapping` gives no access to the memory.
unsafe impl Sync for HostMapping {}

impl Drop for HostMapping {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr+len` was mapped by `HostMapping::map` and is
        // unmapped once, here; the regions over it are gone (the `Vm` drops
        // its memory before this field).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

impl HostMapping {
    /// A private read-write mapping of `len` bytes: anonymous (zeros), or of
    /// `file` from its start (copy-on-write, read lazily).
    fn map(len: u64, file: Option<&std::fs::File>) -> Result<Self, VmError> {
        use std::os::fd::AsRawFd;
        let (flags, fd) = match file {
            Some(file) => (libc::MAP_PRIVATE | libc::MAP_NORESERVE, file.as_raw_fd()),
            None => (
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
            ),
        };
        // SAFETY: a new mapping at an address of the kernel's choosing; it
        // aliases nothing. `fd` is open for the duration of the call.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(memory_error(
                len,
                format!("mmap: {}", std::io::Error::last_os_error()),
            ));
        }
        Ok(HostMapping {
            ptr: ptr.cast(),
            len: len as usize,
        })
    }
}

/// The host mapping of all guest RAM: its start and length. Every
/// `GuestMemory` this module builds is host-contiguous in region order (one
/// region, or two split from one mapping by `split_guest_memory`).
fn host_ram(memory: &GuestMemory) -> (*mut u8, usize) {
    let mut regions = memory.iter();
    let Some(first) = regions.next() else {
        return (std::ptr::null_mut(), 0);
    };
    let mut len = first.len() as usize;
    for region in regions {
        debug_assert_eq!(region.as_ptr() as usize, first.as_ptr() as usize + len);
        len += region.len() as usize;
    }
    (first.as_ptr(), len)
}

/// Guest RAM over `len` bytes at `ptr`, split as `boot::ram_layout` says,
/// each region with a dirty bitmap.
///
/// # Safety
/// `ptr..ptr+len` must be a readable and writable mapping that stays valid
/// as long as the returned memory (and every clone of it) is in use.
unsafe fn split_guest_memory(ptr: *mut u8, len: u64) -> Result<GuestMemory, VmError> {
    let mut regions = Vec::new();
    for (guest_addr, host_offset, size) in boot::ram_layout(len) {
        // SAFETY: `host_offset + size <= len` by `ram_layout`, so the region
        // lies inside the caller's mapping, which outlives it.
        let region = unsafe {
            private_region_builder(size)
                .with_raw_mmap_pointer(ptr.add(host_offset as usize))
                .build()
        }
        .map_err(|e| memory_error(len, format!("a guest RAM region: {e}")))?;
        let region = vm_memory::GuestRegionMmap::new(region, GuestAddress(guest_addr))
            .ok_or_else(|| memory_error(len, "a guest RAM region does not fit".into()))?;
        regions.push(region);
    }
    GuestMemory::from_regions(regions).map_err(|e| memory_error(len, e.to_string()))
}

fn check_caps(kvm: &Kvm) -> Result<(), VmError> {
    for (cap, name) in [
        (Cap::X86UserSpaceMsr, "KVM_CAP_X86_USER_SPACE_MSR"),
        (Cap::X86MsrFilter, "KVM_CAP_X86_MSR_FILTER"),
        (Cap::SyncRegs, "KVM_CAP_SYNC_REGS"),
        (Cap::UserMemory, "KVM_CAP_USER_MEMORY"),
        (Cap::SetGuestDebug, "KVM_CAP_SET_GUEST_DEBUG"),
    ] {
        if !kvm.check_extension(cap) {
            return Err(VmError::MissingCapability(name));
        }
    }
    Ok(())
}

/// Gives KVM guest RAM (one slot per region) with the given slot flags.
fn register_memory(vm: &VmFd, memory: &GuestMemory, flags: u32) -> Result<(), VmError> {
    for (slot, region) in memory.iter().enumerate() {
        let region_desc = kvm_userspace_memory_region {
            slot: slot as u32,
            flags,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: region.as_ptr() as u64,
        };
        // SAFETY: the region is a live mapping of `memory`, which the `Vm`
        // owns together with the VM fd, so it outlives the VM's use of it.
        unsafe { vm.set_user_memory_region(region_desc) }
            .map_err(kvm_err("KVM_SET_USER_MEMORY_REGION"))?;
    }
    Ok(())
}

/// Creates the VM over `memory`, the fixed CPU model and MSR filter.
fn create_vm(kvm: &Kvm, ram: GuestRam) -> Result<Vm, VmError> {
    let GuestRam { memory, mapping } = ram;
    check_caps(kvm)?;
    let vm = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
    vm.set_tss_address(0xfffb_d000)
        .map_err(kvm_err("KVM_SET_TSS_ADDR"))?;
    register_memory(&vm, &memory, 0)?;

    // Every MSR outside the allow-list exits to us (default deny + user-space exits).
    let user_msr = kvm_bindings::kvm_enable_cap {
        cap: kvm_bindings::KVM_CAP_X86_USER_SPACE_MSR,
        args: [
            u64::from(
                KVM_MSR_EXIT_REASON_FILTER
                    | KVM_MSR_EXIT_REASON_UNKNOWN
                    | KVM_MSR_EXIT_REASON_INVAL,
            ),
            0,
            0,
            0,
        ],
        ..Default::default()
    };
    vm.enable_cap(&user_msr)
        .map_err(kvm_err("KVM_ENABLE_CAP(X86_USER_SPACE_MSR)"))?;
    let bitmaps: Vec<Vec<u8>> = cpu_model::ALLOWED_MSR_RANGES
        .iter()
        .map(|&(_, count)| vec![0xffu8; (count as usize).div_ceil(8)])
        .collect();
    let ranges: Vec<MsrFilterRange<'_>> = cpu_model::ALLOWED_MSR_RANGES
        .iter()
        .zip(&bitmaps)
        .map(|(&(base, count), bitmap)| MsrFilterRange {
            flags: MsrFilterRangeFlags::READ | MsrFilterRangeFlags::WRITE,
            base,
            msr_count: count,
            bitmap,
        })
        .collect();
    vm.set_msr_filter(MsrFilterDefaultAction::DENY, &ranges)
        .map_err(kvm_err("KVM_X86_SET_MSR_FILTER"))?;

    let mut vcpu = vm.create_vcpu(0).map_err(kvm_err("KVM_CREATE_VCPU"))?;
    vcpu.set_cpuid2(&cpu_model::kvm_cpuid())
        .map_err(kvm_err("KVM_SET_CPUID2"))?;
    // No local APIC: its base MSR says disabled (this also clears KVM's
    // dynamic CPUID APIC bit).
    let msrs = Msrs::from_entries(&[kvm_msr_entry {
        index: cpu_model::msr::IA32_APIC_BASE,
        data: 0,
        ..Default::default()
    }])
    .expect("one MSR entry fits");
    vcpu.set_msrs(&msrs).map_err(kvm_err("KVM_SET_MSRS"))?;
    vcpu.set_sync_valid_reg(SyncReg::Register);
    Ok(Vm {
        vm,
        vcpu,
        memory,
        dirty_log: false,
        _mapping: mapping,
    })
}

/// Keystrokes for the guest console, from an interactive terminal. They
/// arrive on host time, so a run that takes them is not reproducible.
pub type ConsoleInput = std::sync::mpsc::Receiver<Vec<u8>>;

/// Moves pending console input into the UART; on a halt with nothing else to
/// do, waits for it: until the next timer deadline, in wall time (so an idle
/// interactive guest's clock roughly follows the user's), or indefinitely when
/// no timer is pending.
fn feed_console_input(machine: &mut Machine, input: &ConsoleInput, halted: bool) {
    let mut fed = false;
    while let Ok(bytes) = input.try_recv() {
        machine.devices.enqueue_console_input(&bytes);
        fed = true;
    }
    if fed || !halted || machine.devices.has_pending_interrupt() {
        return;
    }
    let received = match machine.devices.next_deadline() {
        Some(deadline) => {
            let wait = deadline.saturating_sub(machine.now());
            input.recv_timeout(Duration::from_nanos(wait.0)).ok()
        }
        None => input.recv().ok(),
    };
    if let Some(bytes) = received {
        machine.devices.enqueue_console_input(&bytes);
    }
}

/// Everything a snapshot needs besides guest RAM: the vCPU, the devices, the
/// clock, the record stream's position and the console hash.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionState {
    pub ram_bytes: u64,
    pub seed: u64,
    /// The NICs and switch the machine was built with (attached again, then
    /// restored from `devices`).
    pub network: Option<NetworkSpec>,
    /// Whether the machine has the control channel (a virtio console).
    #[serde(default)]
    pub agent_channel: bool,
    pub cpu_model_version: u32,
    pub vcpu: VcpuState,
    pub devices: DevicesState,
    pub machine: MachineState,
    pub recorder: RecorderState,
    pub console_hash: ChainHash,
    pub console_bytes: u64,
    pub injected_interrupts: u64,
    /// kvm_run.request_interrupt_window as the loop left it.
    pub request_interrupt_window: u8,
}

/// A moment of a session kept in host memory, to return to in place
/// (`Session::reset_to`) as often as wanted: the fuzzing loop's reset.
pub struct Checkpoint {
    /// Unique in the process: `reset_to` accepts only the session's live
    /// checkpoint (the dirty log counts from it).
    id: u64,
    state: SessionState,
    /// Guest pages kept, by page number: where each one's bytes are in
    /// `bytes` (slot `i` is `bytes[i * PAGE_SIZE..][..PAGE_SIZE]`). At first
    /// the pages that differ from what the backing gives back after
    /// `MADV_DONTNEED` (zeros for fresh memory; the snapshot file's bytes for
    /// a restored session); resets add each other page the first time they
    /// return it, so later resets copy it without a page fault.
    slots: std::collections::BTreeMap<u64, usize>,
    bytes: Vec<u8>,
    /// Length of the guest RAM region it was taken of.
    ram_len: usize,
}

impl Checkpoint {
    pub fn exits(&self) -> u64 {
        self.state.machine.exits
    }

    /// Pages it keeps a copy of: when taken, for a session restored from a
    /// snapshot, its private copies (pages written since the restore, and
    /// layers read in rather than mapped); for a fresh one, the non-zero
    /// pages. Resets add the pages they return (see `reset_to`).
    pub fn pages_kept(&self) -> u64 {
        self.slots.len() as u64
    }

    /// The kept copy of `page`, if any.
    fn page(&self, page: u64) -> Option<&[u8]> {
        let slot = *self.slots.get(&page)?;
        Some(&self.bytes[slot * PAGE_SIZE..(slot + 1) * PAGE_SIZE])
    }

    fn keep(&mut self, page: u64, bytes: &[u8]) {
        self.slots.insert(page, self.slots.len());
        self.bytes.extend_from_slice(bytes);
    }
}

/// Source of `Checkpoint::id`.
static NEXT_CHECKPOINT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// What one in-place reset did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ResetStats {
    /// Pages written since the checkpoint (or the previous reset) copied back
    /// from the checkpoint ...
    pub pages_copied: u64,
    /// ... and returned to the backing's page instead (the snapshot file's,
    /// or zeros: what they were at the checkpoint), which the checkpoint
    /// keeps from now on.
    pub pages_fetched: u64,
}

/// How guest RAM is backed, which decides how pages are found for hashing.
enum MemoryBacking {
    /// Fresh anonymous memory: a page the host never backed is zero.
    Anonymous,
    /// A private mapping of a snapshot's memory file: pages inside the file's
    /// data ranges may be non-zero even when not resident.
    File { data_ranges: Vec<(u64, u64)> },
}

/// A booted guest and everything needed to run it one exit at a time.
pub struct Session {
    vm: Vm,
    backing: MemoryBacking,
    seed: u64,
    network: Option<NetworkSpec>,
    agent_channel: bool,
    machine: Machine,
    recorder: Recorder,
    console: Arc<Mutex<ConsoleCapture>>,
    input: Option<ConsoleInput>,
    injected_total: u64,
    /// Finds where interrupt windows really open (not saved: it is idle
    /// between exits, and its counters are per process).
    window: WindowGuard,
    /// The checkpoint the dirty log counts from, if any: any other reader of
    /// the log (a snapshot, a newer checkpoint) makes it stale.
    live_checkpoint: Option<u64>,
    started: Instant,
    wall_setup: Duration,
}

impl Session {
    /// Loads the kernel and boot data, creates the VM, and stops before the first instruction.
    pub fn boot(
        config: &VmConfig,
        console: Box<dyn Write + Send>,
        input: Option<ConsoleInput>,
    ) -> Result<Session, VmError> {
        if !(boot::MIN_RAM..=boot::MAX_RAM).contains(&config.ram_bytes) {
            return Err(BootError::RamSize(config.ram_bytes).into());
        }
        let started = Instant::now();
        let ram = fresh_ram(config.ram_bytes)?;
        let memory = ram.memory.clone();
        // Bad input (not a kernel, an initrd too large) is found before KVM is touched.
        let kernel = boot::load_kernel(&memory, &config.kernel)?;
        let (devices, console) = build_devices(
            ConsoleCapture {
                out: console,
                hash: ChainHash::default(),
                bytes: 0,
            },
            config.rtc_epoch_unix_secs,
            memory.clone(),
            config.seed,
            config.network.as_ref(),
            config.agent_channel,
        )?;
        // The virtio devices are declared on the kernel command line.
        let cmdline = format!("{} {}", config.cmdline, devices.virtio_cmdline());
        let mut rng_seed = [0u8; boot::RNG_SEED_LEN];
        EntropyStream::new(config.seed, stream::KERNEL_RNG_SEED).fill(&mut rng_seed);
        boot::write_boot_data(
            &memory,
            &kernel,
            &BootInputs {
                ram: config.ram_bytes,
                cmdline: &cmdline,
                initrd: &config.initrd,
                rng_seed,
            },
        )?;
        let kvm = Kvm::new().map_err(VmError::OpenKvm)?;
        let vm = create_vm(&kvm, ram)?;
        let sregs = vm.vcpu.get_sregs().map_err(kvm_err("KVM_GET_SREGS"))?;
        vm.vcpu
            .set_sregs(&boot::initial_sregs(sregs))
            .map_err(kvm_err("KVM_SET_SREGS"))?;
        vm.vcpu
            .set_regs(&boot::initial_regs(kernel.entry))
            .map_err(kvm_err("KVM_SET_REGS"))?;
        let fpu = kvm_bindings::kvm_fpu {
            fcw: 0x37f,
            mxcsr: 0x1f80,
            ..Default::default()
        };
        vm.vcpu.set_fpu(&fpu).map_err(kvm_err("KVM_SET_FPU"))?;

        let mut machine = Machine::new(devices, config.until);
        machine.set_perturbation(config.perturbation);
        Ok(Session {
            vm,
            backing: MemoryBacking::Anonymous,
            seed: config.seed,
            network: config.network.clone(),
            agent_channel: config.agent_channel,
            machine,
            recorder: Recorder::new(config.record),
            console,
            input,
            injected_total: 0,
            window: WindowGuard::default(),
            live_checkpoint: None,
            wall_setup: started.elapsed(),
            started,
        })
    }

    /// Enters the guest until it makes an exit of its own and handles that exit.
    fn step(&mut self) -> Result<ExitAction, VmError> {
        let (exit, action) = loop {
            let (exit, slot) = match self.vm.vcpu.run() {
                Ok(vcpu_exit) => convert_exit(vcpu_exit),
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    (Exit::Interrupted, ResponseSlot::None)
                }
                Err(e) => return Err(kvm_err("KVM_RUN")(e)),
            };
            // A signal to this thread is a host event, not a guest-caused
            // exit: it must not be counted or recorded, move the clock, feed
            // input or give an interrupt a chance to be injected. Enter again.
            if exit == Exit::Interrupted {
                continue;
            }
            let stop = match exit {
                Exit::IrqWindowOpen => irq_window::Stop::WindowOpen,
                Exit::SingleStep => irq_window::Stop::SingleStep,
                _ => irq_window::Stop::Other,
            };
            // A guest exit (`Other`) keeps its response slot; the guard hears
            // of it after the response is written (below).
            let (exit, slot) = if stop == irq_window::Stop::Other {
                (exit, slot)
            } else {
                match self.check_window(stop)? {
                    irq_window::Verdict::Deliver => (Exit::IrqWindowOpen, ResponseSlot::None),
                    irq_window::Verdict::Step | irq_window::Verdict::WaitForWindow => continue,
                    irq_window::Verdict::Unexpected => (Exit::SingleStep, ResponseSlot::None),
                }
            };
            if let Some(input) = &self.input {
                feed_console_input(&mut self.machine, input, exit == Exit::Hlt);
            }
            let action = self.machine.handle_exit(&exit);
            if let ExitAction::Resume(completion) = &action {
                complete(slot, completion);
            }
            if stop == irq_window::Stop::Other && self.window.stepping() {
                // The stepped instruction exited on its own: the exit is the
                // guest's, and stepping ends with it.
                self.check_window(stop)?;
            }
            break (exit, action);
        };
        let injected = match action {
            ExitAction::Resume(_) => self.decide_interrupt(&exit)?,
            ExitAction::Stop(_) => NO_VECTOR,
        };
        self.record(&exit, &action, injected);
        Ok(action)
    }

    /// Asks the window guard about a stop that may be (or end) the search
    /// for an interrupt window, and sets single-stepping and the window
    /// request to match its verdict.
    fn check_window(&mut self, stop: irq_window::Stop) -> Result<irq_window::Verdict, VmError> {
        let was_stepping = self.window.stepping();
        let interrupts_enabled = self.vm.vcpu.get_kvm_run().if_flag != 0;
        let rip = self.vm.vcpu.sync_regs().regs.rip;
        let vcpu = &self.vm.vcpu;
        let memory = &self.vm.memory;
        let verdict = self.window.on_stop(stop, interrupts_enabled, || {
            follows_sti_in_kernel(vcpu, memory, rip)
        });
        let stepping = self.window.stepping();
        // Armed again for every step: KVM paths that rewrite RFLAGS (its own
        // instruction emulation) may drop the trap flag it set.
        if stepping || was_stepping {
            set_single_step(&self.vm.vcpu, stepping)?;
        }
        let run = self.vm.vcpu.get_kvm_run();
        match verdict {
            // While stepping, a window request would end the step early.
            irq_window::Verdict::Step => run.request_interrupt_window = 0,
            irq_window::Verdict::WaitForWindow => run.request_interrupt_window = 1,
            irq_window::Verdict::Deliver | irq_window::Verdict::Unexpected => {}
        }
        Ok(verdict)
    }

    /// Injects a pending interrupt if the guest can take it, else asks KVM
    /// for an exit as soon as it can. Returns the injected vector or NO_VECTOR.
    ///
    /// An exit whose instruction completes only at the next entry (port,
    /// MMIO, MSR) and that follows an `STI` opcode byte may sit in the STI
    /// shadow: a correct host reports it not ready, a host that lost the
    /// shadow reports it ready. It counts as not ready on every host, so the
    /// interrupt waits for the window after the instruction either way.
    fn decide_interrupt(&mut self, exit: &Exit) -> Result<u16, VmError> {
        let run = self.vm.vcpu.get_kvm_run();
        let mut ready = run.ready_for_interrupt_injection != 0 && run.if_flag != 0;
        let incomplete = matches!(
            exit,
            Exit::IoIn { .. }
                | Exit::IoOut { .. }
                | Exit::MmioRead { .. }
                | Exit::MmioWrite { .. }
                | Exit::RdMsr { .. }
                | Exit::WrMsr { .. }
        );
        if ready && incomplete && self.machine.devices.has_pending_interrupt() {
            let rip = self.vm.vcpu.sync_regs().regs.rip;
            if follows_sti_in_kernel(&self.vm.vcpu, &self.vm.memory, rip) {
                ready = false;
            }
        }
        let (window, injected) = match self.machine.interrupt_action(ready) {
            InterruptAction::Inject(vector) => {
                kvm_util::inject_interrupt(&self.vm.vcpu, vector).map_err(VmError::Inject)?;
                self.injected_total += 1;
                (0, u16::from(vector))
            }
            InterruptAction::RequestWindow => (1, NO_VECTOR),
            InterruptAction::None => (0, NO_VECTOR),
        };
        self.vm.vcpu.get_kvm_run().request_interrupt_window = window;
        Ok(injected)
    }

    fn record(&mut self, exit: &Exit, action: &ExitAction, injected: u16) {
        let regs = self.vm.vcpu.sync_regs().regs;
        let index = self.machine.exits() - 1;
        let data = match (exit, action) {
            (Exit::IoOut { data, .. } | Exit::MmioWrite { data, .. }, _) => *data,
            (_, ExitAction::Resume(Completion::Data(data))) => *data,
            (Exit::WrMsr { value, .. }, _) => AccessData::new(&value.to_le_bytes()),
            (_, ExitAction::Resume(Completion::Msr(MsrAccess::Value(v)))) => {
                AccessData::new(&v.to_le_bytes())
            }
            _ => AccessData::default(),
        };
        let device_hash = if self.recorder.wants_device_hash(index) {
            devices_hash(&self.machine.devices)
        } else {
            NO_HASH
        };
        let memory_hash = if self.recorder.wants_memory_hash(index) {
            memory_hash(&self.vm.memory, &self.backing)
        } else {
            NO_HASH
        };
        self.recorder.push(ExitRecord {
            index,
            time: self.machine.now(),
            kind: exit.kind(),
            address: exit.address(),
            data: data.as_u64(),
            size: data.len() as u8,
            rip: regs.rip,
            regs_hash: regs_hash(&regs),
            injected,
            device_hash,
            memory_hash,
        });
    }

    /// Runs until the guest stops, or until `exit_limit` exits have been
    /// handled in all (`None` when the limit was reached first).
    pub fn run_until_exit(&mut self, exit_limit: u64) -> Result<Option<StopReason>, VmError> {
        while self.machine.exits() < exit_limit {
            if let ExitAction::Stop(reason) = self.step()? {
                return Ok(Some(reason));
            }
        }
        Ok(None)
    }

    /// Runs until the guest stops, or until `exit_limit` exits have been
    /// handled, or until virtual time reaches `time_limit`, whichever is first
    /// (`None` when a limit was reached before the guest stopped).
    pub fn run_until(
        &mut self,
        exit_limit: Option<u64>,
        time_limit: Option<VirtNanos>,
    ) -> Result<Option<StopReason>, VmError> {
        loop {
            if exit_limit.is_some_and(|limit| self.machine.exits() >= limit)
                || time_limit.is_some_and(|limit| self.machine.now() >= limit)
            {
                return Ok(None);
            }
            if let ExitAction::Stop(reason) = self.step()? {
                return Ok(Some(reason));
            }
        }
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Re-keys every seeded stream the guest still draws from (today the
    /// virtio-rng device) from `seed`: an alternate history from this moment.
    /// The stream is keyed by the seed and the exit index, so branching the
    /// same moment with the same seed twice gives the same history.
    pub fn set_seed(&mut self, seed: u64) {
        self.seed = seed;
        let name = format!("{}@exit{}", stream::VIRTIO_RNG, self.machine.exits());
        self.machine
            .devices
            .rekey_virtio_rng(entropy::stream_key(seed, &name));
    }

    /// Runs one exit (`Some` when the guest stopped there).
    pub fn step_one(&mut self) -> Result<Option<StopReason>, VmError> {
        match self.step()? {
            ExitAction::Stop(reason) => Ok(Some(reason)),
            ExitAction::Resume(_) => Ok(None),
        }
    }

    /// Queues a message for the agent on its control channel, delivered now
    /// (at this exit) as far as the guest has posted receive buffers. Call it
    /// only at points the run decides deterministically (after an exit chosen
    /// by guest output or virtual time).
    pub fn send_to_agent(&mut self, bytes: &[u8]) -> Result<(), VmError> {
        let now = self.machine.now();
        self.machine
            .devices
            .enqueue_virtio_console_input(now, bytes)
            .map_err(VmError::Devices)
    }

    /// What the agent wrote on its control channel since the last call. The
    /// bytes are folded into the console digest, so a run's digest covers the
    /// agent's conversation too.
    pub fn take_agent_output(&mut self) -> Vec<u8> {
        let bytes = self.machine.devices.take_virtio_console_output();
        if !bytes.is_empty() {
            let mut capture = self.console.lock().unwrap_or_else(|e| e.into_inner());
            capture.hash.update(&bytes);
            capture.bytes += bytes.len() as u64;
        }
        bytes
    }

    /// Makes an idle guest wake at `at` at the latest (instead of jumping past
    /// it to the next device deadline), so a host-side event scheduled for
    /// `at` happens on time. Part of the run's definition: two runs with the
    /// same wake-ups are identical.
    pub fn set_wakeup(&mut self, at: Option<VirtNanos>) {
        self.machine.wakeup = at;
    }

    /// Whether the machine has a control channel (the virtio console the
    /// agent, or a fork shell, talks over).
    pub fn has_control_channel(&self) -> bool {
        self.agent_channel
    }

    /// The devices, for scheduling network faults.
    pub fn devices_mut(&mut self) -> &mut devices::Devices {
        &mut self.machine.devices
    }

    /// Exits handled so far.
    pub fn exits(&self) -> u64 {
        self.machine.exits()
    }

    pub fn now(&self) -> VirtNanos {
        self.machine.now()
    }

    /// Guest RAM, for writing a snapshot. The vCPU is not running while borrowed.
    pub fn memory(&self) -> &[u8] {
        let (ptr, len) = host_ram(&self.vm.memory);
        // SAFETY: `host_ram` gives the live host mapping of all guest RAM,
        // owned by the session, which the returned borrow cannot outlive; the
        // vCPU only runs inside `&mut self` methods, so the memory does not
        // change meanwhile.
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }

    /// Starts tracking which guest pages change: KVM logs the guest's own
    /// writes, and the memory's bitmap the VMM's (device) writes. From here
    /// on, `take_dirty_pages` tells what changed since the previous call (or
    /// since now). Costs the guest a write fault per page per interval.
    pub fn start_dirty_log(&mut self) -> Result<(), VmError> {
        if !self.vm.dirty_log {
            register_memory(
                &self.vm.vm,
                &self.vm.memory,
                kvm_bindings::KVM_MEM_LOG_DIRTY_PAGES,
            )?;
            self.vm.dirty_log = true;
        }
        self.take_dirty_pages().map(drop)
    }

    /// The guest pages (page numbers, ascending) written since the previous
    /// call or `start_dirty_log`, by the guest or by the VMM; resets the log.
    /// May include a few pages that were only touched (KVM's own page-table
    /// walks), never misses a written one.
    pub fn take_dirty_pages(&mut self) -> Result<Vec<u64>, VmError> {
        // The log restarts here: a checkpoint counting from earlier is stale.
        self.live_checkpoint = None;
        self.read_dirty_log()
    }

    fn read_dirty_log(&mut self) -> Result<Vec<u64>, VmError> {
        if !self.vm.dirty_log {
            return Err(VmError::DirtyLogOff);
        }
        let mut pages = Vec::new();
        let mut first_page = 0u64;
        for (slot, region) in self.vm.memory.iter().enumerate() {
            let len = region.len() as usize;
            let guest_writes = self
                .vm
                .vm
                .get_dirty_log(slot as u32, len)
                .map_err(kvm_err("KVM_GET_DIRTY_LOG"))?;
            let mapping: &vm_memory::mmap::MmapRegion<AtomicBitmap> = region;
            let vmm_writes = mapping.bitmap().get_and_reset();
            let words = guest_writes.len().max(vmm_writes.len());
            for w in 0..words {
                let word = guest_writes.get(w).copied().unwrap_or(0)
                    | vmm_writes.get(w).copied().unwrap_or(0);
                let mut bits = word;
                while bits != 0 {
                    let bit = u64::from(bits.trailing_zeros());
                    pages.push(first_page + w as u64 * 64 + bit);
                    bits &= bits - 1;
                }
            }
            first_page += region.len() / PAGE_SIZE as u64;
        }
        Ok(pages)
    }

    /// Keeps this moment in memory for `reset_to`: the complete state and a
    /// copy of the pages the backing cannot give back by itself. Restored
    /// from a snapshot, those are only the pages written since the restore
    /// (the others are the file's, shared copy-on-write); fresh from boot,
    /// the non-zero pages. Starts the dirty log, so a reset costs only the
    /// pages written since; a session that is reset must not also take
    /// incremental snapshots (they share the log).
    pub fn checkpoint(&mut self) -> Result<Checkpoint, VmError> {
        let state = self.capture()?;
        self.start_dirty_log()?;
        let (ptr, ram_len) = host_ram(&self.vm.memory);
        let id = NEXT_CHECKPOINT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut checkpoint = Checkpoint {
            id,
            state,
            slots: std::collections::BTreeMap::new(),
            bytes: Vec::new(),
            ram_len,
        };
        let mut keep = |page: usize, chunk: &[u8]| checkpoint.keep(page as u64, chunk);
        match &self.backing {
            MemoryBacking::File { .. } => match private_copies(ptr, ram_len) {
                Some(copies) => {
                    // SAFETY: `ptr..ptr+ram_len` is the live guest RAM
                    // mapping, owned by the session, which outlives this
                    // borrow; the vCPU is stopped (we hold the session).
                    let ram = unsafe { std::slice::from_raw_parts(ptr, ram_len) };
                    for (page, chunk) in ram.chunks_exact(PAGE_SIZE).enumerate() {
                        if copies[page] {
                            keep(page, chunk);
                        }
                    }
                }
                // Without pagemap a page the guest zeroed cannot be told from
                // the file's: keep every page that may be non-zero, zero or not.
                None => visit_candidate_pages(ptr, ram_len, 0, &self.backing, keep),
            },
            // Fresh memory: `DONTNEED` gives back zeros, so every non-zero
            // page is kept.
            MemoryBacking::Anonymous => {
                visit_candidate_pages(ptr, ram_len, 0, &self.backing, |page, chunk| {
                    if chunk.iter().any(|b| *b != 0) {
                        keep(page, chunk);
                    }
                })
            }
        }
        self.live_checkpoint = Some(id);
        Ok(checkpoint)
    }

    /// Returns this session, in place, to `checkpoint` (taken from it): the
    /// pages written since the checkpoint or the previous reset are copied
    /// back, and the vCPU, devices, clock, records and console digest are
    /// restored. What runs next is exactly what ran after the checkpoint
    /// (or, after `set_seed`, an alternate history from it).
    pub fn reset_to(&mut self, checkpoint: &mut Checkpoint) -> Result<ResetStats, VmError> {
        if self.live_checkpoint != Some(checkpoint.id) {
            return Err(VmError::StaleCheckpoint);
        }
        let (base, len) = host_ram(&self.vm.memory);
        if checkpoint.ram_len != len {
            return Err(VmError::StaleCheckpoint);
        }
        if self.window.stepping() {
            // Only after a failed step: never leave the guest single-stepped.
            set_single_step(&self.vm.vcpu, false)?;
        }
        // A pending I/O completion would otherwise run after the restore and
        // change the restored registers.
        vcpu_state::complete_pending_exit(&mut self.vm.vcpu)?;
        let dirty = self.read_dirty_log()?;
        let (mut pages_copied, mut pages_fetched) = (0, 0);
        for &page in &dirty {
            let at = page as usize * PAGE_SIZE;
            if at + PAGE_SIZE > len {
                continue;
            }
            // SAFETY: `at..at+PAGE_SIZE` lies inside the single guest RAM
            // region (`len` is its length), a live writable mapping owned by
            // the session, and the vCPU is not running.
            let page_ptr = unsafe { base.add(at) };
            if checkpoint.page(page).is_none() {
                // The page was the backing's at the checkpoint: drop our
                // private copy, so reading it now gives the file's page (or
                // zeros), and keep that from now on.
                // SAFETY: one page inside the guest RAM mapping (see above),
                // no reference to it alive; DONTNEED on a private mapping only
                // discards our copy, and KVM's mappings follow (MMU notifier).
                if unsafe { libc::madvise(page_ptr.cast(), PAGE_SIZE, libc::MADV_DONTNEED) } != 0 {
                    return Err(VmError::ResetPage {
                        page,
                        source: std::io::Error::last_os_error(),
                    });
                }
                // SAFETY: as above; the slice lives only for this call.
                let backing = unsafe { std::slice::from_raw_parts(page_ptr, PAGE_SIZE) };
                checkpoint.keep(page, backing);
                pages_fetched += 1;
            } else {
                pages_copied += 1;
            }
            // Written back even when just fetched: the guest, which wrote
            // this page in this loop and likely will again, then finds a
            // private copy instead of faulting on it.
            let kept = checkpoint.page(page).expect("kept above");
            // SAFETY: `page_ptr` is one writable page of guest RAM (see
            // above); `kept` is the checkpoint's own buffer, not guest RAM.
            unsafe { std::ptr::copy_nonoverlapping(kept.as_ptr(), page_ptr, PAGE_SIZE) };
        }
        let state = &checkpoint.state;
        vcpu_state::restore(&self.vm.vcpu, &state.vcpu)?;
        self.vm.vcpu.get_kvm_run().request_interrupt_window = state.request_interrupt_window;
        self.machine
            .devices
            .restore(&state.devices)
            .map_err(|e| VmError::Incompatible(format!("device state: {e}")))?;
        self.machine.restore(&state.machine);
        // Not part of the state: a wake-up belongs to the run that set it.
        self.machine.wakeup = None;
        self.recorder.restore(&state.recorder);
        {
            let mut capture = self.console.lock().unwrap_or_else(|e| e.into_inner());
            capture.hash = state.console_hash;
            capture.bytes = state.console_bytes;
        }
        self.injected_total = state.injected_interrupts;
        self.seed = state.seed;
        self.window = WindowGuard::default();
        self.started = Instant::now();
        self.wall_setup = Duration::ZERO;
        Ok(ResetStats {
            pages_copied,
            pages_fetched,
        })
    }

    /// Captures the complete state between two exits (the pending exit is
    /// completed first, so a restored copy neither repeats nor skips it).
    pub fn capture(&mut self) -> Result<SessionState, VmError> {
        vcpu_state::complete_pending_exit(&mut self.vm.vcpu)?;
        let vcpu = vcpu_state::capture(&self.vm.vcpu)?;
        let (console_hash, console_bytes) = {
            let capture = self.console.lock().unwrap_or_else(|e| e.into_inner());
            (capture.hash, capture.bytes)
        };
        Ok(SessionState {
            ram_bytes: self.vm.memory.iter().map(|r| r.len()).sum(),
            seed: self.seed,
            network: self.network.clone(),
            agent_channel: self.agent_channel,
            cpu_model_version: cpu_model::CPU_MODEL_VERSION,
            vcpu,
            devices: self.machine.devices.state(),
            machine: self.machine.state(),
            recorder: self.recorder.state(),
            console_hash,
            console_bytes,
            injected_interrupts: self.injected_total,
            request_interrupt_window: self.vm.vcpu.get_kvm_run().request_interrupt_window,
        })
    }

    /// Resumes a captured session over `memory` (the snapshot's RAM, typically
    /// mapped private from its file, with `data_ranges` the file's non-hole
    /// byte ranges). `config` supplies the new run's limit, records and seed.
    pub fn resume(
        config: &ResumeConfig,
        state: &SessionState,
        ram: GuestRam,
        data_ranges: Vec<(u64, u64)>,
        console: Box<dyn Write + Send>,
        input: Option<ConsoleInput>,
    ) -> Result<Session, VmError> {
        let started = Instant::now();
        if state.cpu_model_version != cpu_model::CPU_MODEL_VERSION {
            return Err(VmError::Incompatible(format!(
                "snapshot was taken with CPU model version {}, this detvisor has {}",
                state.cpu_model_version,
                cpu_model::CPU_MODEL_VERSION
            )));
        }
        let ram_bytes: u64 = ram.memory.iter().map(|r| r.len()).sum();
        if ram_bytes != state.ram_bytes {
            return Err(VmError::Incompatible(format!(
                "snapshot memory is {ram_bytes} bytes, its state says {}",
                state.ram_bytes
            )));
        }
        let kvm = Kvm::new().map_err(VmError::OpenKvm)?;
        let devices_memory = ram.memory.clone();
        let mut vm = create_vm(&kvm, ram)?;
        vcpu_state::restore(&vm.vcpu, &state.vcpu)?;
        vm.vcpu.get_kvm_run().request_interrupt_window = state.request_interrupt_window;
        // The RTC epoch is part of the saved device state.
        let (mut devices, console) = build_devices(
            ConsoleCapture {
                out: console,
                hash: state.console_hash,
                bytes: state.console_bytes,
            },
            0,
            devices_memory,
            state.seed,
            state.network.as_ref(),
            state.agent_channel,
        )?;
        devices
            .restore(&state.devices)
            .map_err(|e| VmError::Incompatible(format!("device state: {e}")))?;
        let mut machine = Machine::new(devices, config.until);
        machine.restore(&state.machine);
        let mut recorder = Recorder::new(config.record);
        recorder.restore(&state.recorder);
        Ok(Session {
            vm,
            backing: MemoryBacking::File { data_ranges },
            seed: state.seed,
            network: state.network.clone(),
            agent_channel: state.agent_channel,
            machine,
            recorder,
            console,
            input,
            injected_total: state.injected_interrupts,
            window: WindowGuard::default(),
            live_checkpoint: None,
            wall_setup: started.elapsed(),
            started,
        })
    }

    /// Runs until the guest stops.
    pub fn run_to_end(&mut self) -> Result<StopReason, VmError> {
        loop {
            if let ExitAction::Stop(reason) = self.step()? {
                return Ok(reason);
            }
        }
    }

    /// Hashes the final state and reports the run.
    pub fn finish(mut self, stop: StopReason) -> RunOutcome {
        self.outcome(stop)
    }

    /// Hashes the current state and reports the run so far, leaving the
    /// session usable (for `reset_to`); its kept records move to the outcome.
    pub fn outcome(&mut self, stop: StopReason) -> RunOutcome {
        let finishing = Instant::now();
        let (final_memory, guest_resident_bytes) =
            memory_hash_and_residency(&self.vm.memory, &self.backing);

        let final_devices = devices_hash(&self.machine.devices);
        let (console_hash, console_bytes) = {
            let mut capture = self.console.lock().unwrap_or_else(|e| e.into_inner());
            let _ = capture.out.flush();
            (capture.hash.0, capture.bytes)
        };
        let exits = self.recorder.count();
        let exits_by_kind = self.recorder.counts_by_kind();
        let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let digest_parts = DigestParts {
            records: hex(&self.recorder.state().digest.0[..8]),
            memory: format!("{final_memory:016x}"),
            devices: format!("{final_devices:016x}"),
            console: hex(&console_hash[..8]),
        };
        let fresh = Recorder::new(self.recorder.config);
        let recorder = std::mem::replace(&mut self.recorder, fresh);
        self.recorder.restore(&recorder.state());
        let (digest, records) = recorder.finish(final_memory, final_devices, console_hash);
        RunOutcome {
            stop,
            virtual_time: self.machine.now(),
            exits,
            exits_by_kind,
            injected_interrupts: self.injected_total,
            irq_windows_stepped: self.window.corrected_windows,
            single_steps: self.window.steps,
            wall: self.started.elapsed(),
            wall_setup: self.wall_setup,
            wall_finish: finishing.elapsed(),
            digest,
            digest_parts,
            console_bytes,
            unhandled_accesses: self.machine.devices.unhandled_accesses(),
            guest_resident_bytes,
            records,
        }
    }
}

/// The simulated network: how many NICs (one per node) and how the switch
/// between them behaves.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    pub nics: u8,
    pub config: NetworkConfig,
}

/// The MAC address of NIC `index` (locally administered, unicast).
pub fn nic_mac(index: u8) -> [u8; 6] {
    [0x52, 0x54, 0x00, 0xd7, 0x00, index + 1]
}

/// The device set of a machine, with the console hashed and forwarded
/// through `console` (shared with the session, which reads its hash).
fn build_devices(
    console: ConsoleCapture,
    rtc_epoch_unix_secs: i64,
    memory: GuestMemory,
    seed: u64,
    network: Option<&NetworkSpec>,
    agent_channel: bool,
) -> Result<(Devices, Arc<Mutex<ConsoleCapture>>), VmError> {
    let console = Arc::new(Mutex::new(console));
    let mut devices = Devices::new(
        DevicesConfig {
            rtc_epoch_unix_secs,
        },
        Box::new(ConsoleSink {
            shared: console.clone(),
        }),
    );
    attach_virtio(&mut devices, memory, seed, network, agent_channel)?;
    Ok((devices, console))
}

/// Attaches the virtio devices, in a fixed order (their slots are part of the
/// guest-visible machine and of saved device state): the entropy device, the
/// agent's control channel if any, then one NIC per node and the switch
/// between them.
fn attach_virtio(
    devices: &mut Devices,
    memory: GuestMemory,
    seed: u64,
    network: Option<&NetworkSpec>,
    agent_channel: bool,
) -> Result<(), VmError> {
    devices.attach_guest_memory(memory);
    devices
        .attach_virtio_rng(entropy::stream_key(seed, stream::VIRTIO_RNG))
        .map_err(VmError::Devices)?;
    if agent_channel {
        devices.attach_virtio_console().map_err(VmError::Devices)?;
    }
    if let Some(network) = network {
        for index in 0..network.nics {
            devices
                .attach_virtio_net(nic_mac(index))
                .map_err(VmError::Devices)?;
        }
        devices
            .attach_switch(
                entropy::stream_key(seed, stream::NETWORK_SWITCH),
                network.config,
            )
            .map_err(|e| VmError::Network(e.to_string()))?;
    }
    Ok(())
}

/// Guest RAM mapped private (copy-on-write) from a snapshot's memory file:
/// nothing is read up front; pages fault in from the file as the guest
/// touches them, and guest writes never reach the file.
pub fn memory_from_file(file: std::fs::File, len: u64) -> Result<GuestRam, VmError> {
    if len > boot::LOW_RAM_LIMIT {
        return GuestRam::split_over_new_mapping(len, Some(&file));
    }
    let region = private_region_builder(len)
        .with_file_offset(vm_memory::FileOffset::new(file, 0))
        .build()
        .map_err(|e| memory_error(len, format!("mapping the snapshot memory: {e}")))?;
    single_region_memory(region, len).map(GuestRam::unowned)
}

/// Fresh, zeroed guest RAM of `len` bytes.
fn fresh_ram(len: u64) -> Result<GuestRam, VmError> {
    if len > boot::LOW_RAM_LIMIT {
        return GuestRam::split_over_new_mapping(len, None);
    }
    GuestMemory::from_ranges(&[(GuestAddress(0), len as usize)])
        .map(GuestRam::unowned)
        .map_err(|e| memory_error(len, e.to_string()))
}

/// Guest RAM over an existing mapping of `len` bytes at `ptr` (e.g. a
/// snapshot chain mapped private, base image plus overlays), with a dirty
/// bitmap like all guest RAM. The mapping is never unmapped: it must stay
/// valid for the rest of the process (a resumed session is its process's
/// guest for the process's lifetime).
///
/// # Safety
/// `ptr..ptr+len` must be a readable and writable mapping that nothing else
/// unmaps or reuses for the rest of the process.
pub unsafe fn memory_from_mapping(ptr: *mut u8, len: u64) -> Result<GuestRam, VmError> {
    if len > boot::LOW_RAM_LIMIT {
        // SAFETY: the caller guarantees the mapping is valid, read-write and
        // never unmapped.
        return unsafe { split_guest_memory(ptr, len) }.map(GuestRam::unowned);
    }
    // SAFETY: the caller guarantees the mapping is valid, PROT_READ|PROT_WRITE
    // and outlives the region (it is never unmapped).
    let region = unsafe {
        private_region_builder(len)
            .with_raw_mmap_pointer(ptr)
            .build()
    }
    .map_err(|e| memory_error(len, format!("adopting the snapshot memory: {e}")))?;
    single_region_memory(region, len).map(GuestRam::unowned)
}

fn memory_error(bytes: u64, reason: String) -> VmError {
    VmError::Memory { bytes, reason }
}

/// A private, read-write mapping of `len` bytes of snapshot memory, with a
/// dirty bitmap of its size: what the VMM writes is tracked.
fn private_region_builder(len: u64) -> vm_memory::mmap::MmapRegionBuilder<AtomicBitmap> {
    let bitmap = <AtomicBitmap as vm_memory::bitmap::NewBitmap>::with_len(len as usize);
    vm_memory::mmap::MmapRegionBuilder::new_with_bitmap(len as usize, bitmap)
        .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
        .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
}

/// Guest RAM made of `region` alone, at guest address 0.
fn single_region_memory(
    region: vm_memory::mmap::MmapRegion<AtomicBitmap>,
    len: u64,
) -> Result<GuestMemory, VmError> {
    let region = vm_memory::GuestRegionMmap::new(region, GuestAddress(0)).ok_or_else(|| {
        memory_error(
            len,
            "the snapshot memory does not fit the guest address space".into(),
        )
    })?;
    GuestMemory::from_regions(vec![region]).map_err(|e| memory_error(len, e.to_string()))
}

/// Boots and runs a guest to completion.
pub fn run(
    config: &VmConfig,
    console: Box<dyn Write + Send>,
    input: Option<ConsoleInput>,
) -> Result<RunOutcome, VmError> {
    let mut session = Session::boot(config, console, input)?;
    let stop = session.run_to_end()?;
    Ok(session.finish(stop))
}
