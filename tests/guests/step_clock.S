/*
 * A bare 64-bit guest (no Linux) whose work never exits: it arms HPET
 * timer 0 (legacy routing: PIC IRQ 0, vector 0x20) 1000 ticks (10 us)
 * ahead, enables interrupts and spins, counting loop iterations in R15.
 * Under the step clock (1 ns per instruction) the timer's deadline is
 * reached by the spinning itself and its interrupt lands on an exact
 * instruction: the handler prints R15 on COM1 ("count=" and 16 hex
 * digits) and exits with status 0. Under the exit clock the spin makes
 * no exit, virtual time stands still, and only the stall guard ends it.
 * detvisor boots it like a vmlinux: 64-bit mode, flat segments, the
 * first 4 GiB identity mapped, interrupts off.
 */
	.code64
	.text
	.globl _start
_start:
	cli
	lea	stack_top(%rip), %rsp

#include "hpet_irq0.inc"
	/* Timer 0's comparator 1000 ticks after the counter read. */
	mov	0xf0(%rbx), %rax
	add	$1000, %rax
	mov	%rax, 0x108(%rbx)
	xor	%r15d, %r15d
	sti
	.globl	spin
spin:
	inc	%r15
	jmp	spin

/* Prints "count=" and R15 in hex on COM1, then exits with status 0. */
isr:
	lea	label(%rip), %rsi
	mov	$0x3f8, %dx
1:	lodsb
	test	%al, %al
	jz	2f
	outb	%al, (%dx)
	jmp	1b
2:	mov	%r15, %rbx
	mov	$16, %ecx
3:	rol	$4, %rbx
	mov	%bl, %al
	and	$0xf, %al
	add	$'0', %al
	cmp	$'9', %al
	jbe	4f
	add	$('a' - '9' - 1), %al
4:	outb	%al, (%dx)
	dec	%ecx
	jnz	3b
	mov	$'\n', %al
	outb	%al, (%dx)
	xor	%eax, %eax
	mov	$0x610, %dx
	outb	%al, (%dx)
	hlt
	jmp	.

	.data
	.balign	8
idtr:	.word	256*16-1
	.quad	idt
label:	.asciz	"count="

	.bss
	.balign	16
idt:	.skip	256*16
	.skip	4096
stack_top:
