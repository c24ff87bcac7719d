//! Minimal ACPI tables: RSDP -> XSDT -> {FADT -> (FACS, DSDT), HPET}.
//!
//! Linux discovers the HPET only through an ACPI table, and it needs a full
//! (not hardware-reduced) FADT to keep using the legacy PIC: hardware-reduced
//! ACPI makes x86 Linux drop the PIC and its timer setup. The FADT points at
//! the PM1 blocks and PM timer that `devices::acpi_pm` emulates.

use devices::layout;

/// Where the tables live: the BIOS read-only area, which Linux scans for the RSDP.
pub const ACPI_TABLES_ADDR: u64 = 0xe_0000;
pub const ACPI_TABLES_END: u64 = 0x10_0000;

const OEM_ID: &[u8; 6] = b"DETVSR";
const OEM_TABLE_ID: &[u8; 8] = b"DETVISOR";

fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |acc, b| acc.wrapping_add(*b))
        .wrapping_neg()
}

/// A standard 36-byte SDT header followed by `body`, with length and checksum filled in.
fn sdt(signature: &[u8; 4], revision: u8, body: &[u8]) -> Vec<u8> {
    let length = 36 + body.len();
    let mut t = Vec::with_capacity(length);
    t.extend_from_slice(signature);
    t.extend_from_slice(&(length as u32).to_le_bytes());
    t.push(revision);
    t.push(0); // checksum, below
    t.extend_from_slice(OEM_ID);
    t.extend_from_slice(OEM_TABLE_ID);
    t.extend_from_slice(&1u32.to_le_bytes()); // OEM revision
    t.extend_from_slice(b"DTVR"); // creator id
    t.extend_from_slice(&1u32.to_le_bytes()); // creator revision
    t.extend_from_slice(body);
    t[9] = checksum(&t);
    t
}

fn put_u8(buf: &mut [u8], at: usize, v: u8) {
    buf[at] = v;
}
fn put_u16(buf: &mut [u8], at: usize, v: u16) {
    buf[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// AML for `Scope (\_SB) {}`: an almost empty namespace, so the interpreter has
/// a well-formed definition block to load.
const DSDT_AML: &[u8] = &[0x10, 0x05, b'\\', b'_', b'S', b'B'];

fn fadt(facs_addr: u64, dsdt_addr: u64) -> Vec<u8> {
    // FADT revision 3 body (244 bytes in all); offsets below are from the table start.
    let mut t = sdt(b"FACP", 3, &[0u8; 244 - 36]);
    put_u32(&mut t, 36, facs_addr as u32);
    put_u32(&mut t, 40, dsdt_addr as u32);
    put_u16(&mut t, 46, layout::IRQ_ACPI_SCI as u16);
    // SMI_CMD = 0: the machine is in ACPI mode from reset.
    put_u32(&mut t, 56, layout::ACPI_PM1A_EVT_PORT as u32);
    put_u32(&mut t, 64, layout::ACPI_PM1A_CNT_PORT as u32);
    put_u32(&mut t, 76, layout::ACPI_PM_TMR_PORT as u32);
    put_u8(&mut t, 88, layout::ACPI_PM1A_EVT_LEN);
    put_u8(&mut t, 89, layout::ACPI_PM1A_CNT_LEN);
    put_u8(&mut t, 91, layout::ACPI_PM_TMR_LEN);
    // C2/C3 latencies above the limits mean "not supported".
    put_u16(&mut t, 96, 101);
    put_u16(&mut t, 98, 1001);
    // CMOS century register.
    put_u8(&mut t, 108, 0x32);
    // IAPC_BOOT_ARCH: no VGA; no 8042 keyboard controller (bit 1 clear).
    put_u16(&mut t, 109, 1 << 2);
    // Flags: WBINVD, PROC_C1, power and sleep buttons absent/control-method.
    put_u32(&mut t, 112, (1 << 0) | (1 << 2) | (1 << 4) | (1 << 5));
    t[9] = 0;
    t[9] = checksum(&t);
    t
}

fn facs() -> Vec<u8> {
    // FACS has no checksum and a short header of its own.
    let mut t = vec![0u8; 64];
    t[0..4].copy_from_slice(b"FACS");
    put_u32(&mut t, 4, 64);
    put_u8(&mut t, 32, 2); // version
    t
}

/// The HPET capabilities the table announces; the device model reports the same.
pub const HPET_EVENT_TIMER_BLOCK_ID: u32 = 0x8086_a201;

fn hpet() -> Vec<u8> {
    let mut body = vec![0u8; 56 - 36];
    put_u32(&mut body, 0, HPET_EVENT_TIMER_BLOCK_ID);
    // Generic address structure: system memory, 64-bit.
    body[4] = 0; // address space: memory
    body[5] = 64; // register bit width
    body[6] = 0; // bit offset
    body[7] = 0; // access size: undefined (legacy)
    body[8..16].copy_from_slice(&layout::HPET_BASE.to_le_bytes());
    body[16] = 0; // HPET number
    body[17..19].copy_from_slice(&128u16.to_le_bytes()); // minimum tick
    body[19] = 0; // no page protection
    sdt(b"HPET", 1, &body)
}

fn rsdp(xsdt_addr: u64) -> Vec<u8> {
    let mut t = vec![0u8; 36];
    t[0..8].copy_from_slice(b"RSD PTR ");
    t[9..15].copy_from_slice(OEM_ID);
    t[15] = 2; // ACPI 2.0+: use the XSDT
    put_u32(&mut t, 20, 36);
    t[24..32].copy_from_slice(&xsdt_addr.to_le_bytes());
    t[8] = checksum(&t[0..20]);
    t[32] = checksum(&t);
    t
}

/// The tables laid out from `base`, as (guest address, bytes) pieces, and the RSDP address.
pub fn build_tables(base: u64) -> (Vec<(u64, Vec<u8>)>, u64) {
    let align = |a: u64| (a + 15) & !15;
    let rsdp_addr = base;
    let facs_addr = align(rsdp_addr + 36);
    let dsdt_addr = align(facs_addr + 64);
    let dsdt = sdt(b"DSDT", 2, DSDT_AML);
    let fadt_addr = align(dsdt_addr + dsdt.len() as u64);
    let fadt = fadt(facs_addr, dsdt_addr);
    let hpet_addr = align(fadt_addr + fadt.len() as u64);
    let hpet = hpet();
    let xsdt_addr = align(hpet_addr + hpet.len() as u64);
    let mut entries = Vec::new();
    for addr in [fadt_addr, hpet_addr] {
        entries.extend_from_slice(&addr.to_le_bytes());
    }
    let xsdt = sdt(b"XSDT", 1, &entries);
    let pieces = vec![
        (rsdp_addr, rsdp(xsdt_addr)),
        (facs_addr, facs()),
        (dsdt_addr, dsdt),
        (fadt_addr, fadt),
        (hpet_addr, hpet),
        (xsdt_addr, xsdt),
    ];
    (pieces, rsdp_addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b))
    }

    #[test]
    fn test_every_table_checksums_to_zero() {
        let (pieces, _) = build_tables(ACPI_TABLES_ADDR);
        for (_, bytes) in &pieces {
            match &bytes[0..4] {
                b"RSD " => {
                    assert_eq!(sum(&bytes[0..20]), 0);
                    assert_eq!(sum(bytes), 0);
                }
                b"FACS" => {}
                _ => {
                    assert_eq!(sum(bytes), 0, "{:?}", &bytes[0..4]);
                    let len = u32::from_le_bytes(bytes[4..8].try_into().unwrap());
                    assert_eq!(len as usize, bytes.len());
                }
            }
        }
    }

    #[test]
    fn test_tables_fit_below_bios_end_and_do_not_overlap() {
        let (pieces, rsdp) = build_tables(ACPI_TABLES_ADDR);
        assert_eq!(rsdp, ACPI_TABLES_ADDR);
        let mut end = 0;
        for (addr, bytes) in &pieces {
            assert!(*addr >= end);
            end = addr + bytes.len() as u64;
        }
        assert!(end <= ACPI_TABLES_END);
    }

    #[test]
    fn test_fadt_points_at_pm_blocks_and_is_not_hardware_reduced() {
        let (pieces, _) = build_tables(ACPI_TABLES_ADDR);
        let fadt = &pieces.iter().find(|(_, b)| &b[0..4] == b"FACP").unwrap().1;
        assert_eq!(fadt.len(), 244);
        let flags = u32::from_le_bytes(fadt[112..116].try_into().unwrap());
        assert_eq!(flags & (1 << 20), 0, "HW_REDUCED_ACPI must be clear");
        let pm_tmr = u32::from_le_bytes(fadt[76..80].try_into().unwrap());
        assert_eq!(pm_tmr, layout::ACPI_PM_TMR_PORT as u32);
    }
}
