// A SIGSEGV/SIGBUS handler to preload into a program that crashes on the GPU
// host, which has no gdb: prints the faulting address, the instruction
// pointer, what backtrace() can unwind and the process's mappings (to turn
// addresses into functions here: addr2line -f -e PROGRAM OFFSET), then lets
// the signal end the process as it would without the handler.
//
//   gcc -O1 -shared -fPIC -o segv_trace.so bench/experiments/segv_trace.c
//   LD_PRELOAD=$PWD/segv_trace.so rmmd_test_client device-hold 6442450944 7 </dev/null
//
// A call through a null pointer shows as rip 0 with nothing unwound above
// the signal frame (how the leases above 4 GiB crashed, docs/benchmarks.md).
#define _GNU_SOURCE
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

static void say(char const* text, size_t n)
{
  ssize_t r = write(2, text, n);
  (void)r;
}

static void on_fault(int sig, siginfo_t* info, void* context)
{
  ucontext_t* uc = context;
  char line[256];
  int n = snprintf(line, sizeof line, "SEGV_TRACE signal %d address %p rip %p\n", sig,
                   info->si_addr, (void*)uc->uc_mcontext.gregs[REG_RIP]);
  say(line, (size_t)n);
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
  say("SEGV_TRACE mappings\n", 20);
  int fd = open("/proc/self/maps", O_RDONLY);
  char buf[4096];
  ssize_t got;
  while (fd >= 0 && (got = read(fd, buf, sizeof buf)) > 0) { say(buf, (size_t)got); }
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void)
{
  static char stack[1 << 16];
  stack_t alt = {.ss_sp = stack, .ss_size = sizeof stack};
  sigaltstack(&alt, NULL);
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_sigaction = on_fault;
  action.sa_flags     = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &action, NULL);
  sigaction(SIGBUS, &action, NULL);
}
