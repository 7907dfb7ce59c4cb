/* The exo command line: one handler per subcommand, each in its own
 * cmd_<name>.c. main.c holds the table that maps names to handlers. */
#ifndef EXO_CLI_COMMANDS_H
#define EXO_CLI_COMMANDS_H

typedef int (*exo_cmd_fn)(int argc, char **argv);

typedef struct exo_command {
    const char *name;
    exo_cmd_fn  fn;
    const char *summary;
} exo_command;

#endif
