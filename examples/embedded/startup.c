/* A minimal Cortex-M4F start: the vector table, then Reset_Handler turns the FPU on, copies
   .data from flash, zeroes .bss, paints the free RAM below the stack (stack_used measures how
   deep main went), runs main and ends the run through semihosting (SYS_EXIT: "application
   exit" when main returns 0, else a run-time error, which qemu exits 1 on). */
extern int main(void);
unsigned long stack_used(void);
extern unsigned long _sidata[], _sdata[], _edata[], _sbss[], _ebss[], _estack[];

static void semihost_exit(int ok) {
    register int op __asm__("r0") = 0x18;                       /* SYS_EXIT */
    register unsigned long reason __asm__("r1") = ok ? 0x20026ul : 0x20023ul;
    __asm__ volatile("bkpt 0xab" : "+r"(op) : "r"(reason) : "memory");
    for (;;) {}
}

#define PAINT 0x5ca1ab1eul

/* Bytes of stack main has used at most: the painted words from the end of .bss up are unused. */
unsigned long stack_used(void) {
    unsigned long *p = _ebss;
    while (p < _estack && *p == PAINT) p++;
    return (unsigned long)((char *)_estack - (char *)p);
}

void Reset_Handler(void) {
    unsigned long *src = _sidata, *dst, *sp;
    *(volatile unsigned long *)0xE000ED88u |= 0xFul << 20;     /* CPACR: CP10, CP11 full access */
    __asm__ volatile("dsb\n\tisb" ::: "memory");
    for (dst = _sdata; dst < _edata;) *dst++ = *src++;
    for (dst = _sbss; dst < _ebss;) *dst++ = 0;
    __asm__ volatile("mov %0, sp" : "=r"(sp));
    for (dst = _ebss; dst < sp - 16;) *dst++ = PAINT;
    semihost_exit(main() == 0);
}

static void Fault_Handler(void) { semihost_exit(0); }

__attribute__((section(".vectors"), used))
static void (*const vectors[16])(void) = {
    (void (*)(void))(unsigned long)_estack, Reset_Handler, Fault_Handler, Fault_Handler, Fault_Handler,
    Fault_Handler, Fault_Handler, 0, 0, 0, 0, Fault_Handler, Fault_Handler, 0, Fault_Handler, Fault_Handler
};
