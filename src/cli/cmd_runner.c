/* `exo runner --fd N [-v]`: the runner child process a node's supervisor
 * starts (runner/supervisor.h); not meant to be run by hand. N is the
 * runner's end of the socketpair the supervisor created; everything else
 * (which model, which requests) arrives as frames on it (runner/protocol.h). */
#include "cli/args.h"
#include "core/log.h"
#include "runner/runner.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>

int exo_cmd_runner(int argc, char **argv);

int exo_cmd_runner(int argc, char **argv)
{
    long fd = -1;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--fd")) {
            if (!(v = exo_arg_value("runner", argc, argv, &i)) ||
                exo_arg_int("runner", "--fd", v, 0, 1 << 20, &fd))
                return 2;
        } else if (!strcmp(argv[i], "-v")) {
            exo_log_set_level(EXO_LOG_DEBUG);
        } else {
            fprintf(stderr, "exo runner: unexpected argument '%s'\n", argv[i]);
            fprintf(stderr, "usage: exo runner --fd N   (started by the exo daemon)\n");
            return 2;
        }
    }
    if (fd < 0 || fcntl((int)fd, F_GETFD) < 0) {
        fprintf(stderr, "exo runner: --fd N must name an open socket (started by the exo daemon)\n");
        return 2;
    }
    return exo_runner_main((int)fd);
}
