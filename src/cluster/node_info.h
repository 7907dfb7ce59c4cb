/* What a node tells the cluster about itself (NodeGatheredInfo): memory
 * from /proc/meminfo (MemTotal, MemAvailable), online CPUs, the host name
 * as friendly name, and the compute backends it can run (always Cpu; Cuda
 * when libcuda.so.1 can be dlopen'ed and reports a device). */
#ifndef EXO_CLUSTER_NODE_INFO_H
#define EXO_CLUSTER_NODE_INFO_H

#include "cluster/types.h"
#include "core/error.h"

/* Fills info; EXO_EIO if /proc/meminfo cannot be read. */
int exo_node_info_gather(exo_node_info *info, exo_err *err);

#endif
