//! Loading a Linux kernel for the 64-bit boot protocol and laying out low memory.
//!
//! Guest-physical layout (all below 1 MiB, then the kernel at its ELF addresses):
//! - 0x500 GDT, 0x7000 zero page (boot_params), 0x8ff0 initial stack top,
//! - 0x9000 PML4, 0xa000 PDPT, 0xb000..0xf000 four page directories
//!   (the first 4 GiB identity-mapped with 2 MiB pages),
//! - 0x20000 kernel command line, 0x21000 setup_data (RNG seed),
//! - 0x9f000 the clock page (`devices::clock_page`, reserved in the e820 map),
//! - 0xe0000 ACPI tables (reserved in the e820 map),
//! - the initrd at the top of RAM.

use crate::acpi;
use devices::{layout, GuestMemory};
use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params};
use linux_loader::loader::elf::Elf;
use linux_loader::loader::KernelLoader;
use std::path::{Path, PathBuf};
use thiserror::Error;
use vm_memory::{Bytes, GuestAddress};

pub const GDT_ADDR: u64 = 0x500;
pub const ZERO_PAGE_ADDR: u64 = 0x7000;
pub const BOOT_STACK_TOP: u64 = 0x8ff0;
pub const PML4_ADDR: u64 = 0x9000;
pub const PDPT_ADDR: u64 = 0xa000;
pub const PD_ADDR: u64 = 0xb000;
pub const CMDLINE_ADDR: u64 = 0x2_0000;
/// Linux's x86 COMMAND_LINE_SIZE.
pub const CMDLINE_MAX: usize = 2048;
pub const SETUP_DATA_ADDR: u64 = 0x2_1000;
/// Start of RAM above the legacy hole.
pub const HIGH_RAM_START: u64 = 0x10_0000;
/// End of conventional memory: the clock page and what a PC keeps for
/// the EBDA follow, reserved.
pub const LOW_RAM_END: u64 = layout::CLOCK_PAGE_ADDR;
/// Where the 32-bit MMIO hole starts (virtio-mmio, HPET, the TSS KVM
/// needs): RAM below it is one region at guest address 0 ...
pub const LOW_RAM_LIMIT: u64 = 3 << 30;
/// ... and RAM beyond it continues at 4 GiB.
pub const HIGH_RAM_BASE: u64 = 1 << 32;
/// The largest RAM detvisor gives a guest.
pub const MAX_RAM: u64 = 64 << 30;
/// The smallest RAM a kernel and initramfs can boot in.
pub const MIN_RAM: u64 = 64 << 20;
/// Bytes of seed handed to the kernel RNG.
pub const RNG_SEED_LEN: usize = 32;

const SETUP_RNG_SEED: u32 = 9;
const E820_RAM: u32 = 1;
const E820_RESERVED: u32 = 2;
const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
const KERNEL_HDR_MAGIC: u32 = 0x5372_6448;
const KERNEL_LOADER_OTHER: u8 = 0xff;
const KERNEL_MIN_ALIGNMENT: u32 = 0x100_0000;

#[derive(Debug, Error)]
pub enum BootError {
    /// Not a regular file (a FIFO would hang the open), or it cannot be opened.
    #[error("cannot open the kernel")]
    OpenKernel(#[source] hostfile::ReadError),
    #[error("{path} is not a loadable x86-64 vmlinux ELF kernel: {reason}")]
    NotAKernel { path: PathBuf, reason: String },
    #[error("initrd of {initrd} bytes does not fit in {ram} bytes of guest RAM next to the kernel (kernel ends at {kernel_end:#x})")]
    InitrdTooLarge {
        initrd: u64,
        ram: u64,
        kernel_end: u64,
    },
    #[error("kernel command line is {len} bytes; the limit is {max}")]
    CmdlineTooLong { len: usize, max: usize },
    #[error("kernel command line contains a NUL byte")]
    CmdlineNul,
    #[error("guest RAM of {0} bytes is out of range ({MIN_RAM}..={MAX_RAM})")]
    RamSize(u64),
    #[error("writing boot data to guest memory at {addr:#x}: {reason}")]
    GuestMemory { addr: u64, reason: String },
}

/// Where the kernel ended up and where to start it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadedKernel {
    pub entry: u64,
    pub kernel_end: u64,
    /// Where the kernel keeps its CRNG, if its symbol table says (see
    /// [`crate::guest_crng`]).
    pub guest_crng: Option<crate::guest_crng::GuestCrng>,
}

fn write(mem: &GuestMemory, addr: u64, bytes: &[u8]) -> Result<(), BootError> {
    mem.write_slice(bytes, GuestAddress(addr))
        .map_err(|e| BootError::GuestMemory {
            addr,
            reason: e.to_string(),
        })
}

/// Loads the vmlinux ELF at its physical addresses, and finds its CRNG.
pub fn load_kernel(mem: &GuestMemory, path: &Path) -> Result<LoadedKernel, BootError> {
    let mut file = hostfile::open_regular(path).map_err(BootError::OpenKernel)?;
    let result =
        Elf::load(mem, None, &mut file, Some(GuestAddress(HIGH_RAM_START))).map_err(|e| {
            BootError::NotAKernel {
                path: path.to_owned(),
                reason: e.to_string(),
            }
        })?;
    Ok(LoadedKernel {
        entry: result.kernel_load.0,
        kernel_end: result.kernel_end,
        // From the file just loaded, not opened again.
        guest_crng: crate::guest_crng::GuestCrng::find(file),
    })
}

/// Where `ram` bytes of guest RAM go: `(guest address, offset in the host
/// mapping, length)` per region, in host order. Up to [`LOW_RAM_LIMIT`] one
/// region at 0; the rest at [`HIGH_RAM_BASE`], right after it on the host
/// (the host mapping, and so a snapshot's memory file, is contiguous).
pub fn ram_layout(ram: u64) -> Vec<(u64, u64, u64)> {
    let low = ram.min(LOW_RAM_LIMIT);
    let mut layout = vec![(0, 0, low)];
    if ram > LOW_RAM_LIMIT {
        layout.push((HIGH_RAM_BASE, LOW_RAM_LIMIT, ram - LOW_RAM_LIMIT));
    }
    layout
}

/// The e820 map for `ram` bytes laid out as [`ram_layout`] says.
pub fn e820_map(ram: u64) -> Vec<boot_e820_entry> {
    let entry = |addr: u64, end: u64, kind: u32| boot_e820_entry {
        addr,
        size: end - addr,
        r#type: kind,
    };
    let mut map = vec![
        entry(0, LOW_RAM_END, E820_RAM),
        entry(LOW_RAM_END, 0xa_0000, E820_RESERVED),
        entry(acpi::ACPI_TABLES_ADDR, acpi::ACPI_TABLES_END, E820_RESERVED),
        entry(HIGH_RAM_START, ram.min(LOW_RAM_LIMIT), E820_RAM),
    ];
    if ram > LOW_RAM_LIMIT {
        map.push(entry(
            HIGH_RAM_BASE,
            HIGH_RAM_BASE + (ram - LOW_RAM_LIMIT),
            E820_RAM,
        ));
    }
    map
}

/// Page-aligned address for an initrd of `len` bytes at the top of the RAM
/// below the MMIO hole (the kernel reads it from there early, before it
/// maps memory above 4 GiB).
pub fn initrd_address(ram: u64, kernel_end: u64, len: u64) -> Result<u64, BootError> {
    let too_large = BootError::InitrdTooLarge {
        initrd: len,
        ram,
        kernel_end,
    };
    let start = ram.min(LOW_RAM_LIMIT).checked_sub(len).ok_or(too_large)? & !0xfff;
    if start < kernel_end {
        return Err(BootError::InitrdTooLarge {
            initrd: len,
            ram,
            kernel_end,
        });
    }
    Ok(start)
}

/// Everything `write_boot_data` needs besides the loaded kernel.
pub struct BootInputs<'a> {
    pub ram: u64,
    pub cmdline: &'a str,
    pub initrd: &'a [u8],
    pub rng_seed: [u8; RNG_SEED_LEN],
}

/// Writes the command line, initrd, RNG seed, ACPI tables, page tables, GDT and zero page.
pub fn write_boot_data(
    mem: &GuestMemory,
    kernel: &LoadedKernel,
    inputs: &BootInputs<'_>,
) -> Result<(), BootError> {
    if inputs.cmdline.len() >= CMDLINE_MAX {
        return Err(BootError::CmdlineTooLong {
            len: inputs.cmdline.len(),
            max: CMDLINE_MAX - 1,
        });
    }
    if inputs.cmdline.contains('\0') {
        return Err(BootError::CmdlineNul);
    }
    let mut cmdline = inputs.cmdline.as_bytes().to_vec();
    cmdline.push(0);
    write(mem, CMDLINE_ADDR, &cmdline)?;

    let mut params = boot_params::default();
    params.hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
    params.hdr.header = KERNEL_HDR_MAGIC;
    params.hdr.version = 0x020f;
    params.hdr.type_of_loader = KERNEL_LOADER_OTHER;
    params.hdr.kernel_alignment = KERNEL_MIN_ALIGNMENT;
    params.hdr.cmd_line_ptr = CMDLINE_ADDR as u32;
    params.hdr.cmdline_size = cmdline.len() as u32;

    if !inputs.initrd.is_empty() {
        let addr = initrd_address(inputs.ram, kernel.kernel_end, inputs.initrd.len() as u64)?;
        write(mem, addr, inputs.initrd)?;
        params.hdr.ramdisk_image = addr as u32;
        params.hdr.ramdisk_size = inputs.initrd.len() as u32;
    }

    // setup_data: the kernel mixes this seed into its RNG and credits it
    // (random.trust_bootloader), then wipes it from memory.
    // struct setup_data { u64 next; u32 type; u32 len; u8 data[]; }
    let mut setup = Vec::with_capacity(16 + RNG_SEED_LEN);
    setup.extend_from_slice(&0u64.to_le_bytes());
    setup.extend_from_slice(&SETUP_RNG_SEED.to_le_bytes());
    setup.extend_from_slice(&(RNG_SEED_LEN as u32).to_le_bytes());
    setup.extend_from_slice(&inputs.rng_seed);
    write(mem, SETUP_DATA_ADDR, &setup)?;
    params.hdr.setup_data = SETUP_DATA_ADDR;

    let (tables, rsdp) = acpi::build_tables(acpi::ACPI_TABLES_ADDR);
    for (addr, bytes) in &tables {
        write(mem, *addr, bytes)?;
    }
    params.acpi_rsdp_addr = rsdp;

    let map = e820_map(inputs.ram);
    for (slot, entry) in params.e820_table.iter_mut().zip(&map) {
        *slot = *entry;
    }
    params.e820_entries = map.len() as u8;
    mem.write_obj(params, GuestAddress(ZERO_PAGE_ADDR))
        .map_err(|e| BootError::GuestMemory {
            addr: ZERO_PAGE_ADDR,
            reason: e.to_string(),
        })?;

    write(mem, GDT_ADDR, &gdt_bytes())?;
    write_page_tables(mem)
}

/// Identity map of the first 4 GiB with 2 MiB pages.
fn write_page_tables(mem: &GuestMemory) -> Result<(), BootError> {
    const PRESENT_WRITABLE: u64 = 0x3;
    const PAGE_SIZE_2M: u64 = 0x80;
    write(
        mem,
        PML4_ADDR,
        &(PDPT_ADDR | PRESENT_WRITABLE).to_le_bytes(),
    )?;
    for gib in 0..4u64 {
        let pd = PD_ADDR + gib * 0x1000;
        write(
            mem,
            PDPT_ADDR + gib * 8,
            &(pd | PRESENT_WRITABLE).to_le_bytes(),
        )?;
        let mut entries = Vec::with_capacity(512 * 8);
        for i in 0..512u64 {
            let phys = (gib << 30) | (i << 21);
            entries.extend_from_slice(&(phys | PRESENT_WRITABLE | PAGE_SIZE_2M).to_le_bytes());
        }
        write(mem, pd, &entries)?;
    }
    Ok(())
}

/// GDT entries: null, null, 64-bit code (0x10), data (0x18), TSS (0x20).
const GDT: [u64; 5] = [
    0,
    0,
    0x00af_9b00_0000_ffff,
    0x00cf_9300_0000_ffff,
    0x008f_8b00_0000_ffff,
];

fn gdt_bytes() -> Vec<u8> {
    GDT.iter().flat_map(|e| e.to_le_bytes()).collect()
}

fn segment_from_gdt(entry: u64, index: u16) -> kvm_segment {
    let base = ((entry >> 16) & 0xff_ffff) | (((entry >> 56) & 0xff) << 24);
    let limit_raw = (entry & 0xffff) | (((entry >> 48) & 0xf) << 16);
    let g = ((entry >> 55) & 1) as u8;
    kvm_segment {
        base,
        limit: if g == 1 {
            ((limit_raw << 12) | 0xfff) as u32
        } else {
            limit_raw as u32
        },
        selector: index * 8,
        type_: ((entry >> 40) & 0xf) as u8,
        present: ((entry >> 47) & 1) as u8,
        dpl: ((entry >> 45) & 3) as u8,
        db: ((entry >> 54) & 1) as u8,
        s: ((entry >> 44) & 1) as u8,
        l: ((entry >> 53) & 1) as u8,
        g,
        avl: ((entry >> 52) & 1) as u8,
        unusable: 0,
        padding: 0,
    }
}

/// Long mode, paging on, flat segments: the state startup_64 expects.
pub fn initial_sregs(mut sregs: kvm_sregs) -> kvm_sregs {
    const CR0_PE: u64 = 1;
    const CR0_ET: u64 = 1 << 4;
    const CR0_NE: u64 = 1 << 5;
    const CR0_PG: u64 = 1 << 31;
    const CR4_PAE: u64 = 1 << 5;
    const EFER_LME: u64 = 1 << 8;
    const EFER_LMA: u64 = 1 << 10;

    let code = segment_from_gdt(GDT[2], 2);
    let data = segment_from_gdt(GDT[3], 3);
    let tss = segment_from_gdt(GDT[4], 4);
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = (GDT.len() * 8 - 1) as u16;
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = tss;
    sregs.cr0 = CR0_PE | CR0_ET | CR0_NE | CR0_PG;
    sregs.cr3 = PML4_ADDR;
    sregs.cr4 = CR4_PAE;
    sregs.efer = EFER_LME | EFER_LMA;
    sregs
}

pub fn initial_regs(entry: u64) -> kvm_regs {
    kvm_regs {
        rip: entry,
        rsp: BOOT_STACK_TOP,
        rbp: BOOT_STACK_TOP,
        rsi: ZERO_PAGE_ADDR,
        rflags: 0x2,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_kernel_that_is_a_fifo_is_refused_without_hanging() {
        let dir = std::env::temp_dir().join(format!("detvisor-kernel-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("vmlinux");
        let _ = std::fs::remove_file(&fifo);
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(status.success());
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let mem = GuestMemory::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
            tx.send(load_kernel(&mem, &path).err().map(|e| e.to_string()))
                .unwrap()
        });
        let error = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("opening a FIFO kernel hung");
        assert_eq!(error.as_deref(), Some("cannot open the kernel"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_ram_beyond_the_mmio_hole_continues_at_4_gib() {
        assert_eq!(ram_layout(1 << 30), vec![(0, 0, 1 << 30)]);
        assert_eq!(ram_layout(LOW_RAM_LIMIT), vec![(0, 0, LOW_RAM_LIMIT)]);
        assert_eq!(
            ram_layout(4 << 30),
            vec![(0, 0, 3 << 30), (HIGH_RAM_BASE, 3 << 30, 1 << 30)]
        );
        let map = e820_map(4 << 30);
        let ram: u64 = map
            .iter()
            .filter(|e| e.r#type == E820_RAM)
            .map(|e| e.size)
            .sum();
        // All of it but the legacy hole below 1 MiB.
        assert_eq!(ram, (4 << 30) - (HIGH_RAM_START - LOW_RAM_END));
        // The clock page is reserved.
        assert!(map.iter().any(|e| e.addr <= layout::CLOCK_PAGE_ADDR
            && e.addr + e.size >= layout::CLOCK_PAGE_ADDR + 4096
            && e.r#type == E820_RESERVED));
        assert!(map
            .iter()
            .any(|e| e.addr == HIGH_RAM_BASE && e.size == 1 << 30 && e.r#type == E820_RAM));
        assert!(map
            .iter()
            .all(|e| e.addr + e.size <= LOW_RAM_LIMIT || e.addr >= HIGH_RAM_BASE));
        // The initrd stays below the hole.
        let initrd = initrd_address(4 << 30, 0x200_0000, 1 << 20).unwrap();
        assert_eq!(initrd, LOW_RAM_LIMIT - (1 << 20));
    }

    #[test]
    fn test_e820_map_covers_ram_and_reserves_acpi() {
        let map = e820_map(256 << 20);
        assert_eq!(
            map.last().unwrap().addr + map.last().unwrap().size,
            256 << 20
        );
        assert!(map
            .iter()
            .any(|e| e.addr == acpi::ACPI_TABLES_ADDR && e.r#type == E820_RESERVED));
    }

    #[test]
    fn test_initrd_placed_page_aligned_at_top() {
        let addr = initrd_address(256 << 20, 0x200_0000, 5000).unwrap();
        assert_eq!(addr % 4096, 0);
        assert!(addr + 5000 <= 256 << 20);
    }

    #[test]
    fn test_initrd_too_large_is_an_error() {
        assert!(matches!(
            initrd_address(64 << 20, 0x300_0000, 60 << 20),
            Err(BootError::InitrdTooLarge { .. })
        ));
        assert!(matches!(
            initrd_address(64 << 20, 0, 65 << 20),
            Err(BootError::InitrdTooLarge { .. })
        ));
    }

    #[test]
    fn test_code_segment_is_64_bit() {
        let sregs = initial_sregs(kvm_sregs::default());
        assert_eq!(sregs.cs.l, 1);
        assert_eq!(sregs.cs.selector, 0x10);
        assert_eq!(sregs.ds.limit, 0xffff_ffff);
    }
}
