/* CPU feature detection for run-time kernel dispatch. Read once, cached.
 * EXO_CPU_ISA=generic|avx2|avx512 in the environment caps the level, so
 * tests and benchmarks can compare the paths on one machine. */
#ifndef EXO_CORE_CPU_FEATURES_H
#define EXO_CORE_CPU_FEATURES_H

#include <stdbool.h>

typedef enum exo_isa {
    EXO_ISA_GENERIC = 0,
    EXO_ISA_AVX2    = 1, /* AVX2 + FMA + F16C */
    EXO_ISA_AVX512  = 2, /* F, BW, VL, DQ, VNNI, BF16 */
} exo_isa;

exo_isa     exo_cpu_isa(void);
bool        exo_cpu_has_amx(void); /* AMX-TILE + AMX-BF16 + AMX-INT8, OS-enabled */
const char *exo_isa_name(exo_isa isa);

#endif
