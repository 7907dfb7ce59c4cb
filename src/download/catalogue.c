/* The built-in model catalogue (see catalogue.h; the data's origin and the
 * refresh procedure are in CATALOGUE.md).
 *
 * One static const table, sorted by model_id in strcmp (byte) order, which is
 * what exo_catalogue_find bisects: upper case sorts before lower case, so
 * "mlx-community/llama-3.3-70b-instruct-fp16" comes last. The unit tests check
 * the order, so a card added in the wrong place fails them rather than
 * silently becoming unfindable.
 *
 * Each entry is exo's card as of the commit named in CATALOGUE.md; fields not
 * named in an entry are 0 / NULL (reasoning_dialect NULL: the card has none).
 * n_kv_heads = 0 and vocab_size = 0 mean "not known": the card does not say
 * and the model's config.json could not be checked (CATALOGUE.md). */
#include "download/catalogue.h"

#include <string.h>

static const exo_catalogue_card cards[] = {
    {.model_id = "mlx-community/Llama-3.1-Nemotron-70B-Instruct-HF-4bit", .model_type = "llama",
     .family = "llama", .base_model = "NVIDIA Llama-3.1-Nemotron-70B-Instruct", .quantization = "4bit",
     .n_layers = 80, .hidden_size = 8192, .n_kv_heads = 8, .vocab_size = 128256, .context_length = 131072,
     .storage_bytes = 39688355840, .supports_tensor = true, .supports_thinking = false, .supports_tools = false},
    {.model_id = "mlx-community/Llama-3.1-Nemotron-70B-Instruct-HF-8bit", .model_type = "llama",
     .family = "llama", .base_model = "NVIDIA Llama-3.1-Nemotron-70B-Instruct", .quantization = "8bit",
     .n_layers = 80, .hidden_size = 8192, .n_kv_heads = 8, .vocab_size = 128256, .context_length = 131072,
     .storage_bytes = 74964549632, .supports_tensor = true, .supports_thinking = false, .supports_tools = false},
    {.model_id = "mlx-community/Llama-3.1-Nemotron-70B-Instruct-HF-bf16", .model_type = "llama",
     .family = "llama", .base_model = "NVIDIA Llama-3.1-Nemotron-70B-Instruct", .quantization = "bf16",
     .n_layers = 80, .hidden_size = 8192, .n_kv_heads = 8, .vocab_size = 128256, .context_length = 131072,
     .storage_bytes = 141107412992, .supports_tensor = true, .supports_thinking = false, .supports_tools = false},
    {.model_id = "mlx-community/Llama-3.2-1B-Instruct-4bit", .model_type = "llama",
     .family = "llama", .base_model = "Llama 3.2 1B", .quantization = "4bit",
     .n_layers = 16, .hidden_size = 2048, .n_kv_heads = 8, .vocab_size = 128256, .context_length = 131072,
     .storage_bytes = 729808896, .supports_tensor = true, .supports_thinking = false, .supports_tools = false},
    {.model_id = "mlx-community/Llama-3.2-3B-Instruct-4bit", .model_type = "llama",
     .family = "llama", .base_model = "Llama 3.2 3B", .quantization = "4bit",
     .n_layers = 28, .hidden_size = 3072, .n_kv_heads = 8, .vocab_size = 128256, .context_length = 131072,
     .storage_bytes = 1863319552, .supports_tensor = true, .supports_thinking = false, .supports_tools = false},
    {.model_id = "mlx-community/Llama-3.2-3B-Instruct-8bit", .model_type = "llama",
     .family = "llama", .base_model = "Llama 3.2 3B", .quantization = "8bit",
     .n_layers = 28, .hidden_size = 3072, .n_kv_heads = 8, .vocab_size = 128256, .context_length = 131072,
     .storage_bytes = 3501195264, .supports_tensor = true, .supports_thinking = false, .supports_tools = false},
    {.model_id = "mlx-community/Llama-3.3-70B-Instruct-4bit", .model_type = "llama",
     .family = "llama", .base_model = "Llama 3.3 70B", .quantization = "4bit",
     .n_layers = 80, .hidden_size = 8192, .n_kv_heads = 8, .vocab_size = 128256, .context_length = 131072,
     .storage_bytes = 40652242944, .supports_tensor = true, .supports_thinking = false, .supports_tools = false},
    {.model_id = "mlx-community/Llama-3.3-70B-Instruct-8bit", .model_type = "llama",
     .family = "llama", .base_model = "Llama 3.3 70B", .quantization = "8bit",
     .n_layers = 80, .hidden_size = 8192, .n_kv_heads = 8, .vocab_size = 128256, .context_length = 131072,
     .storage_bytes = 76799803392, .supports_tensor = true, .supports_thinking = false, .supports_tools = false},
    {.model_id = "mlx-community/Meta-Llama-3.1-70B-Instruct-4bit", .model_type = "llama",
     .family = "llama", .base_model = "Llama 3.1 70B", .quantization = "4bit",
     .n_layers = 80, .hidden_size = 8192, .n_kv_heads = 8, .vocab_size = 128256, .context_length = 131072,
     .storage_bytes = 40652242944, .supports_tensor = true, .supports_thinking = false, .supports_tools = false},
    {.model_id = "mlx-community/Meta-Llama-3.1-8B-Instruct-4bit", .model_type = "llama",
     .family = "llama", .base_model = "Llama 3.1 8B", .quantization = "4bit",
     .n_layers = 32, .hidden_size = 4096, .n_kv_heads = 8, .vocab_size = 128256, .context_length = 131072,
     .storage_bytes = 4637851648, .supports_tensor = true, .supports_thinking = false, .supports_tools = false},
    {.model_id = "mlx-community/Meta-Llama-3.1-8B-Instruct-8bit", .model_type = "llama",
     .family = "llama", .base_model = "Llama 3.1 8B", .quantization = "8bit",
     .n_layers = 32, .hidden_size = 4096, .n_kv_heads = 8, .vocab_size = 128256, .context_length = 131072,
     .storage_bytes = 8954839040, .supports_tensor = true, .supports_thinking = false, .supports_tools = false},
    {.model_id = "mlx-community/Meta-Llama-3.1-8B-Instruct-bf16", .model_type = "llama",
     .family = "llama", .base_model = "Llama 3.1 8B", .quantization = "bf16",
     .n_layers = 32, .hidden_size = 4096, .n_kv_heads = 8, .vocab_size = 128256, .context_length = 131072,
     .storage_bytes = 16882073600, .supports_tensor = true, .supports_thinking = false, .supports_tools = false},
    {.model_id = "mlx-community/Qwen3-0.6B-4bit", .model_type = "qwen3",
     .family = "qwen", .base_model = "Qwen3 0.6B", .quantization = "4bit",
     .n_layers = 28, .hidden_size = 1024, .n_kv_heads = 8, .vocab_size = 151936, .context_length = 32768,
     .storage_bytes = 342884352, .supports_tensor = false, .supports_thinking = true, .supports_tools = false},
    {.model_id = "mlx-community/Qwen3-0.6B-8bit", .model_type = "qwen3",
     .family = "qwen", .base_model = "Qwen3 0.6B", .quantization = "8bit",
     .n_layers = 28, .hidden_size = 1024, .n_kv_heads = 8, .vocab_size = 151936, .context_length = 32768,
     .storage_bytes = 698351616, .supports_tensor = false, .supports_thinking = true, .supports_tools = false},
    {.model_id = "mlx-community/Qwen3-30B-A3B-4bit", .model_type = "qwen3_moe",
     .family = "qwen", .base_model = "Qwen3 30B", .quantization = "4bit",
     .n_layers = 48, .hidden_size = 2048, .n_kv_heads = 4, .vocab_size = 151936, .context_length = 32768,
     .storage_bytes = 17612931072, .supports_tensor = true, .supports_thinking = true, .supports_tools = false},
    {.model_id = "mlx-community/Qwen3-30B-A3B-8bit", .model_type = "qwen3_moe",
     .family = "qwen", .base_model = "Qwen3 30B", .quantization = "8bit",
     .n_layers = 48, .hidden_size = 2048, .n_kv_heads = 4, .vocab_size = 151936, .context_length = 32768,
     .storage_bytes = 33279705088, .supports_tensor = true, .supports_thinking = true, .supports_tools = false},
    {.model_id = "mlx-community/llama-3.3-70b-instruct-fp16", .model_type = "llama",
     .family = "llama", .base_model = "Llama 3.3 70B", .quantization = "fp16",
     .n_layers = 80, .hidden_size = 8192, .n_kv_heads = 8, .vocab_size = 128256, .context_length = 131072,
     .storage_bytes = 144383672320, .supports_tensor = true, .supports_thinking = false, .supports_tools = false},
};

#define N_CARDS (sizeof cards / sizeof cards[0])

size_t exo_catalogue_count(void) { return N_CARDS; }

const exo_catalogue_card *exo_catalogue_at(size_t i) { return i < N_CARDS ? &cards[i] : NULL; }

const exo_catalogue_card *exo_catalogue_find(const char *model_id)
{
    if (!model_id)
        return NULL;
    size_t lo = 0, hi = N_CARDS;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(cards[mid].model_id, model_id);
        if (c == 0)
            return &cards[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}
