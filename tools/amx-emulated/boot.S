/* tools/amx-emulated boot stub: the Multiboot v1 entry GRUB jumps to (32-bit protected mode,
 * a.out-kludge header, so the kernel is a flat binary).  It zeroes .bss, identity-maps the first
 * 4 GiB with 2 MiB pages, enters 64-bit long mode, turns on SSE and XSAVE and sets XCR0 to
 * x87|SSE|AVX|opmask|ZMM_Hi256|Hi16_ZMM|XTILECFG|XTILEDATA (0x600E7, as far as CPUID offers it),
 * installs an IDT whose vectors 0-31 call rt_exception(), then calls rt_main(multiboot info). */

#define MB_MAGIC  0x1BADB002
#ifndef STACK_SIZE
#define STACK_SIZE (8*1024*1024)
#endif
#define XCR0_WANT 0x600E7
#define MB_FLAGS  ((1<<0) | (1<<1) | (1<<16))   /* page-align, mem info, address fields valid */

        .section .multiboot, "a"
        .align 4
mb_header:
        .long MB_MAGIC
        .long MB_FLAGS
        .long -(MB_MAGIC + MB_FLAGS)
        .long mb_header         /* header_addr   */
        .long _load_start       /* load_addr     */
        .long _load_end         /* load_end_addr */
        .long _bss_end          /* bss_end_addr  */
        .long _start32          /* entry_addr    */

        .text
        .code32
        .globl _start32
_start32:
        cli
        cld
        mov     %ebx, %esi                  /* multiboot info pointer (keep in esi) */
        mov     %eax, %ebp                  /* magic */

        /* zero .bss ourselves (GRUB should already have done it) */
        mov     $_bss_start, %edi
        mov     $_bss_end, %ecx
        sub     %edi, %ecx
        shr     $2, %ecx
        xor     %eax, %eax
        rep stosl

        mov     %esi, mb_info_ptr
        mov     %ebp, mb_magic_val

        /* PML4[0] -> PDPT */
        mov     $pdpt, %eax
        or      $3, %eax
        mov     %eax, pml4
        /* PDPT[0..3] -> PD0..PD3 */
        mov     $pd, %eax
        or      $3, %eax
        xor     %ecx, %ecx
1:      mov     %eax, pdpt(,%ecx,8)
        add     $4096, %eax
        inc     %ecx
        cmp     $4, %ecx
        jb      1b
        /* 2048 x 2 MiB pages = 4 GiB identity map */
        mov     $0x83, %eax                 /* present | writable | PS */
        xor     %ecx, %ecx
2:      mov     %eax, pd(,%ecx,8)
        add     $0x200000, %eax
        inc     %ecx
        cmp     $2048, %ecx
        jb      2b

        /* CR4.PAE */
        mov     %cr4, %eax
        or      $(1<<5), %eax
        mov     %eax, %cr4
        mov     $pml4, %eax
        mov     %eax, %cr3
        /* EFER.LME */
        mov     $0xC0000080, %ecx
        rdmsr
        or      $(1<<8), %eax
        wrmsr
        /* CR0: PG|PE, MP=1, EM=0, TS=0 */
        mov     %cr0, %eax
        or      $((1<<31) | (1<<0) | (1<<1)), %eax
        and     $~((1<<2) | (1<<3)), %eax
        mov     %eax, %cr0

        lgdt    gdt_ptr
        ljmp    $0x08, $start64

        .code64
start64:
        mov     $0x10, %ax
        mov     %ax, %ds
        mov     %ax, %es
        mov     %ax, %ss
        xor     %ax, %ax
        mov     %ax, %fs
        mov     %ax, %gs
        lea     stack_top(%rip), %rsp
        xor     %rbp, %rbp

        /* CR4: OSFXSR | OSXMMEXCPT | OSXSAVE */
        mov     %cr4, %rax
        or      $((1<<9) | (1<<10) | (1<<18)), %rax
        mov     %rax, %cr4
        fninit
        /* XCR0 = requested & supported (CPUID.(EAX=0Dh,ECX=0):EAX) */
        mov     $0xD, %eax
        xor     %ecx, %ecx
        cpuid
        and     $XCR0_WANT, %eax
        xor     %edx, %edx
        xor     %ecx, %ecx
        xsetbv
        mov     $0x1F80, %eax
        mov     %eax, mxcsr_tmp(%rip)
        ldmxcsr mxcsr_tmp(%rip)

        call    idt_setup
        mov     mb_info_ptr(%rip), %edi
        call    rt_main
3:      cli
        hlt
        jmp     3b

/* ---- exceptions: vectors 0..31 ---- */
        .macro ISR_NOERR n
isr\n:  pushq   $0
        pushq   $\n
        jmp     isr_common
        .endm
        .macro ISR_ERR n
isr\n:  pushq   $\n
        jmp     isr_common
        .endm

        ISR_NOERR 0
        ISR_NOERR 1
        ISR_NOERR 2
        ISR_NOERR 3
        ISR_NOERR 4
        ISR_NOERR 5
        ISR_NOERR 6
        ISR_NOERR 7
        ISR_ERR   8
        ISR_NOERR 9
        ISR_ERR   10
        ISR_ERR   11
        ISR_ERR   12
        ISR_ERR   13
        ISR_ERR   14
        ISR_NOERR 15
        ISR_NOERR 16
        ISR_ERR   17
        ISR_NOERR 18
        ISR_NOERR 19
        ISR_NOERR 20
        ISR_ERR   21
        ISR_NOERR 22
        ISR_NOERR 23
        ISR_NOERR 24
        ISR_NOERR 25
        ISR_NOERR 26
        ISR_NOERR 27
        ISR_NOERR 28
        ISR_ERR   29
        ISR_ERR   30
        ISR_NOERR 31

isr_common:
        /* frame: [rsp]=vector, errcode, rip, cs, rflags, rsp, ss */
        mov     %rsp, %rdi
        and     $-64, %rsp
        call    rt_exception
4:      cli
        hlt
        jmp     4b

/* Fill the 32 IDT gates (64-bit interrupt gates, selector 0x08) */
idt_setup:
        lea     idt(%rip), %rdi
        lea     isr_table(%rip), %rsi
        xor     %ecx, %ecx
5:      mov     (%rsi,%rcx,8), %rax
        mov     %ax, (%rdi)                 /* offset 15:0 */
        movw    $0x08, 2(%rdi)              /* selector */
        movw    $0x8E00, 4(%rdi)            /* P=1, DPL=0, type=0xE (interrupt gate), IST=0 */
        shr     $16, %rax
        mov     %ax, 6(%rdi)                /* offset 31:16 */
        shr     $16, %rax
        mov     %eax, 8(%rdi)               /* offset 63:32 */
        movl    $0, 12(%rdi)
        add     $16, %rdi
        inc     %ecx
        cmp     $32, %ecx
        jb      5b
        lidt    idt_ptr(%rip)
        ret

        .section .rodata
        .align 8
isr_table:
        .quad isr0, isr1, isr2, isr3, isr4, isr5, isr6, isr7
        .quad isr8, isr9, isr10, isr11, isr12, isr13, isr14, isr15
        .quad isr16, isr17, isr18, isr19, isr20, isr21, isr22, isr23
        .quad isr24, isr25, isr26, isr27, isr28, isr29, isr30, isr31

        .data
        .align 16
gdt:
        .quad 0
        .quad 0x00AF9A000000FFFF            /* 0x08: 64-bit code */
        .quad 0x00CF92000000FFFF            /* 0x10: data */
gdt_end:
gdt_ptr:
        .word gdt_end - gdt - 1
        .long gdt
        .long 0
idt_ptr:
        .word 32*16 - 1
        .quad idt

        .bss
        .align 4096
pml4:   .skip 4096
pdpt:   .skip 4096
pd:     .skip 4*4096
idt:    .skip 32*16
        .align 8
        .globl mb_info_ptr, mb_magic_val
mb_info_ptr:  .quad 0
mb_magic_val: .quad 0
mxcsr_tmp:    .long 0
        .align 4096
        .globl stack_bottom, stack_top
stack_bottom:
        .skip STACK_SIZE
stack_top:
