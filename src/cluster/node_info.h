/* What a node tells the cluster about itself (NodeGatheredInfo): memory
 * from /proc/meminfo (MemTotal, MemAvailable), online CPUs and their model,
 * the host name as friendly name, the OS, the compute backends it can run
 * (always Cpu; Cuda when libcuda.so.1 loads and reports a device), its GPUs
 * (NVML through dlopen, when present), the filesystem of its first writable
 * models dir, its network interfaces, its ports, and the models it has on
 * disk (their cards, for placement). */
#ifndef EXO_CLUSTER_NODE_INFO_H
#define EXO_CLUSTER_NODE_INFO_H

#include "cluster/types.h"
#include "core/error.h"
#include "core/paths.h"

typedef struct exo_node_info_opts {
    const exo_models_dir *models_dirs; /* scanned for models and disk space; may be NULL */
    int                   n_models_dirs;
    int                   api_port, cluster_port;
} exo_node_info_opts;

/* Fills info (clear it with exo_node_info_clear); opts may be NULL (no
 * models, disk or ports). EXO_EIO if /proc/meminfo cannot be read. */
int exo_node_info_gather(const exo_node_info_opts *opts, exo_node_info *info, exo_err *err);

/* The card of a model on disk (what placement and listings need). */
struct exo_model_entry;
void exo_model_card_from_entry(const struct exo_model_entry *m, exo_model_card *out);
/* The same from a built-in catalogue card (download/catalogue.h). */
struct exo_catalogue_card;
void exo_model_card_from_catalogue(const struct exo_catalogue_card *c, exo_model_card *out);

/* Whether two reports differ enough to publish the newer: anything but
 * available memory changed, or it moved by more than 1% of the total or
 * 256 MiB. */
bool exo_node_info_changed(const exo_node_info *old, const exo_node_info *now);

#endif
