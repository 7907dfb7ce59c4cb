/* A byte budget shared by threads: memory that outside input makes the
 * daemon hold (request bodies, their parse trees) is charged here first,
 * and refused once the budget is spent, instead of growing until the
 * kernel's OOM killer picks a victim.
 *
 * Charges are lock-free (one atomic counter); the caller releases exactly
 * what it charged. Example:
 *   exo_budget b;
 *   exo_budget_init(&b, 256u << 20);
 *   if (!exo_budget_charge(&b, n)) return refuse_503();
 *   ... hold n bytes ...
 *   exo_budget_release(&b, n); */
#ifndef EXO_CORE_BUDGET_H
#define EXO_CORE_BUDGET_H

#include <stdbool.h>
#include <stddef.h>

typedef struct exo_budget {
    size_t          limit;
    _Atomic(size_t) used;
    _Atomic(size_t) peak;
    _Atomic(size_t) refused; /* charges refused so far */
} exo_budget;

void   exo_budget_init(exo_budget *b, size_t limit);
/* True and charged if n more bytes fit; false (nothing charged) if not. */
bool   exo_budget_charge(exo_budget *b, size_t n);
/* The same, but only while the total stays within `ceiling` (<= the limit):
 * lets one kind of charge leave room for another. */
bool   exo_budget_charge_upto(exo_budget *b, size_t n, size_t ceiling);
void   exo_budget_release(exo_budget *b, size_t n);
size_t exo_budget_used(const exo_budget *b);
size_t exo_budget_peak(const exo_budget *b);
size_t exo_budget_refused(const exo_budget *b);

#endif
