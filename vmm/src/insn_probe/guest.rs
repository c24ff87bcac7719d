//! The bare probe guest: a few instructions of 32-bit protected-mode code
//! (flat segments, no paging, no IDT) on a fresh VM, entered at CPL 0 or at
//! CPL 3 with its segments' privilege set directly through KVM_SET_SREGS.
//!
//! The counting entry, [`COUNT_ENTRY`], runs a loop whose every iteration
//! adds its own length in instructions (3) to ESI, then a `REP STOSB` of EBX
//! iterations, then reports ESI on [`REPORT_PORT`]. With ECX = N on entry the
//! guest's own count is 3N; the instructions it does not count are the four
//! after the loop (`mov ecx,ebx`, `rep stosb` as one instruction, `mov
//! eax,esi`, `mov dx,port`), so single-stepping to the report must take
//! 3N + 3 + (the steps the REP took) steps. RFLAGS.IOPL is 3, so the
//! report's `OUT` works at CPL 3 too.

use crate::cpu_model;
use crate::probe::BareVm;
use kvm_bindings::{kvm_guest_debug, kvm_segment};
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd};
use vm_memory::{Bytes, GuestAddress};

/// Port the probe guest reports its count on.
pub const REPORT_PORT: u16 = 0x510;
const MEMORY_BYTES: usize = 0x10000;
const CODE_ADDR: u64 = 0x1000;
/// Where `REP STOSB` writes (EDI), below the end of memory by more than
/// [`MAX_REP`] bytes.
const REP_BUFFER: u64 = 0x8000;
/// The most REP iterations a probe asks for.
pub const MAX_REP: u32 = 0x4000;

/// The counting loop: `add esi,3` (the loop's 3 instructions); `dec ecx`;
/// `jnz` back.
pub const COUNT_ENTRY: u64 = CODE_ADDR;
/// `dec ecx`, inside the loop: executed once per iteration.
pub const LOOP_DEC: u64 = CODE_ADDR + 3;
/// `rep stosb`.
pub const REP_STOSB: u64 = CODE_ADDR + 8;
/// `mov eax,esi`, right after the REP.
pub const AFTER_REP: u64 = CODE_ADDR + 0xa;
/// Instructions between the loop and the report that the guest does not
/// count, with the REP as one.
pub const UNCOUNTED: u64 = 4;

/// `mov esi,7; int3; mov eax,esi; mov dx,0x510; out dx,eax; hlt`.
pub const INT3_ENTRY: u64 = CODE_ADDR + 0x20;
/// The `int3` of [`INT3_ENTRY`].
pub const INT3_AT: u64 = INT3_ENTRY + 5;
/// What the INT3 entry reports once past its `int3`.
pub const INT3_REPORT: u32 = 7;

const CODE: &[(u64, &[u8])] = &[
    (
        COUNT_ENTRY,
        &[
            0x83, 0xc6, 0x03, // add esi, 3
            0x49, // dec ecx
            0x75, 0xfa, // jnz COUNT_ENTRY
            0x89, 0xd9, // mov ecx, ebx
            0xf3, 0xaa, // rep stosb
            0x89, 0xf0, // mov eax, esi
            0x66, 0xba, 0x10, 0x05, // mov dx, 0x510
            0xef, // out dx, eax
            0xf4, // hlt
        ],
    ),
    (
        INT3_ENTRY,
        &[
            0xbe, 0x07, 0x00, 0x00, 0x00, // mov esi, 7
            0xcc, // int3
            0x89, 0xf0, // mov eax, esi
            0x66, 0xba, 0x10, 0x05, // mov dx, 0x510
            0xef, // out dx, eax
            0xf4, // hlt
        ],
    ),
];

/// The privilege level the guest runs at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cpl {
    Kernel,
    User,
}

impl Cpl {
    fn dpl(self) -> u8 {
        match self {
            Cpl::Kernel => 0,
            Cpl::User => 3,
        }
    }
}

/// One probe VM with its single vCPU, ready at an entry point.
pub struct ProbeVm {
    // Field order is drop order: the vCPU and VM go before the memory
    // KVM maps.
    pub vcpu: VcpuFd,
    _bare: BareVm,
}

/// How one run of the guest ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The guest reported this value on [`REPORT_PORT`].
    Report(u32),
    /// KVM_EXIT_DEBUG: exception vector, RIP (linear), DR6.
    Debug { exception: u32, pc: u64, dr6: u64 },
    /// Anything else, described.
    Other(String),
}

impl Stop {
    /// What the stop was, in words.
    pub fn describe(&self) -> String {
        match self {
            Stop::Report(value) => format!("the guest's report {value}"),
            Stop::Debug { exception, pc, dr6 } => {
                format!("a debug exit (exception {exception} at {pc:#x}, dr6 {dr6:#x})")
            }
            Stop::Other(exit) => format!("the exit {exit}"),
        }
    }
}

fn segment(selector: u16, type_: u8, dpl: u8) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector: selector | u16::from(dpl),
        type_,
        present: 1,
        dpl,
        db: 1,
        s: 1,
        l: 0,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

impl ProbeVm {
    /// A fresh VM whose vCPU is about to execute `entry` at `cpl`, with
    /// ECX = `loops` and EBX = `rep`.
    pub fn new(kvm: &Kvm, cpl: Cpl, entry: u64, loops: u32, rep: u32) -> Result<ProbeVm, String> {
        let bare = BareVm::new(kvm, MEMORY_BYTES)?;
        let (vm, memory) = (&bare.vm, &bare.memory);
        for (addr, code) in CODE {
            memory
                .write_slice(code, GuestAddress(*addr))
                .map_err(|e| format!("writing the probe code: {e}"))?;
        }
        let vcpu = vm
            .create_vcpu(0)
            .map_err(|e| format!("KVM_CREATE_VCPU: {e}"))?;
        vcpu.set_cpuid2(&cpu_model::kvm_cpuid())
            .map_err(|e| format!("KVM_SET_CPUID2: {e}"))?;
        let mut sregs = vcpu
            .get_sregs()
            .map_err(|e| format!("KVM_GET_SREGS: {e}"))?;
        let dpl = cpl.dpl();
        sregs.cs = segment(0x08, 0xb, dpl);
        let data = segment(0x10, 0x3, dpl);
        (sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss) = (data, data, data, data, data);
        sregs.tr = kvm_segment {
            limit: 0x67,
            selector: 0x18,
            type_: 0xb,
            s: 0,
            db: 0,
            g: 0,
            ..segment(0x18, 0xb, 0)
        };
        sregs.ldt = kvm_segment {
            unusable: 1,
            present: 0,
            ..segment(0, 0x2, 0)
        };
        sregs.cr0 = 0x11; // PE | ET: protected mode, no paging
        sregs.cr4 = 0;
        sregs.efer = 0;
        vcpu.set_sregs(&sregs)
            .map_err(|e| format!("KVM_SET_SREGS: {e}"))?;
        let mut regs = vcpu.get_regs().map_err(|e| format!("KVM_GET_REGS: {e}"))?;
        regs.rip = entry;
        regs.rflags = 0x2 | 0x3000; // IOPL 3: OUT works at every CPL
        regs.rcx = u64::from(loops);
        regs.rbx = u64::from(rep.min(MAX_REP));
        regs.rdi = REP_BUFFER;
        regs.rsi = 0;
        vcpu.set_regs(&regs)
            .map_err(|e| format!("KVM_SET_REGS: {e}"))?;
        Ok(ProbeVm { vcpu, _bare: bare })
    }

    /// Sets KVM's guest-debug control and debug registers.
    pub fn set_debug(&self, control: u32, debugreg: [u64; 8]) -> Result<(), String> {
        let mut debug = kvm_guest_debug {
            control,
            ..Default::default()
        };
        debug.arch.debugreg = debugreg;
        self.vcpu
            .set_guest_debug(&debug)
            .map_err(|e| format!("KVM_SET_GUEST_DEBUG: {e}"))
    }

    /// Enters the guest once.
    pub fn run(&mut self) -> Result<Stop, String> {
        Ok(
            match self.vcpu.run().map_err(|e| format!("KVM_RUN: {e}"))? {
                VcpuExit::IoOut(REPORT_PORT, data) if data.len() == 4 => {
                    Stop::Report(u32::from_le_bytes([data[0], data[1], data[2], data[3]]))
                }
                VcpuExit::Debug(arch) => Stop::Debug {
                    exception: arch.exception,
                    pc: arch.pc,
                    dr6: arch.dr6,
                },
                other => Stop::Other(format!("{other:?}")),
            },
        )
    }

    /// The guest's RIP.
    pub fn rip(&self) -> Result<u64, String> {
        self.vcpu
            .get_regs()
            .map(|r| r.rip)
            .map_err(|e| format!("KVM_GET_REGS: {e}"))
    }

    /// Changes the guest's RIP and RFLAGS by `f`.
    pub fn edit_regs(&self, f: impl FnOnce(&mut kvm_bindings::kvm_regs)) -> Result<(), String> {
        let mut regs = self
            .vcpu
            .get_regs()
            .map_err(|e| format!("KVM_GET_REGS: {e}"))?;
        f(&mut regs);
        self.vcpu
            .set_regs(&regs)
            .map_err(|e| format!("KVM_SET_REGS: {e}"))
    }

    /// The guest's current privilege level, as KVM reports it (SS.DPL).
    pub fn cpl(&self) -> Result<u8, String> {
        self.vcpu
            .get_sregs()
            .map(|s| s.ss.dpl)
            .map_err(|e| format!("KVM_GET_SREGS: {e}"))
    }
}
