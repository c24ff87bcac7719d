/*
 * A bare 64-bit guest (no Linux) for `detvisor bench step-clock`: OUTER
 * rounds (set with -DOUTER=n) of a 5000-iteration DEC/JNZ loop, a port
 * write (an exit) after each round, then exit status 0. It runs
 * 4 + OUTER * 10004 + 3 instructions: the step clock's virtual time says
 * so to the nanosecond (1 ns each).
 */
#ifndef OUTER
#define OUTER 20
#endif
	.code64
	.text
	.globl _start
_start:
	cli
	lea	stack_top(%rip), %rsp
	xor	%eax, %eax
	mov	$OUTER, %r14
1:	mov	$5000, %ecx
2:	dec	%ecx
	jnz	2b
	outb	%al, $0x80
	dec	%r14
	jnz	1b
	mov	$0x610, %dx
	xor	%eax, %eax
	outb	%al, (%dx)
	hlt
	jmp	.

	.bss
	.balign	16
	.skip	4096
stack_top:
