/* Node info: memory agrees with the kernel's own view (sysinfo and
 * MemAvailable), available never exceeds total, the CPU count is the online count, the host name
 * becomes the friendly name, Cpu is always offered and Cuda only where
 * libcuda.so.1 loads (EXO_EXPECT_CUDA=1 on a GPU machine makes Cuda
 * required), and the result passes exo_node_info_validate. */
#include "cluster/node_info.h"
#include "core/log.h"
#include "test_tmpdir.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <unistd.h>

/* The kB value of one /proc/meminfo line, 0 if absent. */
static uint64_t meminfo_kb(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    cr_assert_not_null(f);
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strstr(buf, key);
    return p ? strtoull(p + strlen(key), NULL, 10) : 0;
}

static void setup(void) { exo_log_set_level(EXO_LOG_ERROR); }

TestSuite(node_info, .init = setup);

Test(node_info, gather)
{
    exo_node_info info;
    memset(&info, 0xab, sizeof info);
    exo_err err = {0};
    cr_assert_eq(exo_node_info_gather(NULL, &info, &err), 0, "%s", err.msg);

    cr_assert_gt(info.memory_total, 0);
    cr_assert_gt(info.memory_available, 0);
    cr_assert_leq(info.memory_available, info.memory_total);
    /* MemTotal and sysinfo's totalram are the same kernel number */
    struct sysinfo si;
    cr_assert_eq(sysinfo(&si), 0);
    uint64_t total = (uint64_t)si.totalram * si.mem_unit;
    cr_assert_leq(info.memory_total > total ? info.memory_total - total : total - info.memory_total,
                  total / 100, "meminfo %llu vs sysinfo %llu", (unsigned long long)info.memory_total,
                  (unsigned long long)total);
    cr_assert_eq(info.memory_total % 1024, 0, "kB from /proc/meminfo scaled to bytes");
    /* available is MemAvailable (read here independently; it moves, so
     * within 5% of total) */
    uint64_t avail_kb = meminfo_kb("MemAvailable:");
    if (avail_kb) {
        uint64_t a = avail_kb * 1024;
        cr_assert_leq(info.memory_available > a ? info.memory_available - a : a - info.memory_available,
                      info.memory_total / 20, "MemAvailable %llu vs %llu", (unsigned long long)a,
                      (unsigned long long)info.memory_available);
    }

    cr_assert_geq(info.cpu_count, 1);
    cr_assert_eq(info.cpu_count, (int32_t)sysconf(_SC_NPROCESSORS_ONLN));

    char host[256] = {0};
    cr_assert_eq(gethostname(host, sizeof host - 1), 0);
    if (host[0])
        cr_assert_eq(strncmp(info.friendly_name, host, sizeof info.friendly_name - 1), 0, "%s vs %s",
                     info.friendly_name, host);
    cr_assert_gt(strlen(info.friendly_name), 0);

    cr_assert(info.backends & (1u << EXO_BACKEND_CPU), "Cpu is always offered");
    cr_assert_eq(info.backends >> EXO_BACKEND__COUNT, 0, "no unknown backend bits");
    cr_assert_eq(exo_node_info_validate(&info, &err), 0, "%s", err.msg);
    cr_assert_eq(info.models.n, 0, "no models dirs given");
    exo_node_info_clear(&info);
}

Test(node_info, cuda_only_with_a_driver)
{
    exo_node_info info;
    exo_err err = {0};
    cr_assert_eq(exo_node_info_gather(NULL, &info, &err), 0, "%s", err.msg);
    bool cuda = info.backends & (1u << EXO_BACKEND_CUDA);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!lib)
        lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!lib)
        cr_assert_not(cuda, "Cuda offered without libcuda.so.1");
    const char *expect = getenv("EXO_EXPECT_CUDA");
    if (expect && !strcmp(expect, "1"))
        cr_assert(cuda, "EXO_EXPECT_CUDA=1 but no Cuda backend (libcuda %s)", lib ? "loads" : "missing");
    cr_log_info("backends: Cpu%s", cuda ? " Cuda" : "");
    exo_node_info_clear(&info);
}

Test(node_info, repeated_gather_is_stable)
{
    exo_node_info a, b;
    exo_err err = {0};
    cr_assert_eq(exo_node_info_gather(NULL, &a, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_node_info_gather(NULL, &b, &err), 0, "%s", err.msg);
    cr_assert_eq(a.memory_total, b.memory_total);
    cr_assert_eq(a.cpu_count, b.cpu_count);
    cr_assert_eq(a.backends, b.backends, "the CUDA probe is cached and must not flip");
    cr_assert_str_eq(a.friendly_name, b.friendly_name);
    /* Available memory moves with whatever else runs between the two
     * gathers (CI runs test suites side by side: once it moved by more than
     * the slack), so the reports are compared apart from it, and the slack
     * it gets is checked with set values. */
    b.memory_available = a.memory_available;
    cr_assert(!exo_node_info_changed(&a, &b), "two gathers a moment apart are the same report");
    b.memory_available = a.memory_available + (100ull << 20);
    cr_assert(!exo_node_info_changed(&a, &b), "available memory moved by 100 MB: noise, not a change");
    b.memory_available = a.memory_available + (1ull << 30) + a.memory_total / 50;
    cr_assert(exo_node_info_changed(&a, &b), "available memory moved a lot");
    b.memory_available = a.memory_available;
    b.cpu_count++;
    cr_assert(exo_node_info_changed(&a, &b));
    exo_node_info_clear(&a);
    exo_node_info_clear(&b);
}

/* The parts a cluster needs: interfaces (loopback at least), CPU model and
 * OS, the models dir's filesystem, the ports, and the cards of the models
 * on disk (read from their config.json). */
Test(node_info, gather_with_models_dir)
{
    char dir[64];
    test_tmpdir_make(dir, "node_info");
    char model_dir[256], cmd[1024];
    snprintf(model_dir, sizeof model_dir, "%s/exo-test--tiny-llama", dir);
    const char *repo = getenv("EXO_REPO");
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/tests/fixtures/llama-bf16/*.json %s/tests/fixtures/llama-bf16/*.safetensors %s/",
             model_dir, repo ? repo : ".", repo ? repo : ".", model_dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    exo_models_dir md = {dir, false};
    exo_node_info_opts o = {&md, 1, 52415, 52414};
    exo_node_info info;
    exo_err err = {0};
    cr_assert_eq(exo_node_info_gather(&o, &info, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_node_info_validate(&info, &err), 0, "%s", err.msg);
    cr_assert_eq(info.api_port, 52415);
    cr_assert_eq(info.cluster_port, 52414);
    cr_assert_gt(info.disk_total, 0);
    cr_assert_leq(info.disk_available, info.disk_total);
    cr_assert(!strncmp(info.os, "Linux", 5), "%s", info.os);
    bool lo = false;
    for (size_t i = 0; i < info.interfaces.n; i++)
        lo |= !strcmp(info.interfaces.v[i].ip, "127.0.0.1") && info.interfaces.v[i].kind == EXO_IFACE_LOOPBACK;
    cr_assert(lo, "the loopback interface is listed");
    const exo_model_card *c = exo_node_info_model(&info, "exo-test/tiny-llama");
    cr_assert_not_null(c, "%zu models", info.models.n);
    cr_assert_gt(c->n_layers, 0);
    cr_assert_gt(c->storage_bytes, 0);
    cr_assert(c->supports_tensor, "llama is on exo's tensor allowlist");
    exo_node_info copy;
    exo_node_info_copy(&copy, &info);
    cr_assert(exo_node_info_equal(&copy, &info));
    exo_node_info_clear(&copy);
    exo_node_info_clear(&info);
    test_tmpdir_remove(dir);
}
