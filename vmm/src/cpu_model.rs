//! The fixed virtual CPU the guest sees.
//!
//! CPUID is built from this table alone, never from the host's CPUID, so a
//! guest behaves the same on every x86-64 host and a snapshot can move between
//! hosts. The model is deliberately plain (roughly x86-64-v2): no TSC, no
//! TSC-deadline, no RDTSCP, no RDRAND/RDSEED, no XSAVE/AVX, no APIC, no
//! paravirtual leaves, no hypervisor bit. The vendor string is our own, which
//! makes Linux take its generic, vendor-neutral CPU paths (no vendor MSR probing).
//!
//! MSRs: the guest may touch a short allow-list of architectural MSRs that KVM
//! keeps per vCPU (syscall entry points, segment bases, EFER, PAT). Every other
//! MSR access exits to the VMM (KVM MSR filter, default deny) and is answered
//! from [`emulate_rdmsr`] / [`emulate_wrmsr`], so nothing about the host's MSRs
//! (TSC, microcode revision, platform info, ...) can leak into the guest.

use kvm_bindings::{kvm_cpuid_entry2, CpuId, KVM_CPUID_FLAG_SIGNIFCANT_INDEX};
use serde::{Deserialize, Serialize};

/// Bumped whenever anything guest-visible in this file changes; recorded in run summaries.
pub const CPU_MODEL_VERSION: u32 = 2;

/// "AuthenticAMD" split across EBX, EDX, ECX as CPUID leaf 0 returns it.
///
/// Version 1 said "DetvisorVCPU". glibc only reads CPUID leaf 1 for vendors
/// it knows (Intel, AMD, Hygon, Zhaoxin/Centaur), so with an unknown vendor
/// its dynamic loader sees no SSE2/CMOV and refuses every library marked
/// `x86-64-baseline` ("CPU ISA level is lower than required"): Debian's
/// dynamically linked binaries (etcd) would not start. AMD, because KVM
/// treats every non-Intel vendor as AMD already (SYSCALL emulation, CPUID
/// of out-of-range leaves), and family 6 so Linux's AMD code takes no
/// family-specific path on x86-64 (no K8 errata MSRs, no Zen mitigations).
const VENDOR_EBX: u32 = u32::from_le_bytes(*b"Auth");
const VENDOR_EDX: u32 = u32::from_le_bytes(*b"enti");
const VENDOR_ECX: u32 = u32::from_le_bytes(*b"cAMD");

const BRAND: &[u8; 48] = b"detvisor deterministic virtual CPU\0\0\0\0\0\0\0\0\0\0\0\0\0\0";

/// CPUID.1:EDX feature bits we expose.
pub mod leaf1_edx {
    pub const FPU: u32 = 1 << 0;
    pub const VME: u32 = 1 << 1;
    pub const DE: u32 = 1 << 2;
    pub const PSE: u32 = 1 << 3;
    pub const TSC: u32 = 1 << 4;
    pub const MSR: u32 = 1 << 5;
    pub const PAE: u32 = 1 << 6;
    pub const CX8: u32 = 1 << 8;
    pub const APIC: u32 = 1 << 9;
    pub const SEP: u32 = 1 << 11;
    pub const PGE: u32 = 1 << 13;
    pub const CMOV: u32 = 1 << 15;
    pub const PAT: u32 = 1 << 16;
    pub const PSE36: u32 = 1 << 17;
    pub const CLFSH: u32 = 1 << 19;
    pub const MMX: u32 = 1 << 23;
    pub const FXSR: u32 = 1 << 24;
    pub const SSE: u32 = 1 << 25;
    pub const SSE2: u32 = 1 << 26;
}

/// CPUID.1:ECX feature bits we expose.
pub mod leaf1_ecx {
    pub const SSE3: u32 = 1 << 0;
    pub const SSSE3: u32 = 1 << 9;
    pub const CX16: u32 = 1 << 13;
    pub const SSE41: u32 = 1 << 19;
    pub const SSE42: u32 = 1 << 20;
    pub const POPCNT: u32 = 1 << 23;
    pub const TSC_DEADLINE: u32 = 1 << 24;
    pub const XSAVE: u32 = 1 << 26;
    pub const AVX: u32 = 1 << 28;
    pub const RDRAND: u32 = 1 << 30;
    pub const HYPERVISOR: u32 = 1 << 31;
}

pub const LEAF1_EDX: u32 = {
    use leaf1_edx::*;
    FPU | VME
        | DE
        | PSE
        | MSR
        | PAE
        | CX8
        | SEP
        | PGE
        | CMOV
        | PAT
        | PSE36
        | CLFSH
        | MMX
        | FXSR
        | SSE
        | SSE2
};

pub const LEAF1_ECX: u32 = {
    use leaf1_ecx::*;
    SSE3 | SSSE3 | CX16 | SSE41 | SSE42 | POPCNT
};

/// CPUID.80000001:ECX: LAHF/SAHF in long mode.
const EXT1_ECX_LAHF_LM: u32 = 1 << 0;
/// CPUID.80000001:EDX: SYSCALL, NX, long mode (no RDTSCP, no 1 GiB pages).
const EXT1_EDX: u32 = (1 << 11) | (1 << 20) | (1 << 29);

/// Family 6, model 2, stepping 3: an arbitrary, fixed signature.
const LEAF1_EAX: u32 = 0x0000_0623;
/// CLFLUSH line size 8 qwords, one logical processor, initial APIC id 0.
const LEAF1_EBX: u32 = 0x0001_0800;

/// One CPUID leaf of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuidLeaf {
    pub function: u32,
    pub index: u32,
    pub significant_index: bool,
    pub eax: u32,
    pub ebx: u32,
    pub ecx: u32,
    pub edx: u32,
}

const fn leaf(function: u32, eax: u32, ebx: u32, ecx: u32, edx: u32) -> CpuidLeaf {
    CpuidLeaf {
        function,
        index: 0,
        significant_index: false,
        eax,
        ebx,
        ecx,
        edx,
    }
}

fn brand_leaf(function: u32, part: usize) -> CpuidLeaf {
    let word = |i: usize| {
        let at = part * 16 + i * 4;
        u32::from_le_bytes([BRAND[at], BRAND[at + 1], BRAND[at + 2], BRAND[at + 3]])
    };
    leaf(function, word(0), word(1), word(2), word(3))
}

/// The complete CPUID table of the model.
pub fn cpuid_leaves() -> Vec<CpuidLeaf> {
    let mut leaves = vec![
        leaf(0, 7, VENDOR_EBX, VENDOR_ECX, VENDOR_EDX),
        leaf(1, LEAF1_EAX, LEAF1_EBX, LEAF1_ECX, LEAF1_EDX),
        // Leaves 2..=6 say nothing (no cache descriptors, no monitor/mwait, no thermal).
        leaf(2, 0, 0, 0, 0),
        leaf(3, 0, 0, 0, 0),
        leaf(5, 0, 0, 0, 0),
        leaf(6, 0, 0, 0, 0),
        leaf(0x8000_0000, 0x8000_0008, VENDOR_EBX, VENDOR_ECX, VENDOR_EDX),
        leaf(0x8000_0001, 0, 0, EXT1_ECX_LAHF_LM, EXT1_EDX),
        brand_leaf(0x8000_0002, 0),
        brand_leaf(0x8000_0003, 1),
        brand_leaf(0x8000_0004, 2),
        leaf(0x8000_0005, 0, 0, 0, 0),
        leaf(0x8000_0006, 0, 0, 0, 0),
        // No invariant TSC or any other power-management bit.
        leaf(0x8000_0007, 0, 0, 0, 0),
        // 40 physical and 48 linear address bits.
        leaf(0x8000_0008, 0x0000_3028, 0, 0, 0),
    ];
    // Leaf 4 (cache parameters) and leaf 7 (structured extended features) are
    // index-dependent; subleaf 0 of each is all zeroes.
    for function in [4u32, 7] {
        leaves.push(CpuidLeaf {
            function,
            index: 0,
            significant_index: true,
            eax: 0,
            ebx: 0,
            ecx: 0,
            edx: 0,
        });
    }
    leaves.sort_by_key(|l| (l.function, l.index));
    leaves
}

/// The table in the form KVM_SET_CPUID2 takes.
pub fn kvm_cpuid() -> CpuId {
    let entries: Vec<kvm_cpuid_entry2> = cpuid_leaves()
        .iter()
        .map(|l| kvm_cpuid_entry2 {
            function: l.function,
            index: l.index,
            flags: if l.significant_index {
                KVM_CPUID_FLAG_SIGNIFCANT_INDEX
            } else {
                0
            },
            eax: l.eax,
            ebx: l.ebx,
            ecx: l.ecx,
            edx: l.edx,
            ..Default::default()
        })
        .collect();
    CpuId::from_entries(&entries).expect("the fixed CPUID table fits in a CpuId")
}

pub mod msr {
    pub const IA32_TSC: u32 = 0x10;
    pub const IA32_APIC_BASE: u32 = 0x1b;
    pub const IA32_MISC_ENABLE: u32 = 0x1a0;
    pub const IA32_SYSENTER_CS: u32 = 0x174;
    pub const IA32_SYSENTER_ESP: u32 = 0x175;
    pub const IA32_SYSENTER_EIP: u32 = 0x176;
    pub const IA32_PAT: u32 = 0x277;
    pub const EFER: u32 = 0xc000_0080;
    pub const STAR: u32 = 0xc000_0081;
    pub const LSTAR: u32 = 0xc000_0082;
    pub const CSTAR: u32 = 0xc000_0083;
    pub const SFMASK: u32 = 0xc000_0084;
    pub const FS_BASE: u32 = 0xc000_0100;
    pub const GS_BASE: u32 = 0xc000_0101;
    pub const KERNEL_GS_BASE: u32 = 0xc000_0102;
}

/// MSRs the guest reads and writes directly (KVM keeps them per vCPU; none
/// holds host state). Contiguous runs, as KVM's filter ranges want them.
pub const ALLOWED_MSR_RANGES: &[(u32, u32)] = &[
    (msr::IA32_SYSENTER_CS, 3),
    (msr::IA32_PAT, 1),
    (msr::EFER, 5),
    (msr::FS_BASE, 3),
];

/// The MSRs a snapshot must carry (the allow-list above, plus the TSC which
/// KVM keeps even though the guest cannot read it).
pub fn saved_msrs() -> Vec<u32> {
    ALLOWED_MSR_RANGES
        .iter()
        .flat_map(|&(base, count)| base..base + count)
        .collect()
}

/// The answer to an MSR access that exits to the VMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsrAccess {
    /// Complete the access (for a read, with this value).
    Value(u64),
    /// Inject #GP, as hardware does for an MSR that does not exist.
    GeneralProtection,
}

/// Reads of MSRs outside the allow-list. Only a few get a value; the rest
/// fault, as on a CPU that lacks them (Linux probes with rdmsr_safe).
pub fn emulate_rdmsr(index: u32) -> MsrAccess {
    match index {
        // No APIC: the base MSR reads as "disabled".
        msr::IA32_APIC_BASE => MsrAccess::Value(0),
        // Fast strings enabled, nothing else.
        msr::IA32_MISC_ENABLE => MsrAccess::Value(1),
        _ => MsrAccess::GeneralProtection,
    }
}

/// Writes of MSRs outside the allow-list: accepted and dropped where a read
/// has a value, faulting otherwise.
pub fn emulate_wrmsr(index: u32, _value: u64) -> MsrAccess {
    match emulate_rdmsr(index) {
        MsrAccess::Value(_) => MsrAccess::Value(0),
        MsrAccess::GeneralProtection => MsrAccess::GeneralProtection,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(function: u32) -> CpuidLeaf {
        *cpuid_leaves()
            .iter()
            .find(|l| l.function == function && l.index == 0)
            .unwrap()
    }

    #[test]
    fn test_leaf1_hides_host_dependent_features() {
        let l1 = find(1);
        for bit in [leaf1_edx::TSC, leaf1_edx::APIC] {
            assert_eq!(l1.edx & bit, 0);
        }
        for bit in [
            leaf1_ecx::RDRAND,
            leaf1_ecx::TSC_DEADLINE,
            leaf1_ecx::XSAVE,
            leaf1_ecx::AVX,
            leaf1_ecx::HYPERVISOR,
        ] {
            assert_eq!(l1.ecx & bit, 0);
        }
        assert_ne!(l1.edx & leaf1_edx::SSE2, 0);
    }

    #[test]
    fn test_leaf7_has_no_rdseed_or_other_features() {
        assert_eq!(find(7).ebx, 0);
    }

    #[test]
    fn test_ext_leaf_has_no_rdtscp_but_long_mode() {
        let ext = find(0x8000_0001);
        assert_eq!(ext.edx & (1 << 27), 0, "RDTSCP must be hidden");
        assert_ne!(ext.edx & (1 << 29), 0, "long mode must be present");
    }

    #[test]
    fn test_max_leaves_cover_every_table_entry() {
        let max_basic = find(0).eax;
        let max_ext = find(0x8000_0000).eax;
        for l in cpuid_leaves() {
            if l.function < 0x8000_0000 {
                assert!(l.function <= max_basic, "leaf {:#x}", l.function);
            } else {
                assert!(l.function <= max_ext, "leaf {:#x}", l.function);
            }
        }
    }

    #[test]
    fn test_vendor_and_brand_strings() {
        let l0 = find(0);
        let mut vendor = Vec::new();
        for r in [l0.ebx, l0.edx, l0.ecx] {
            vendor.extend_from_slice(&r.to_le_bytes());
        }
        assert_eq!(&vendor, b"AuthenticAMD");
        let mut brand = Vec::new();
        for f in 0x8000_0002..=0x8000_0004 {
            let l = find(f);
            for r in [l.eax, l.ebx, l.ecx, l.edx] {
                brand.extend_from_slice(&r.to_le_bytes());
            }
        }
        assert!(brand.starts_with(b"detvisor deterministic virtual CPU"));
    }

    #[test]
    fn test_kvm_cpuid_has_every_leaf() {
        assert_eq!(kvm_cpuid().as_slice().len(), cpuid_leaves().len());
    }

    #[test]
    fn test_tsc_msr_faults_and_misc_enable_reads_fixed_value() {
        assert_eq!(emulate_rdmsr(msr::IA32_TSC), MsrAccess::GeneralProtection);
        assert_eq!(emulate_rdmsr(msr::IA32_MISC_ENABLE), MsrAccess::Value(1));
        assert_eq!(
            emulate_wrmsr(msr::IA32_TSC, 5),
            MsrAccess::GeneralProtection
        );
    }
}
