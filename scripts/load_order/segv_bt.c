// LD_PRELOAD helper: on SIGSEGV/SIGBUS/SIGILL/SIGFPE/SIGABRT print fault address + native backtrace
// (module+offset, symbol if exported), then re-raise. Build: cc -O1 -g -fPIC -shared segv_bt.c -o segv_bt.so -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>
#include <sys/syscall.h>
static char altstack[1 << 16];
static void handler(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    char buf[512];
    int n = snprintf(buf, sizeof buf, "\n=== segv_bt: signal %d (%s) addr=%p tid=%ld ===\n", sig, strsignal(sig),
                     si ? si->si_addr : 0, (long)syscall(SYS_gettid));
    write(2, buf, n);
    void *frames[64];
    int k = backtrace(frames, 64);
    for (int i = 0; i < k; i++) {
        Dl_info di;
        if (dladdr(frames[i], &di) && di.dli_fname) {
            n = snprintf(buf, sizeof buf, "#%-2d %p %s+0x%lx (%s+0x%lx)\n", i, frames[i], di.dli_fname,
                         (unsigned long)((char *)frames[i] - (char *)di.dli_fbase), di.dli_sname ? di.dli_sname : "?",
                         di.dli_saddr ? (unsigned long)((char *)frames[i] - (char *)di.dli_saddr) : 0UL);
        } else {
            n = snprintf(buf, sizeof buf, "#%-2d %p ?\n", i, frames[i]);
        }
        write(2, buf, n);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}
__attribute__((constructor)) static void segv_bt_init(void) {
    stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
    sigaltstack(&ss, 0);
    struct sigaction sa; memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = handler; sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
    int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
    for (unsigned i = 0; i < sizeof sigs / sizeof *sigs; i++) sigaction(sigs[i], &sa, 0);
    void *dummy[1]; backtrace(dummy, 1);  // pre-load libgcc_s unwinder outside the signal handler
}
