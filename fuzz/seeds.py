#!/usr/bin/env python3
"""Writes the guest-facing targets' seed corpora (fuzz/corpus/guest_*).

The targets decode their input with `arbitrary` 1.x; this writes inputs in
its format by hand: integers little-endian, a bool one byte (bit 0), an
enum a u32 tag (variant i of n is chosen by (tag * n) >> 32 == i), an
Option a bool then the value, a Vec each element preceded by a true bool
and ended by a false one. Run it from anywhere; it overwrites the seeds.
"""

import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def u8(v): return struct.pack("<B", v & 0xff)
def u16(v): return struct.pack("<H", v & 0xffff)
def u32(v): return struct.pack("<I", v & 0xffffffff)
def u64(v): return struct.pack("<Q", v & 0xffffffffffffffff)
def boolean(v): return u8(1 if v else 0)


def tag(i, n):
    """The smallest u32 that arbitrary's derive maps to variant i of n."""
    return u32(-(-(i << 32) // n))


def vec(items):
    return b"".join(b"\x01" + item for item in items) + b"\x00"


def byte_vec(data):
    return vec([bytes([b]) for b in data])


def option(value):
    return b"\x00" if value is None else b"\x01" + value


def write(target, name, data):
    directory = os.path.join(HERE, "corpus", target)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)


# guest_agent_protocol: Input { small_max, chunks, snapshot_every }, then
# one line per frame (a line starting with "!" goes on the channel raw).
def framed(message):
    return json.dumps(message, separators=(",", ":")).encode()


def raw(data):
    return b"!" + data


def protocol(small_max, chunks, snapshot_every, lines):
    return (option(None if small_max is None else u16(small_max)) + byte_vec(chunks)
            + u8(snapshot_every) + b"\n".join(lines))


write("guest_agent_protocol", "boot_and_output", protocol(None, [1], 0, [
    framed({"type": "booted", "version": 2}),
    framed({"type": "ready", "version": 2}),
    framed({"type": "node_started", "name": "n1", "pid": 7}),
    framed({"type": "output", "node": "n1", "stream": "stdout", "data": "aGVsbG8K"}),
    framed({"type": "exited", "node": "n1", "status": {"code": 0}}),
]))
write("guest_agent_protocol", "malformed_then_valid", protocol(None, [3, 7], 2, [
    framed({"type": "no_such_message"}),
    raw(b"\x05\x00\x00\x00{bad}"),
    framed({"type": "workload_exited", "status": {"signal": 9}}),
    raw(b"\x10\x00\x00"),
]))
write("guest_agent_protocol", "oversized", protocol(16, [5], 1, [
    framed({"type": "ready", "version": 2}),
    framed({"type": "error", "context": "create_node n1", "message": "x" * 40}),
    framed({"type": "ready", "version": 2}),
]))
write("guest_agent_protocol", "host_requests", protocol(None, [2], 3, [
    framed({"type": "hello", "version": 2}),
    framed({"type": "pause", "node": "n2"}),
    framed({"type": "kill", "node": "n2", "signal": 9}),
    framed({"type": "random_request", "node": None, "id": 3}),
    framed({"type": "sdk", "json": "{\"antithesis_assert\":{}}"}),
]))

# guest_switch: Input { key, config, ops }
def latency_fixed(v): return tag(0, 3) + u32(v)
def latency_uniform(a, b): return tag(1, 3) + u32(a) + u32(b)


def config(latency, loss=0, duplicate=0, reorder=0, reorder_delay=None):
    return (latency + u8(loss) + u8(duplicate) + u8(reorder)
            + (reorder_delay or latency_fixed(0)))


SWITCH_OPS = 7


def send(frm, port, length):
    return tag(0, SWITCH_OPS) + u8(frm) + tag(0, 4) + u8(port) + u16(length)


def broadcast(frm, length):
    return tag(0, SWITCH_OPS) + u8(frm) + tag(1, 4) + u16(length)


def burst(frm, count): return tag(1, SWITCH_OPS) + u8(frm) + u16(count)
def advance(ns, shift): return tag(2, SWITCH_OPS) + u16(ns) + u8(shift)
def schedule(after, fault): return tag(3, SWITCH_OPS) + u32(after) + fault
def set_config(c): return tag(4, SWITCH_OPS) + c
def save_restore(): return tag(6, SWITCH_OPS)


FAULTS = 8
partition_01_23 = tag(0, FAULTS) + vec([byte_vec([0, 1]), byte_vec([2, 3])])
heal = tag(1, FAULTS)

write("guest_switch", "unicast_and_broadcast", bytes(32) + config(latency_fixed(4000)) + vec([
    send(0, 1, 60), broadcast(2, 64), advance(0xffff, 8), save_restore(), send(1, 0, 1500),
    advance(0xffff, 10),
]))
write("guest_switch", "lossy_duplicating", b"\x07" * 32
      + config(latency_uniform(100, 9000), 60, 80, 60, latency_fixed(5000)) + vec([
          broadcast(0, 60), broadcast(1, 60), send(3, 2, 100), advance(0x4000, 4),
          save_restore(), advance(0xffff, 12),
      ]))
write("guest_switch", "partition_heal", bytes(range(32)) + config(latency_fixed(1000)) + vec([
    schedule(10, partition_01_23), send(0, 2, 60), advance(0x100, 4), send(0, 2, 60),
    send(0, 1, 60), schedule(100, heal), advance(0xffff, 8), send(0, 2, 60), advance(0xffff, 8),
]))
write("guest_switch", "full", bytes(32) + config(latency_fixed(0x7fffffff)) + vec([
    burst(0, 1500), burst(1, 10), advance(0xffff, 30),
]))

# guest_virtio: Input { kind, ops }
VIRTIO_OPS = 9
FEATURES = (1 << 32) | (1 << 29)  # VERSION_1 | EVENT_IDX


def initialize(size_log2): return tag(0, VIRTIO_OPS) + u64(FEATURES) + u8(size_log2)
def read_any(offset): return tag(2, VIRTIO_OPS) + tag(1, 2) + u16(offset) + u8(2)


def descriptor(queue, index, data_offset, length, flags, nxt=0):
    return (tag(3, VIRTIO_OPS) + u8(queue) + u16(index) + tag(0, 2) + u16(data_offset)
            + u16(length) + u16(flags) + u16(nxt))


def publish(queue, head): return tag(4, VIRTIO_OPS) + u8(queue) + u16(head)
def store(address, data): return tag(5, VIRTIO_OPS) + u16(address) + byte_vec(data)
def notify(queue): return tag(6, VIRTIO_OPS) + u8(queue)
def deliver(length, fill): return tag(7, VIRTIO_OPS) + u16(length) + u8(fill)
def virtio_save_restore(): return tag(8, VIRTIO_OPS)


WRITE, NEXT = 2, 1
write("guest_virtio", "net_rx_tx", tag(0, 3) + vec([
    initialize(3), read_any(0), descriptor(0, 0, 0, 2048, WRITE), publish(0, 0), notify(0),
    deliver(60, 0xab), descriptor(1, 0, 0x1000, 72, 0), publish(1, 0), notify(1),
    virtio_save_restore(), descriptor(0, 1, 0x2000, 2048, WRITE), publish(0, 1), deliver(1514, 1),
]))
write("guest_virtio", "net_chained", tag(0, 3) + vec([
    initialize(4), descriptor(1, 0, 0x1000, 12, NEXT, 1), descriptor(1, 1, 0x1100, 60, 0),
    publish(1, 0), notify(1), descriptor(0, 2, 0x2000, 12, WRITE | NEXT, 3),
    descriptor(0, 3, 0x2100, 1600, WRITE), publish(0, 2), deliver(100, 7),
]))
write("guest_virtio", "console_echo", tag(1, 3) + vec([
    initialize(2), descriptor(0, 0, 0, 16, WRITE), publish(0, 0), notify(0), deliver(10, 0x41),
    store(0x9000, b"hello"), descriptor(1, 0, 0x1000, 5, 0), publish(1, 0), notify(1),
    virtio_save_restore(), deliver(30, 0x42), descriptor(0, 1, 0x100, 64, WRITE), publish(0, 1),
    notify(0),
]))
write("guest_virtio", "rng_fill", tag(2, 3) + vec([
    initialize(3), descriptor(0, 0, 0, 64, WRITE), publish(0, 0), notify(0),
    descriptor(0, 1, 0x40, 8, WRITE | NEXT, 2), descriptor(0, 2, 0x80, 8, WRITE), publish(0, 1),
    virtio_save_restore(), notify(0), read_any(0x70),
]))
write("guest_virtio", "loop_chain", tag(2, 3) + vec([
    initialize(2), descriptor(0, 0, 0, 8, WRITE | NEXT, 1), descriptor(0, 1, 8, 8, WRITE | NEXT, 0),
    publish(0, 0), notify(0), read_any(0x70), tag(1, VIRTIO_OPS) + tag(1, 2) + u16(0x70) + u8(2)
    + u64(0),
]))

# guest_devices_bus: Input { rtc_epoch, latency_us, loss, ops }
BUS_OPS = 15


def port_any(port): return tag(1, 2) + u16(port)
def pio_read(port, width=0): return tag(0, BUS_OPS) + port_any(port) + u8(width)
def pio_write(port, value, width=0): return tag(1, BUS_OPS) + port_any(port) + u8(width) + u32(value)
def hpet(offset): return tag(0, 3) + u16(offset)
def mmio_read(address, width=2): return tag(2, BUS_OPS) + address + u8(width)
def mmio_write(address, value, width=2): return tag(3, BUS_OPS) + address + u8(width) + u64(value)
def bus_advance(ns, shift): return tag(4, BUS_OPS) + u16(ns) + u8(shift)
def acknowledge(): return tag(5, BUS_OPS)
def take_event(): return tag(6, BUS_OPS)
def serial_input(data): return tag(7, BUS_OPS) + byte_vec(data)
def hvc_input(data): return tag(8, BUS_OPS) + byte_vec(data)
def virtio_init(slot, size_log2): return tag(10, BUS_OPS) + u8(slot) + u8(size_log2)
def post_receive(slot, length): return tag(11, BUS_OPS) + u8(slot) + u16(length)
def transmit(nic, length, bcast): return tag(12, BUS_OPS) + boolean(nic) + u16(length) + boolean(bcast)
def network_fault(after, heal): return tag(13, BUS_OPS) + u32(after) + tag(1 if heal else 0, 2)
def bus_save_restore(): return tag(14, BUS_OPS)


def bus(ops, latency_us=50, loss=False):
    return u32(1_700_000_000) + u16(latency_us) + boolean(loss) + vec(ops)


PIC_INIT = [pio_write(0x20, 0x11), pio_write(0x21, 0x20), pio_write(0x21, 4), pio_write(0x21, 1),
            pio_write(0xa0, 0x11), pio_write(0xa1, 0x28), pio_write(0xa1, 2), pio_write(0xa1, 1),
            pio_write(0x21, 0), pio_write(0xa1, 0)]

write("guest_devices_bus", "network", bus([
    virtio_init(2, 3), virtio_init(3, 3), post_receive(3, 2048), post_receive(2, 2048),
    transmit(False, 60, False), bus_advance(0xffff, 4), transmit(True, 100, True),
    bus_save_restore(), bus_advance(0xffff, 4), acknowledge(), network_fault(1, False),
    transmit(False, 60, False), bus_advance(0xffff, 8),
]))
write("guest_devices_bus", "hpet_pic", bus(PIC_INIT + [
    mmio_read(hpet(0)), mmio_write(hpet(0x10), 3), mmio_write(hpet(0x108), 0x10000),
    mmio_write(hpet(0x100), 0x4c), bus_advance(0xffff, 10), acknowledge(), bus_save_restore(),
    mmio_read(hpet(0xf0), 3), bus_advance(0xffff, 12), acknowledge(), pio_write(0x20, 0x20),
]))
write("guest_devices_bus", "serial_rtc_status", bus(PIC_INIT + [
    pio_write(0x3f9, 1), serial_input(b"abc"), acknowledge(), pio_read(0x3fd), pio_read(0x3f8),
    pio_write(0x3f8, 0x78), pio_write(0x70, 0x0b), pio_write(0x71, 0x42), pio_write(0x70, 0x0c),
    pio_read(0x71), bus_advance(0xffff, 16), bus_save_restore(), pio_read(0x608, 2),
    pio_write(0x610, 3), take_event(), pio_write(0x64, 0xfe), take_event(),
]))
write("guest_devices_bus", "virtio_console", bus([
    virtio_init(1, 2), post_receive(1, 64), hvc_input(b"hi there"), bus_save_restore(),
    mmio_read(tag(1, 3) + u8(1) + u16(0x60)), virtio_init(0, 2), post_receive(0, 32),
    mmio_read(tag(2, 3) + u64(0xdead_0000)),
]))
