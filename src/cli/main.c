/* exo's entry point: dispatches `exo <command> ...` to the handlers.
 * Each handler parses its own flags and returns a process exit status. */
#include "cli/commands.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int exo_cmd_run(int argc, char **argv);
int exo_cmd_logits(int argc, char **argv);
int exo_cmd_convert_llama2c(int argc, char **argv);
int exo_cmd_quantize(int argc, char **argv);
int exo_cmd_bench(int argc, char **argv);
int exo_cmd_synth_model(int argc, char **argv);
int exo_cmd_download(int argc, char **argv);
int exo_cmd_chat_template(int argc, char **argv);

int exo_cmd_tokenize(int argc, char **argv);
int exo_cmd_detokenize(int argc, char **argv);
int exo_cmd_runner(int argc, char **argv);
int exo_cmd_serve(int argc, char **argv);

static const exo_command commands[] = {
    {"serve", exo_cmd_serve, "run the node daemon: HTTP API on :52415 (the default command)"},
    {"run", exo_cmd_run, "generate text from a local model directory"},
    {"logits", exo_cmd_logits, "write every position's logits of one prefill (f32 [T, vocab])"},
    {"convert-llama2c", exo_cmd_convert_llama2c, "convert a llama2.c checkpoint to a HF Llama dir"},
    {"quantize", exo_cmd_quantize, "write an MLX affine-quantized copy of a model"},
    {"bench", exo_cmd_bench, "measure prefill/decode speed against memory bandwidth"},
    {"download", exo_cmd_download, "fetch a model (or a shard's files) from the Hugging Face hub"},
    {"synth-model", exo_cmd_synth_model, "write a synthetic preset's random-weight model as a HF dir"},
    {"chat-template", exo_cmd_chat_template, "render a model's chat template for a conversation"},
    {"tokenize", exo_cmd_tokenize, "print the token ids of a text (tokenizer.json)"},
    {"detokenize", exo_cmd_detokenize, "print the text of a list of token ids"},
    {"runner", exo_cmd_runner, "(internal) a runner child process, started by the daemon"},
    {NULL, NULL, NULL},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: exo [<command>] [args]     (no command: exo serve)\n\ncommands:\n");
    for (const exo_command *c = commands; c->name; c++)
        fprintf(f, "  %-16s %s\n", c->name, c->summary);
}

int main(int argc, char **argv)
{
    /* GPU numbers (cuda:N, a placement's devices) are nvidia-smi's and
     * NVML's, the node info's source: PCI bus order, not CUDA's default
     * fastest-first. Set before anything touches CUDA; a user's own choice
     * stands. */
    setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 0);
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        usage(stdout);
        return 0;
    }
    if (argc < 2 || argv[1][0] == '-') /* `exo` and `exo --api-port ...` are the daemon */
        return exo_cmd_serve(argc, argv);
    for (const exo_command *c = commands; c->name; c++)
        if (!strcmp(c->name, argv[1]))
            return c->fn(argc - 1, argv + 1);
    fprintf(stderr, "exo: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
