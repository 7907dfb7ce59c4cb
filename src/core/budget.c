/* Byte budgets (see budget.h): a compare-and-swap loop, so a charge that
 * does not fit never raises the counter even for a moment and concurrent
 * chargers cannot overshoot the limit together. */
#include "core/budget.h"

#include <stdatomic.h>

void exo_budget_init(exo_budget *b, size_t limit)
{
    b->limit = limit;
    atomic_init(&b->used, 0);
    atomic_init(&b->peak, 0);
    atomic_init(&b->refused, 0);
}

bool exo_budget_charge(exo_budget *b, size_t n) { return exo_budget_charge_upto(b, n, b->limit); }

bool exo_budget_charge_upto(exo_budget *b, size_t n, size_t ceiling)
{
    if (ceiling > b->limit)
        ceiling = b->limit;
    size_t used = atomic_load_explicit(&b->used, memory_order_relaxed);
    do {
        if (n > ceiling || used > ceiling - n) {
            atomic_fetch_add_explicit(&b->refused, 1, memory_order_relaxed);
            return false;
        }
    } while (!atomic_compare_exchange_weak_explicit(&b->used, &used, used + n, memory_order_relaxed,
                                                    memory_order_relaxed));
    size_t now = used + n, peak = atomic_load_explicit(&b->peak, memory_order_relaxed);
    while (now > peak &&
           !atomic_compare_exchange_weak_explicit(&b->peak, &peak, now, memory_order_relaxed, memory_order_relaxed))
        ;
    return true;
}

void exo_budget_release(exo_budget *b, size_t n)
{
    atomic_fetch_sub_explicit(&b->used, n, memory_order_relaxed);
}

size_t exo_budget_used(const exo_budget *b) { return atomic_load_explicit(&b->used, memory_order_relaxed); }
size_t exo_budget_peak(const exo_budget *b) { return atomic_load_explicit(&b->peak, memory_order_relaxed); }
size_t exo_budget_refused(const exo_budget *b)
{
    return atomic_load_explicit(&b->refused, memory_order_relaxed);
}
