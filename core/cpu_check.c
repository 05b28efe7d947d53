/* Runs before any other code of tandem (a constructor, compiled for plain x86-64 so that it
 * cannot itself fault): refuses CPUs below tandem's baseline (x86-64-v3: AVX2, FMA, F16C) with
 * a clear message instead of "Illegal instruction". Linked into every executable. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((constructor(101))) static void tandem_cpu_baseline_check(void) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("bmi2")) {
    return;
  }
  static const char kMessage[] =
      "tandem: this CPU lacks AVX2/FMA/BMI2 (x86-64-v3), the oldest instruction set tandem "
      "supports; use a newer CPU\n";
  ssize_t ignored = write(2, kMessage, sizeof(kMessage) - 1);
  (void)ignored;
  _exit(1);
}
