/* exo's entry point: dispatches `exo <command> ...` to the handlers.
 * Each handler parses its own flags and returns a process exit status. */
#include "cli/commands.h"

#include <stdio.h>
#include <string.h>

static const exo_command commands[] = {
    {NULL, NULL, NULL},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: exo <command> [args]\n\ncommands:\n");
    for (const exo_command *c = commands; c->name; c++)
        fprintf(f, "  %-16s %s\n", c->name, c->summary);
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (const exo_command *c = commands; c->name; c++)
        if (!strcmp(c->name, argv[1]))
            return c->fn(argc - 1, argv + 1);
    fprintf(stderr, "exo: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
