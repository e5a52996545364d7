// Causal attention forward and backward through cuDNN's fused SDPA (the "flash" engine that
// PyTorch's SDPBackend.CUDNN_ATTENTION runs), built with cudnn-frontend's graph API. cuDNN is
// loaded when the program runs (lft_cudnn_load), never linked: without it the project's own
// kernels (src/cuda/flash_attention.cu) do the work. src/cuda/cudnn_sdpa.rs is the Rust side.
//
// Each call names its shape, dtype, strides and score rule in a SdpaDesc; the graph built for a
// desc is kept, so a training run builds two graphs per sequence shape and rule (forward,
// backward) and reuses them.
//
// The score rule: s = scale · q·kᵀ, then Gemma 2's soft cap cap · tanh(s / cap) where asked,
// then the causal mask and, with a window w, HF Mistral's rule (key j visible from row i when
// i − j < w). cuDNN takes a soft cap only as a score modifier (its Softcap, forward and bprop), and
// a modifier turns its built-in masks off, so the masks are then built inside the modifier.
// Every entry point returns 0 or writes one line into `err` and returns -1: no exception leaves.
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include <cudnn_frontend.h>

namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;  // the library the front end's calls go to
}

namespace fe = cudnn_frontend;

extern "C" {
// One attention call: q [b, h, s, d], k/v [b, kv_heads, s, d], element strides in (b, h, s, d)
// order with unit stride along d. Forward: o like q. Backward: do like o, dq like q, dk/dv like k.
struct SdpaDesc {
    int64_t batch, heads, kv_heads, seq, head_dim;
    int32_t bf16;  // 0: f16, 1: bf16
    float scale;
    float softcap;   // 0: none
    int64_t window;  // 0: none
    // Packed rows: 0, or the number of sequences laid back to back in [tokens, heads, d] memory
    // (then `batch` = ragged, `seq` = the longest a sequence may be, and the strides below are
    // ignored): each tensor gets ragged offsets, and cuDNN's padding mask the sequence lengths.
    int64_t ragged;
    // Packed rows: the tokens of the whole [tokens, heads, d] memory, which bounds the token axis
    // of cuDNN's workspace (its dQ accumulator would otherwise be [sequences, heads, seq, d])
    int64_t total_tokens;
    int64_t q[4], k[4], v[4], o[4], d_o[4], dq[4], dk[4], dv[4];
};

// A packed call's ragged offsets and sequence lengths (int32 device columns), or nulls.
struct RaggedPtrs {
    void *q_offsets, *kv_offsets, *seq_lens;
};
}

namespace {

enum Uid : int64_t { Q = 1, K, V, O, STATS, DO, DQ, DK, DV, Q_OFFSETS, KV_OFFSETS, SEQ_LENS };

void set_error(char *err, size_t len, const std::string &what) {
    if (len > 0) std::snprintf(err, len, "%s", what.c_str());
}

// Graphs are keyed by the whole desc and the direction.
using Key = std::tuple<bool, std::vector<int64_t>, float, float>;

Key key_of(const SdpaDesc &d, bool backward) {
    std::vector<int64_t> v{d.batch, d.heads, d.kv_heads, d.seq, d.head_dim, d.bf16, d.window, d.ragged, d.total_tokens};
    for (const int64_t *s : {d.q, d.k, d.v, d.o, d.d_o, d.dq, d.dk, d.dv}) v.insert(v.end(), s, s + 4);
    return {backward, v, d.scale, d.softcap};
}

struct State {
    std::mutex lock;
    std::map<void *, cudnnHandle_t> handles;  // one per stream (one stream per device in this program)
    std::map<Key, std::shared_ptr<fe::graph::Graph>> graphs;
    // graphs built so far and the host time their building took (a new shape's cost)
    uint64_t builds = 0;
    double build_seconds = 0;
};

State &state() {
    static State s;
    return s;
}

std::vector<int64_t> dims(int64_t b, int64_t h, int64_t s, int64_t d) { return {b, h, s, d}; }
std::vector<int64_t> strides(const int64_t s[4]) { return {s[0], s[1], s[2], s[3]}; }

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph &g, const char *name, Uid uid,
                                                    std::vector<int64_t> dim, const int64_t s[4]) {
    return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(strides(s)));
}

// Packed rows: [tokens, heads, d] memory read as [sequences, heads, longest, d] through ragged
// offsets (elements, int32, one per sequence and the end).
struct Ragged {
    std::shared_ptr<fe::graph::Tensor_attributes> q_offsets, kv_offsets, seq_lens;
};

Ragged ragged_tensors(fe::graph::Graph &g, const SdpaDesc &d) {
    auto column = [&](const char *name, Uid uid, int64_t n) {
        return g.tensor(fe::graph::Tensor_attributes()
                            .set_name(name)
                            .set_uid(uid)
                            .set_dim({n, 1, 1, 1})
                            .set_stride({1, 1, 1, 1})
                            .set_data_type(fe::DataType_t::INT32));
    };
    return {column("q_offsets", Q_OFFSETS, d.ragged + 1), column("kv_offsets", KV_OFFSETS, d.ragged + 1),
            column("seq_lens", SEQ_LENS, d.ragged)};
}

// The strides of [sequences, heads, longest, d] views of [tokens, heads, d] memory.
std::vector<int64_t> thd(int64_t heads, const SdpaDesc &d) {
    return {d.seq * heads * d.head_dim, d.head_dim, heads * d.head_dim, 1};
}

// A q-shaped (q-heads) or kv-shaped tensor, dense or ragged.
std::shared_ptr<fe::graph::Tensor_attributes> shaped(fe::graph::Graph &g, const char *name, Uid uid, bool kv,
                                                     const SdpaDesc &d, const int64_t s[4], const Ragged *r) {
    const int64_t heads = kv ? d.kv_heads : d.heads;
    auto t = g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(
        {d.batch, heads, d.seq, d.head_dim}));
    if (r == nullptr) {
        t->set_stride(strides(s));
    } else {
        t->set_stride(thd(heads, d)).set_ragged_offset(kv ? r->kv_offsets : r->q_offsets);
    }
    return t;
}

// An output of the same kinds.
void shape_output(std::shared_ptr<fe::graph::Tensor_attributes> t, Uid uid, bool kv, const SdpaDesc &d,
                  const int64_t s[4], const Ragged *r) {
    const int64_t heads = kv ? d.kv_heads : d.heads;
    t->set_output(true).set_uid(uid).set_dim({d.batch, heads, d.seq, d.head_dim});
    if (r == nullptr) {
        t->set_stride(strides(s));
    } else {
        t->set_stride(thd(heads, d)).set_ragged_offset(kv ? r->kv_offsets : r->q_offsets);
    }
}

std::shared_ptr<fe::graph::Graph> new_graph(const SdpaDesc &d) {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(d.bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
}

// Stats: the row log-sum-exp (natural log) of the scaled scores, [b, h, s, 1] f32.
fe::graph::Tensor_attributes stats_tensor(const SdpaDesc &d) {
    return fe::graph::Tensor_attributes()
        .set_name("stats")
        .set_uid(STATS)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({d.batch, d.heads, d.seq, 1})
        .set_stride({d.heads * d.seq, d.seq, 1, 1});
}

using GraphPtr = std::shared_ptr<fe::graph::Graph>;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// The causal mask and the window (top-left aligned: row i is position i), as score-modifier nodes.
TensorPtr causal_window(GraphPtr g, TensorPtr scores, int64_t window) {
    std::optional<int64_t> left = window > 0 ? std::optional<int64_t>(window) : std::nullopt;
    return fe::graph::attn::score_modifiers::sliding_window_mask(g, scores, fe::DiagonalAlignment_t::TOP_LEFT, left, 0,
                                                                 0, 0, nullptr, nullptr);
}

// The desc's score rule on forward (SDPA_attributes) or backward (SDPA_backward_attributes) options.
template <typename Options>
void set_rule(fe::graph::Graph &g, Options &options, const SdpaDesc &d, const Ragged *r) {
    options.set_attn_scale(d.scale);
    if (r != nullptr) {
        // each sequence its own causal rows (top left: row i of a sequence is its position i)
        options.set_padding_mask(true).set_seq_len_q(r->seq_lens).set_seq_len_kv(r->seq_lens);
        if (d.total_tokens > 0) {
            options.set_max_total_seq_len_q(d.total_tokens).set_max_total_seq_len_kv(d.total_tokens);
        }
    }
    if (d.softcap <= 0.0f) {
        options.set_causal_mask(true);
        if (d.window > 0) options.set_diagonal_band_left_bound(static_cast<int>(d.window));
        return;
    }
    auto cap = g.tensor(d.softcap);
    // one Softcap per graph: its forward keeps the pre-tanh scores that its bprop reads
    auto softcap = std::make_shared<fe::graph::attn::score_modifiers::Softcap>();
    const int64_t window = d.window;
    options.set_score_mod([softcap, cap, window](GraphPtr sub, TensorPtr scores) {
        return causal_window(sub, softcap->forward(sub, scores, cap), window);
    });
    if constexpr (std::is_same_v<Options, fe::graph::SDPA_backward_attributes>) {
        options.set_score_mod_bprop(
            [softcap, cap](GraphPtr sub, TensorPtr d_scores) { return softcap->backward(sub, d_scores, cap); });
    }
}

std::shared_ptr<fe::graph::Graph> forward_graph(const SdpaDesc &d) {
    auto g = new_graph(d);
    Ragged ragged;
    const Ragged *r = nullptr;
    if (d.ragged > 0) {
        ragged = ragged_tensors(*g, d);
        r = &ragged;
    }
    auto q = shaped(*g, "q", Q, false, d, d.q, r);
    auto k = shaped(*g, "k", K, true, d, d.k, r);
    auto v = shaped(*g, "v", V, true, d, d.v, r);
    auto options = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true);
    set_rule(*g, options, d, r);
    auto [o, stats] = g->sdpa(q, k, v, options);
    shape_output(o, O, false, d, d.o, r);
    stats->set_output(true).set_uid(STATS).set_data_type(fe::DataType_t::FLOAT);
    stats->set_dim({d.batch, d.heads, d.seq, 1}).set_stride(stats_tensor(d).get_stride());
    return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const SdpaDesc &d) {
    auto g = new_graph(d);
    Ragged ragged;
    const Ragged *r = nullptr;
    if (d.ragged > 0) {
        ragged = ragged_tensors(*g, d);
        r = &ragged;
    }
    auto q = shaped(*g, "q", Q, false, d, d.q, r);
    auto k = shaped(*g, "k", K, true, d, d.k, r);
    auto v = shaped(*g, "v", V, true, d, d.v, r);
    auto o = shaped(*g, "o", O, false, d, d.o, r);
    auto d_o = shaped(*g, "do", DO, false, d, d.d_o, r);
    auto stats = g->tensor(stats_tensor(d));
    auto options = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward");
    set_rule(*g, options, d, r);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, options);
    shape_output(dq, DQ, false, d, d.dq, r);
    shape_output(dk, DK, true, d, d.dk, r);
    shape_output(dv, DV, true, d, d.dv, r);
    return g;
}

#define CHECK(call)                                                          \
    do {                                                                     \
        auto status_ = (call);                                               \
        if (!status_.is_good()) throw std::runtime_error(status_.get_message()); \
    } while (0)

cudnnHandle_t handle_for(State &s, void *stream) {
    auto it = s.handles.find(stream);
    if (it != s.handles.end()) return it->second;
    cudnnHandle_t h = nullptr;
    if (fe::detail::create_handle(&h) != CUDNN_STATUS_SUCCESS) throw std::runtime_error("cudnnCreate failed");
    if (fe::detail::set_stream(h, static_cast<cudaStream_t>(stream)) != CUDNN_STATUS_SUCCESS)
        throw std::runtime_error("cudnnSetStream failed");
    s.handles.emplace(stream, h);
    return h;
}

// The built graph of (desc, direction) on the stream's handle, and that handle.
std::pair<std::shared_ptr<fe::graph::Graph>, cudnnHandle_t> graph_for(const SdpaDesc &d, bool backward, void *stream) {
    auto &s = state();
    std::lock_guard<std::mutex> guard(s.lock);
    cudnnHandle_t h = handle_for(s, stream);
    const Key key = key_of(d, backward);
    auto it = s.graphs.find(key);
    if (it != s.graphs.end()) return {it->second, h};
    const auto started = std::chrono::steady_clock::now();
    auto g = backward ? backward_graph(d) : forward_graph(d);
    CHECK(g->validate());
    CHECK(g->build_operation_graph(h));
    CHECK(g->create_execution_plans({fe::HeurMode_t::A}));
    CHECK(g->check_support(h));
    CHECK(g->build_plans(h));
    s.graphs.emplace(key, g);
    s.builds += 1;
    s.build_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return {g, h};
}

template <typename F>
int guarded(char *err, size_t len, F body) {
    try {
        body();
        return 0;
    } catch (const std::exception &e) {
        set_error(err, len, e.what());
    } catch (...) {
        set_error(err, len, "unknown C++ exception");
    }
    return -1;
}

void add_ragged(std::unordered_map<int64_t, void *> &pack, const SdpaDesc *d, const RaggedPtrs *r) {
    if (d->ragged > 0) {
        if (r == nullptr) throw std::runtime_error("a ragged call without its offsets");
        pack.insert({{Q_OFFSETS, r->q_offsets}, {KV_OFFSETS, r->kv_offsets}, {SEQ_LENS, r->seq_lens}});
    }
}

}  // namespace

extern "C" {

// Opens cuDNN (`path`, or libcudnn.so.9 on the loader's search path) and returns its version
// (e.g. 91900), or 0 with the reason in `err`.
int64_t lft_cudnn_load(const char *path, char *err, size_t len) {
    if (fe::cudnn_dlhandle == nullptr) {
        void *lib = dlopen(path && *path ? path : "libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
        if (lib == nullptr) {
            const char *why = dlerror();
            set_error(err, len, why ? why : "dlopen failed");
            return 0;
        }
        fe::cudnn_dlhandle = lib;
    }
    int64_t version = 0;
    if (guarded(err, len, [&] { version = static_cast<int64_t>(fe::detail::get_backend_version()); }) != 0) return 0;
    return version;
}

// The graphs built so far (forward and backward, every shape) and the seconds that took.
void lft_cudnn_sdpa_graph_builds(uint64_t *builds, double *seconds) {
    auto &s = state();
    std::lock_guard<std::mutex> guard(s.lock);
    *builds = s.builds;
    *seconds = s.build_seconds;
}

// Builds (once per desc) the forward or backward graph and writes its workspace size in bytes.
int lft_cudnn_sdpa_workspace(const SdpaDesc *d, int32_t backward, void *stream, int64_t *bytes, char *err,
                             size_t len) {
    return guarded(err, len, [&] { *bytes = graph_for(*d, backward != 0, stream).first->get_workspace_size(); });
}

int lft_cudnn_sdpa_forward(const SdpaDesc *d, const RaggedPtrs *r, void *stream, void *q, void *k, void *v, void *o,
                           void *stats, void *workspace, char *err, size_t len) {
    return guarded(err, len, [&] {
        auto [g, h] = graph_for(*d, false, stream);
        std::unordered_map<int64_t, void *> pack{{Q, q}, {K, k}, {V, v}, {O, o}, {STATS, stats}};
        add_ragged(pack, d, r);
        CHECK(g->execute(h, pack, workspace));
    });
}

int lft_cudnn_sdpa_backward(const SdpaDesc *d, const RaggedPtrs *r, void *stream, void *q, void *k, void *v, void *o,
                            void *d_o, void *stats, void *dq, void *dk, void *dv, void *workspace, char *err,
                            size_t len) {
    return guarded(err, len, [&] {
        auto [g, h] = graph_for(*d, true, stream);
        std::unordered_map<int64_t, void *> pack{{Q, q},   {K, k},   {V, v},   {O, o},  {DO, d_o},
                                                 {STATS, stats}, {DQ, dq}, {DK, dk}, {DV, dv}};
        add_ragged(pack, d, r);
        CHECK(g->execute(h, pack, workspace));
    });
}
}
