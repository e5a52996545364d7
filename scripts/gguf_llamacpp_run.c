// llama.cpp itself, run on a GGUF file for the checks of scripts/gguf_llamacpp_*.py: compiled by
// scripts/gguf_llamacpp_install.sh against the llama.h of the same release as the prebuilt
// libllama it links (npm's node-llama-cpp packages), so the C API is used exactly as declared.
// Settings as llama-cpp-python's defaults that the checks used: CPU, f16 K/V cache, no flash
// attention, the whole input in one batch.
//
//   gguf_llamacpp_run logits   LIBDIR MODEL.gguf LORA.gguf|- IDS.txt OUT.f32
//     IDS.txt: one sequence of comma-separated token ids a line; each is run from an empty cache
//     and the logits of every position are appended to OUT.f32 (float32, positions x vocab).
//   gguf_llamacpp_run generate LIBDIR MODEL.gguf LORA.gguf|- PROMPTS.hex N
//     PROMPTS.hex: one prompt a line, its UTF-8 bytes in hex; each is tokenized with special
//     tokens parsed (and BOS added where the vocabulary says so), then up to N tokens are chosen
//     greedily (argmax) until an end-of-generation token. Prints one line a prompt: the prompt's
//     token count, a tab, the reply's bytes in hex (the pieces of its tokens, special ones empty).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *data) {
    (void)data;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static void die(const char *what) {
    fprintf(stderr, "gguf_llamacpp_run: %s\n", what);
    exit(1);
}

static struct llama_context *open_context(struct llama_model *model, const char *lora, int n_ctx, int n_batch) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_batch;
    cp.n_ubatch = n_batch;
    // one thread: ggml's threads spin at each barrier, which stalls whenever the cores are shared
    // (cargo test runs the tests side by side); the logits do not depend on the thread count
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = GGML_TYPE_F16;
    cp.type_v = GGML_TYPE_F16;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) die("cannot create a context");
    if (strcmp(lora, "-") != 0) {
        struct llama_adapter_lora *adapter = llama_adapter_lora_init(model, lora);
        if (!adapter) die("cannot load the LoRA GGUF");
        float scale = 1.0f;
        if (llama_set_adapters_lora(ctx, &adapter, 1, &scale) != 0) die("cannot apply the LoRA GGUF");
    }
    return ctx;
}

// Decodes `n` tokens at positions 0.. into an empty cache; logits for all or only the last.
static void decode(struct llama_context *ctx, const llama_token *ids, int n, int pos0, int all) {
    struct llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        batch.token[i] = ids[i];
        batch.pos[i] = pos0 + i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = all || i == n - 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch) != 0) die("llama_decode failed");
    llama_batch_free(batch);
}

static int parse_ids(char *line, llama_token *ids, int max) {
    int n = 0;
    for (char *tok = strtok(line, ", \n"); tok; tok = strtok(NULL, ", \n")) {
        if (n == max) die("sequence too long");
        ids[n++] = atoi(tok);
    }
    return n;
}

static int hex_value(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    die("bad hex in the prompts");
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 7 || (strcmp(argv[1], "logits") != 0 && strcmp(argv[1], "generate") != 0)) {
        fprintf(stderr, "usage: %s logits|generate LIBDIR MODEL.gguf LORA.gguf|- INPUT OUT|N\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1], *libdir = argv[2], *path = argv[3], *lora = argv[4], *input = argv[5];
    llama_log_set(quiet, NULL);
    ggml_backend_load_all_from_path(libdir);  // the CPU backend variant that fits this processor
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(path, mp);
    if (!model) die("cannot load the model");
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    FILE *in = fopen(input, "r");
    if (!in) die("cannot open the input");
    static char line[1 << 20];
    static llama_token ids[1 << 16];
    if (strcmp(mode, "logits") == 0) {
        struct llama_context *ctx = open_context(model, lora, 64, 64);
        FILE *out = fopen(argv[6], "wb");
        if (!out) die("cannot open the output");
        while (fgets(line, sizeof line, in)) {
            int n = parse_ids(line, ids, 64);
            if (n == 0) continue;
            llama_memory_clear(llama_get_memory(ctx), true);
            decode(ctx, ids, n, 0, 1);
            for (int i = 0; i < n; i++) {
                const float *row = llama_get_logits_ith(ctx, i);
                if (!row || fwrite(row, sizeof(float), n_vocab, out) != (size_t)n_vocab) die("no logits");
            }
        }
        if (fclose(out) != 0) die("cannot write the output");
        llama_free(ctx);
    } else {
        const int max_new = atoi(argv[6]);
        struct llama_context *ctx = open_context(model, lora, 1024, 512);
        static char text[1 << 19];
        while (fgets(line, sizeof line, in)) {
            size_t len = strcspn(line, "\n");
            if (len == 0) continue;
            size_t n_text = len / 2;
            for (size_t i = 0; i < n_text; i++) text[i] = (char)(hex_value(line[2 * i]) * 16 + hex_value(line[2 * i + 1]));
            int n = llama_tokenize(vocab, text, (int32_t)n_text, ids, 1024, true, true);
            if (n <= 0 || n > 512) die("prompt empty or too long");
            llama_memory_clear(llama_get_memory(ctx), true);
            decode(ctx, ids, n, 0, 0);
            printf("%d\t", n);
            for (int step = 0; step < max_new; step++) {
                const float *logits = llama_get_logits_ith(ctx, -1);
                llama_token best = 0;
                for (llama_token t = 1; t < n_vocab; t++)
                    if (logits[t] > logits[best]) best = t;
                if (llama_vocab_is_eog(vocab, best)) break;
                char piece[256];
                int k = llama_token_to_piece(vocab, best, piece, sizeof piece, 0, false);
                if (k < 0) die("token piece too long");
                for (int i = 0; i < k; i++) printf("%02x", (unsigned char)piece[i]);
                if (step + 1 < max_new) decode(ctx, &best, 1, n + step, 0);
            }
            printf("\n");
            fflush(stdout);
        }
        llama_free(ctx);
    }
    fclose(in);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
