//! What this host's KVM offers, found by asking it and by running a probe guest.
//!
//! The decisive question is functional, not a name: does KVM honour the
//! fixed CPU model? A tiny real-mode guest executes CPUID leaf 1 and reports
//! what it sees; a KVM that shows host feature bits instead of ours (as
//! `kvm_pvm` does) cannot give a deterministic guest.

use crate::cpu_model;
use crate::insn_probe::{self, Clocks, InsnProbes};
use kvm_bindings::{kvm_msr_entry, kvm_userspace_memory_region, Msrs};
use kvm_ioctls::{Cap, Kvm, VcpuExit};
use serde::{Deserialize, Serialize};
use std::path::Path;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// Port the probe guest reports CPUID values on.
const PROBE_PORT: u16 = 0x510;
const PROBE_CODE_ADDR: u64 = 0x1000;

/// mov eax,1; cpuid; mov esi,edx; mov eax,ecx; mov dx,0x510; out dx,eax;
/// mov eax,esi; out dx,eax; hlt (EDX is saved first: the port number goes in DX).
const PROBE_CODE: &[u8] = &[
    0x66, 0xb8, 0x01, 0x00, 0x00, 0x00, // mov eax, 1
    0x0f, 0xa2, // cpuid
    0x66, 0x89, 0xd6, // mov esi, edx
    0x66, 0x89, 0xc8, // mov eax, ecx
    0xba, 0x10, 0x05, // mov dx, 0x510
    0x66, 0xef, // out dx, eax
    0x66, 0x89, 0xf0, // mov eax, esi
    0x66, 0xef, // out dx, eax
    0xf4, // hlt
];

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CpuidProbe {
    pub expected_ecx: u32,
    pub expected_edx: u32,
    pub seen_ecx: u32,
    pub seen_edx: u32,
}

impl CpuidProbe {
    pub fn honoured(&self) -> bool {
        self.expected_ecx == self.seen_ecx && self.expected_edx == self.seen_edx
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HostReport {
    pub kvm_device: bool,
    /// Loaded KVM modules (kvm_intel, kvm_amd, kvm_pvm, ...), from /sys/module.
    pub kvm_modules: Vec<String>,
    /// `vmx` or `svm` in /proc/cpuinfo.
    pub hardware_virtualization: Option<String>,
    /// A hardware PMU is registered with perf (instruction counting possible).
    pub hardware_pmu: bool,
    pub kvm_api_version: Option<i32>,
    pub user_space_msr: bool,
    pub msr_filter: bool,
    pub sync_regs: bool,
    pub dirty_log_ring: bool,
    pub immediate_exit: bool,
    pub cpuid_probe: Option<CpuidProbe>,
    pub probe_error: Option<String>,
    /// Whether detvisor can run guests on this host's KVM directly.
    pub can_run_guests: bool,
    /// Why not, if not.
    pub reason: Option<String>,
    /// Which clocks a run could use here (`detvisor check` only: the
    /// probes take a second or more).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clocks: Option<Clocks>,
    /// What the instruction probes measured, behind `clocks`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instruction_probes: Option<Box<InsnProbes>>,
}

fn kvm_modules() -> Vec<String> {
    let mut found: Vec<String> = ["kvm_intel", "kvm_amd", "kvm_pvm", "kvm"]
        .iter()
        .filter(|m| Path::new("/sys/module").join(m).exists())
        .map(|m| m.to_string())
        .collect();
    found.sort();
    found
}

fn hardware_virtualization() -> Option<String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let flags = cpuinfo.lines().find(|l| l.starts_with("flags"))?;
    ["vmx", "svm"]
        .iter()
        .find(|f| flags.split_whitespace().any(|w| w == **f))
        .map(|f| f.to_string())
}

fn hardware_pmu() -> bool {
    // Software-only perf setups have no "cpu" (or cpu_core) PMU with events.
    ["cpu", "cpu_core", "cpu_atom"].iter().any(|p| {
        Path::new("/sys/bus/event_source/devices")
            .join(p)
            .join("events")
            .exists()
    })
}

/// A bare probe guest's VM and its memory: `bytes` at guest address 0,
/// mapped by the VM's one slot. Field order is drop order: the VM goes
/// before the memory it maps.
pub(crate) struct BareVm {
    pub vm: kvm_ioctls::VmFd,
    pub memory: GuestMemoryMmap<()>,
}

impl BareVm {
    pub(crate) fn new(kvm: &Kvm, bytes: usize) -> Result<BareVm, String> {
        let memory = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), bytes)])
            .map_err(|e| format!("guest memory: {e}"))?;
        let vm = kvm.create_vm().map_err(|e| format!("KVM_CREATE_VM: {e}"))?;
        let region = memory.iter().next().ok_or("no memory region")?;
        let desc = kvm_userspace_memory_region {
            slot: 0,
            flags: 0,
            guest_phys_addr: 0,
            memory_size: region.len(),
            userspace_addr: region.as_ptr() as u64,
        };
        // SAFETY: `desc` describes the live mapping `memory`, which the
        // returned BareVm drops after `vm` (field order), so KVM never sees
        // it unmapped.
        unsafe { vm.set_user_memory_region(desc) }
            .map_err(|e| format!("KVM_SET_USER_MEMORY_REGION: {e}"))?;
        Ok(BareVm { vm, memory })
    }
}

/// Runs the CPUID probe guest and returns what it saw.
pub fn probe_cpuid(kvm: &Kvm) -> Result<CpuidProbe, String> {
    let bare = BareVm::new(kvm, 0x10000)?;
    let (vm, mem) = (&bare.vm, &bare.memory);
    mem.write_slice(PROBE_CODE, GuestAddress(PROBE_CODE_ADDR))
        .map_err(|e| e.to_string())?;
    let mut vcpu = vm
        .create_vcpu(0)
        .map_err(|e| format!("KVM_CREATE_VCPU: {e}"))?;
    vcpu.set_cpuid2(&cpu_model::kvm_cpuid())
        .map_err(|e| format!("KVM_SET_CPUID2: {e}"))?;
    let msrs = Msrs::from_entries(&[kvm_msr_entry {
        index: cpu_model::msr::IA32_APIC_BASE,
        data: 0,
        ..Default::default()
    }])
    .map_err(|e| e.to_string())?;
    vcpu.set_msrs(&msrs)
        .map_err(|e| format!("KVM_SET_MSRS: {e}"))?;
    let mut sregs = vcpu.get_sregs().map_err(|e| e.to_string())?;
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    vcpu.set_sregs(&sregs).map_err(|e| e.to_string())?;
    let mut regs = vcpu.get_regs().map_err(|e| e.to_string())?;
    regs.rip = PROBE_CODE_ADDR;
    regs.rflags = 2;
    vcpu.set_regs(&regs).map_err(|e| e.to_string())?;

    let mut seen = Vec::new();
    for _ in 0..16 {
        match vcpu.run().map_err(|e| format!("KVM_RUN: {e}"))? {
            VcpuExit::IoOut(PROBE_PORT, data) if data.len() == 4 => {
                seen.push(u32::from_le_bytes([data[0], data[1], data[2], data[3]]));
            }
            VcpuExit::Hlt => break,
            other => return Err(format!("probe guest stopped unexpectedly: {other:?}")),
        }
    }
    if seen.len() != 2 {
        return Err(format!(
            "probe guest reported {} values, expected 2",
            seen.len()
        ));
    }
    Ok(CpuidProbe {
        expected_ecx: cpu_model::LEAF1_ECX,
        expected_edx: cpu_model::LEAF1_EDX,
        seen_ecx: seen[0],
        seen_edx: seen[1],
    })
}

/// Everything `detvisor check` reports.
pub fn host_report() -> HostReport {
    let kvm_device = Path::new("/dev/kvm").exists();
    let mut report = HostReport {
        kvm_device,
        kvm_modules: kvm_modules(),
        hardware_virtualization: hardware_virtualization(),
        hardware_pmu: hardware_pmu(),
        kvm_api_version: None,
        user_space_msr: false,
        msr_filter: false,
        sync_regs: false,
        dirty_log_ring: false,
        immediate_exit: false,
        cpuid_probe: None,
        probe_error: None,
        can_run_guests: false,
        reason: None,
        clocks: None,
        instruction_probes: None,
    };
    let kvm = match Kvm::new() {
        Ok(kvm) => kvm,
        Err(e) => {
            report.reason = Some(format!("cannot open /dev/kvm: {e}"));
            return report;
        }
    };
    report.kvm_api_version = Some(kvm.get_api_version());
    report.user_space_msr = kvm.check_extension(Cap::X86UserSpaceMsr);
    report.msr_filter = kvm.check_extension(Cap::X86MsrFilter);
    report.sync_regs = kvm.check_extension(Cap::SyncRegs);
    report.dirty_log_ring =
        kvm.check_extension_raw(u64::from(kvm_bindings::KVM_CAP_DIRTY_LOG_RING) as _) > 0;
    report.immediate_exit = kvm.check_extension(Cap::ImmediateExit);
    match probe_cpuid(&kvm) {
        Ok(probe) => report.cpuid_probe = Some(probe),
        Err(e) => report.probe_error = Some(e),
    }
    report.reason = if !report.user_space_msr || !report.msr_filter || !report.sync_regs {
        Some("KVM lacks user-space MSR exits, MSR filters or sync regs".into())
    } else if let Some(e) = &report.probe_error {
        Some(format!("the CPUID probe guest failed: {e}"))
    } else {
        report
            .cpuid_probe
            .as_ref()
            .filter(|p| !p.honoured())
            .map(|p| {
                format!(
                    "KVM does not honour the fixed CPU model: CPUID.1 reads ecx={:#010x} \
                     edx={:#010x}, expected ecx={:#010x} edx={:#010x}",
                    p.seen_ecx, p.seen_edx, p.expected_ecx, p.expected_edx
                )
            })
    };
    report.can_run_guests = report.reason.is_none();
    report
}

/// [`host_report`] with the instruction probes run and the clocks they
/// allow (`detvisor check`).
pub fn host_report_with_clocks() -> HostReport {
    let mut report = host_report();
    let probes = match Kvm::new() {
        Ok(kvm) => insn_probe::run_probes(&kvm, report.hardware_pmu),
        Err(e) => {
            let reason = format!("cannot open /dev/kvm: {e}");
            InsnProbes {
                step: insn_probe::Probed::failed(&reason),
                step_rate: insn_probe::Probed::failed(&reason),
                user_step: insn_probe::Probed::failed(&reason),
                hardware_breakpoints: insn_probe::Probed::failed(&reason),
                int3: insn_probe::Probed::failed(&reason),
                pmu: insn_probe::pmu::PmuProbe::unprobed(report.hardware_pmu, &reason),
            }
        }
    };
    report.clocks = Some(Clocks::from_probes(&probes, report.reason.as_deref()));
    report.instruction_probes = Some(Box::new(probes));
    report
}
