/*
 * A bare 64-bit guest (no Linux) that counts its own instructions, for
 * instruction positions (exit:N+insn:K, vmm/src/vm/insn_steps.rs).
 * detvisor boots it like a vmlinux: 64-bit mode, flat segments, the first
 * 4 GiB identity mapped, interrupts off.
 *
 * After its first exit (the position exit:1), every instruction of a run
 * of 2000 increments R15 by one, so after K single steps (K <= 2000)
 * R15 = K and RIP = counted + 3K. Then a REP STOSB of 40 iterations (40
 * single steps), a PUSHF/POP (the pushed word must not hold the trap flag
 * stepping runs with), and the trap flag's bit as the exit status. The
 * interval after exit:1 holds 2000 + 2 + 40 + 2 + 2 = 2046 single steps.
 */
	.code64
	.text
	.globl _start
_start:
	cli
	lea	stack_top(%rip), %rsp
	xor	%r15d, %r15d
	outb	%al, $0x80
	.globl	counted
counted:
	.rept	2000
	inc	%r15
	.endr
	lea	buf(%rip), %rdi
	mov	$40, %ecx
	rep stosb
	pushf
	pop	%rax
	shr	$8, %eax
	and	$1, %eax
	outb	%al, $0x80
	mov	$0x610, %dx
	outb	%al, (%dx)
	hlt
	jmp	.

	.bss
	.balign	16
buf:	.skip	64
	.skip	4096
stack_top:
