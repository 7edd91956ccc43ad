/* The studies' CPU mask: an LD_PRELOAD library after which the process's CPUID answers as
 * the CPU the published bases were built on (the "second build"): AMD family 19h model 01h,
 * AVX2 and FMA but no AVX-512, L1d 32 KiB 8-way, L2 512 KiB 8-way, L3 32 MiB 16-way.
 *
 * Kernel libraries choose their code at run time from CPUID, past XLA's --xla_cpu_max_isa:
 * the vector set, and matrix-product blocking from the cache sizes, so one config trained
 * on another x86 CPU sums in another order and gives other weights. With CPUID faulting
 * (Linux's ARCH_SET_CPUID; /proc/cpuinfo's "cpuid_fault" flag) every CPUID instruction of
 * the process traps here: this handler runs the real one and rewrites the leaves above.
 * Built and described by grpo_jax/studies/cpu_mask.py. */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static long cpuid_faulting(int off) { return syscall(SYS_arch_prctl, ARCH_SET_CPUID, off); }

static void cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
  __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
}

#define BIT(n) (1u << (n))

static void as_canonical(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
  if (leaf == 1 || leaf == 0x80000001) r[0] = 0x00A00F11;  /* family 19h, model 01h, stepping 1 */
  if (leaf == 7 && sub == 0) {  /* AVX-512 F DQ IFMA PF ER CD BW VL; VBMI VBMI2 GFNI VNNI BITALG
                                   VPOPCNTDQ; 4VNNIW 4FMAPS VP2INTERSECT AMX-BF16 FP16 AMX-TILE AMX-INT8 */
    r[1] &= ~(BIT(16) | BIT(17) | BIT(21) | BIT(26) | BIT(27) | BIT(28) | BIT(30) | BIT(31));
    r[2] &= ~(BIT(1) | BIT(6) | BIT(8) | BIT(11) | BIT(12) | BIT(14));
    r[3] &= ~(BIT(2) | BIT(3) | BIT(8) | BIT(22) | BIT(23) | BIT(24) | BIT(25));
  }
  if (leaf == 7 && sub == 1) r[0] &= ~(BIT(4) | BIT(5) | BIT(23));  /* AVX-VNNI, AVX512-BF16, AVX-IFMA */
  if (leaf == 0xD && sub == 0) r[0] &= ~(BIT(5) | BIT(6) | BIT(7));  /* AVX-512 register state */
  if (leaf == 0x80000005) r[2] = r[3] = 0x20080140;  /* L1d, L1i: 32 KiB, 8-way, 64 B lines */
  if (leaf == 0x80000006) {
    r[2] = 0x02006140;                  /* L2: 512 KiB, 8-way, 64 B lines */
    r[3] = (64u << 18) | 0x9140;        /* L3: 64 x 512 KiB, ways in leaf 8000001Dh */
  }
  if (leaf == 0x8000001D && sub <= 2) r[1] = (7u << 22) | 0x3f;  /* L1d, L1i, L2: 8 ways */
}

static void on_fault(int sig, siginfo_t *info, void *context) {
  greg_t *reg = ((ucontext_t *)context)->uc_mcontext.gregs;
  const unsigned char *ip = (const unsigned char *)reg[REG_RIP];
  (void)info;
  if (ip[0] == 0x0F && ip[1] == 0xA2) {  /* CPUID */
    uint32_t r[4], leaf = (uint32_t)reg[REG_RAX], sub = (uint32_t)reg[REG_RCX];
    cpuid_faulting(1);
    cpuid(leaf, sub, r);
    cpuid_faulting(0);
    as_canonical(leaf, sub, r);
    reg[REG_RAX] = r[0], reg[REG_RBX] = r[1], reg[REG_RCX] = r[2], reg[REG_RDX] = r[3];
    reg[REG_RIP] += 2;
    return;
  }
  signal(sig, SIG_DFL);  /* any other fault: the default action, as without the mask */
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_sigaction = on_fault;
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigaction(SIGSEGV, &action, 0);
  cpuid_faulting(0);
}
