/* Monotonic clock helpers. */
#ifndef EXO_CORE_CLOCK_H
#define EXO_CORE_CLOCK_H

#include <stdint.h>

double   exo_clock_seconds(void); /* monotonic, arbitrary origin */
uint64_t exo_clock_ns(void);

#endif
