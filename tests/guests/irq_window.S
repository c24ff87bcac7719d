/*
 * A bare 64-bit guest (no Linux) that checks where detvisor delivers an
 * interrupt that becomes pending while interrupts are masked. detvisor boots
 * it like a vmlinux: 64-bit mode, flat segments, the first 4 GiB identity
 * mapped, interrupts off.
 *
 * Each case masks interrupts, arms HPET timer 0 (legacy routing: PIC IRQ 0,
 * vector 0x20) and spins on exits until the interrupt is pending, then
 * unmasks in a pattern and records where the interrupt landed. The rule under
 * test (vmm/src/irq_window.rs): the window opens at the first instruction
 * boundary with IF=1 that does not follow a 0xFB byte (STI's opcode).
 * Prints "caseN ok" or "caseN bad" on COM1 and ends with the number of bad
 * cases as its exit status.
 */
	.code64
	.text
	.globl _start
_start:
	cli
	lea	stack_top(%rip), %rsp

#include "hpet_irq0.inc"

/* Masked: arm timer 0 50 ticks ahead and make exits (each one moves
 * virtual time) until it has fired. */
.macro ARM_AND_WAIT
	cli
	mov	0xf0(%rbx), %rax
	add	$50, %rax
	mov	%rax, 0x108(%rbx)
	mov	$40, %ecx
1:	outb	%al, $0x80
	dec	%ecx
	jnz	1b
.endm

/* The interrupt must have landed at \label. */
.macro CHECK n, label
	cli
	lea	\label(%rip), %rdx
	lea	name\n(%rip), %rsi
	call	check
.endm

	/* Case 0: plain STI shadow: the window opens after the NOP. */
	ARM_AND_WAIT
	sti
	nop
expect0:
	nop
	CHECK 0, expect0

	/* Case 1: the instruction in the shadow ends in 0xFB (an immediate),
	 * so the boundary after it is stepped past too. */
	ARM_AND_WAIT
	sti
	mov	$0xfb, %al
	nop
expect1:
	nop
	CHECK 1, expect1

	/* Case 2: the stepped instruction masks interrupts again: wait for the
	 * next window. */
	ARM_AND_WAIT
	sti
	mov	$0xfb, %al
	cli
	nop
	sti
	xor	%eax, %eax
expect2:
	nop
	CHECK 2, expect2

	/* Case 3: the stepped instruction exits to the VMM (port I/O): the
	 * interrupt is delivered after that exit. */
	ARM_AND_WAIT
	sti
	mov	$0xfb, %al
	outb	%al, $0x80
expect3:
	nop
	CHECK 3, expect3

	/* Case 4: the stepped instruction reads a port (the master PIC's mask,
	 * 0xfe): the VMM's answer must reach it. */
	ARM_AND_WAIT
	sti
	mov	$0xfb, %al
	inb	$0x21, %al
expect4:
	mov	%al, %r15b
	CHECK 4, expect4
	cmp	$0xfe, %r15b
	je	1f
	lea	lost(%rip), %rsi
	call	puts
	incb	failures(%rip)
1:
	/* Case 5: a port write right in the STI shadow: its exit comes before
	 * the instruction completes; the interrupt waits until after it (a host
	 * that loses the shadow must not inject at that exit). */
	ARM_AND_WAIT
	sti
	outb	%al, $0x80
expect5:
	nop
	CHECK 5, expect5

	mov	failures(%rip), %al
	mov	$0x610, %dx
	outb	%al, (%dx)
	hlt
	jmp	.

/* rdx: where the interrupt should have landed; rsi: the case's name. */
check:
	call	puts
	mov	landed(%rip), %rax
	cmp	%rdx, %rax
	jne	2f
	lea	ok(%rip), %rsi
	call	puts
	jmp	3f
2:	lea	bad(%rip), %rsi
	call	puts
	incb	failures(%rip)
3:	movq	$0, landed(%rip)
	ret

puts:
	push	%rdx
	mov	$0x3f8, %dx
1:	lodsb
	test	%al, %al
	jz	2f
	outb	%al, (%dx)
	jmp	1b
2:	pop	%rdx
	ret

isr:
	push	%rax
	mov	8(%rsp), %rax
	mov	%rax, landed(%rip)
	mov	$0x20, %al
	outb	%al, $0x20
	pop	%rax
	iretq

	.data
	.balign	8
idtr:	.word	256*16-1
	.quad	idt
name0:	.asciz	"case0 "
name1:	.asciz	"case1 "
name2:	.asciz	"case2 "
name3:	.asciz	"case3 "
name4:	.asciz	"case4 "
name5:	.asciz	"case5 "
lost:	.asciz	"case4 read lost its data\n"
ok:	.asciz	"ok\n"
bad:	.asciz	"bad\n"

	.bss
	.balign	16
idt:	.skip	256*16
landed:	.skip	8
failures: .skip	1
	.balign	16
	.skip	4096
stack_top:
