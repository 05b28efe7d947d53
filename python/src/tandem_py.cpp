// The Python module's native part, `tandem._tandem` (pybind11). It takes memory as addresses,
// dtypes and sizes (the Python side, python/tandem/__init__.py, checks the torch tensors and
// passes their data_ptr(): no copy, no libtorch in the build) and releases the GIL while it
// computes. tandem::Error becomes a Python exception by kind: kInvalidArgument / kOutOfRange /
// kFormat -> ValueError, kUnsupported -> TypeError, kIo -> OSError, kResource -> MemoryError,
// others RuntimeError; the message is the Error's (it names the argument).
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/chat.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "formats/quant.h"
#include "moe/moe_layer.h"
#include "moe/moe_stream.h"
#include "ops/cpu/ref_ops.h"
#include "tools/options.h"

namespace py = pybind11;

namespace tandem {
namespace {

template <typename T>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

DType dtype_of(const std::string& name) {
  const std::optional<DType> t = dtype_from_name(name);
  if (!t) fail(ErrorKind::kUnsupported, "dtype '{}' is not one tandem reads", name);
  return *t;
}

// One weight family of a layer (gate, up or down) as Python describes it: data and scales are an
// address (scales: 0 when there are none) or a list of one address per expert.
ExpertTensor expert_tensor(const py::object& data, const std::string& dtype, int64_t experts,
                           int64_t rows, int64_t cols, const py::object& scales,
                           int64_t block_rows, int64_t block_cols) {
  const bool each = py::isinstance<py::list>(data);
  const bool each_scales = py::isinstance<py::list>(scales);
  ExpertTensor t;
  t.data = ptr<const void>(each ? 0 : data.cast<uintptr_t>());
  t.dtype = dtype_of(dtype);
  t.experts = experts;
  t.rows = rows;
  t.cols = cols;
  t.scales = ptr<const float>(each_scales ? 0 : scales.cast<uintptr_t>());
  t.block_rows = block_rows;
  t.block_cols = block_cols;
  if (each) {
    for (uintptr_t p : data.cast<std::vector<uintptr_t>>()) t.each.push_back(ptr<const void>(p));
  }
  if (each_scales) {
    for (uintptr_t p : scales.cast<std::vector<uintptr_t>>()) {
      t.each_scales.push_back(ptr<const float>(p));
    }
  }
  return t;
}

MoeLayerOptions layer_options(int64_t num_experts, int64_t k, int64_t hidden, int64_t inter,
                              const std::string& method, int group,
                              const std::vector<uint8_t>& mask, int64_t chunk) {
  MoeLayerOptions o;
  o.num_experts = num_experts;
  o.num_experts_per_tok = k;
  o.hidden_size = hidden;
  o.intermediate_size = inter;
  o.method = method;
  o.group = group;
  o.gpu_experts_mask = mask;
  o.max_chunk_tokens = chunk;
  return o;
}

// A submit's options; mask: the address of mask_size bools (a torch.bool tensor's), read now.
SubmitOptions submit_options(bool accumulate, bool deferred, uintptr_t mask, int64_t mask_size) {
  SubmitOptions o;
  o.accumulate = accumulate;
  o.deferred = deferred;
  if (mask != 0 && mask_size > 0) {
    const auto* m = ptr<const uint8_t>(mask);
    o.gpu_experts_mask.assign(m, m + mask_size);
  }
  return o;
}

// A MoeContext as Python holds it (the type is opaque to the bindings).
struct ContextHandle {
  std::shared_ptr<MoeContext> ctx;
};

// The engine for Python users: a model, its KV cache and the generator; requests submitted and
// stepped from Python (one thread at a time: the Python object holds the GIL between calls).
class PyModel {
 public:
  PyModel(const std::string& path, int threads, int64_t ctx, const std::string& cache_type,
          int max_sequences, const CheckpointOptions& checkpoints,
          const std::vector<std::string>& backend_args) {
    EngineOptions eo;
    eo.model = path;
    eo.threads = threads;
    CLI::App app("tandem.Model backend flags");
    tools::add_backend_options(app, &eo.backend);
    std::vector<std::string> args(backend_args.rbegin(), backend_args.rend());  // (CLI11: reversed)
    try {
      app.parse(args);
    } catch (const CLI::ParseError& e) {
      fail(ErrorKind::kInvalidArgument, "backend flags: {}", e.what());
    }
    engine_ = std::make_unique<Engine>(eo);
    cache_ = std::make_unique<KvCache>(
        engine_->make_cache(ctx, parse_kv_type(cache_type), std::max(1, max_sequences), checkpoints));
    GeneratorOptions go;
    go.max_sequences = max_sequences;
    generator_ = std::make_unique<Generator>(engine_->model(), *cache_, &engine_->tokenizer(), go);
  }

  std::vector<int32_t> encode(const std::string& text, bool add_special) {
    return engine_->tokenizer().encode(text, add_special);
  }
  py::bytes decode(const std::vector<int32_t>& ids) {
    return py::bytes(engine_->tokenizer().decode(ids));
  }
  std::vector<int32_t> chat_prompt(const std::string& messages_json) {
    jinja::Json messages;
    try {
      messages = jinja::Json::parse(messages_json);
    } catch (const std::exception& e) {
      fail(ErrorKind::kInvalidArgument, "messages: {}", e.what());
    }
    return render_chat(chat_template_for(engine_->weights()), engine_->tokenizer(), messages,
                       true);
  }

  RequestId submit(const std::vector<int32_t>& prompt, bool continues_prompt, int64_t max_tokens,
                   float temperature, int top_k, float top_p, float min_p, uint64_t seed,
                   float repeat_penalty, float presence_penalty, float frequency_penalty,
                   const std::vector<std::string>& stop, bool ignore_eos) {
    if (prompt.empty()) fail(ErrorKind::kInvalidArgument, "prompt: empty");
    const int64_t vocab = engine_->config().vocab_size;
    check_token_ids(prompt, vocab, "prompt");
    if (static_cast<int64_t>(prompt.size()) > cache_->max_sequence_positions()) {
      fail(ErrorKind::kOutOfRange, "prompt: {} tokens, more than the context size {}",
           prompt.size(), cache_->max_sequence_positions());
    }
    GenerateParams gp;
    gp.sampling.temperature = temperature;
    gp.sampling.top_k = top_k;
    gp.sampling.top_p = top_p;
    gp.sampling.min_p = min_p;
    gp.sampling.seed = seed;
    gp.sampling.repeat_penalty = repeat_penalty;
    gp.sampling.presence_penalty = presence_penalty;
    gp.sampling.frequency_penalty = frequency_penalty;
    check_sampling_params(gp.sampling, vocab);
    if (max_tokens < -1) fail(ErrorKind::kInvalidArgument, "max_tokens {}: expected >= 0", max_tokens);
    gp.max_tokens = max_tokens;
    gp.stop = stop;
    gp.ignore_eos = ignore_eos;
    gp.continues_prompt = continues_prompt;
    return generator_->submit(prompt, gp);
  }

  // One forward of every running request: (request, text, token, finish reason or "", error).
  std::vector<py::tuple> step() {
    std::vector<GenerateEvent> events;
    {
      py::gil_scoped_release release;
      events = generator_->step();
    }
    std::vector<py::tuple> out;
    for (const GenerateEvent& e : events) {
      const char* finish = e.finish == FinishReason::kNone ? "" : finish_reason_name(e.finish);
      out.push_back(py::make_tuple(e.id, py::bytes(e.text), e.token, finish, e.error));
    }
    return out;
  }
  void cancel(RequestId id) { generator_->cancel(id); }
  bool idle() const { return generator_->idle(); }
  int64_t context_size() const { return cache_->max_sequence_positions(); }
  std::string summary() const { return engine_->summary(); }

 private:
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<Generator> generator_;
};

// tandem::Error as the Python exception its kind calls for (docs/python.md).
void bind_errors(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      switch (e.kind()) {
        case ErrorKind::kInvalidArgument:
        case ErrorKind::kOutOfRange:
        case ErrorKind::kFormat:
          PyErr_SetString(PyExc_ValueError, e.what());
          return;
        case ErrorKind::kUnsupported:
          PyErr_SetString(PyExc_TypeError, e.what());
          return;
        case ErrorKind::kIo:
          PyErr_SetString(PyExc_OSError, e.what());
          return;
        case ErrorKind::kResource:
          PyErr_SetString(PyExc_MemoryError, e.what());
          return;
        default:
          PyErr_SetString(PyExc_RuntimeError, e.what());
          return;
      }
    }
  });
}

// tandem.set_log_level's docstring (the function is public: python/tandem/__init__.py).
constexpr const char* kSetLogLevelDoc = R"doc(Sets how much tandem logs (to stderr).

Args:
    level: "error", "warn", "info", "debug" or "trace" (str).

Returns:
    None. An unknown level raises ValueError.

Example:
    >>> tandem.set_log_level("warn")
)doc";

// The weight formats: log level, row sizes, quantize / dequantize.
void bind_quantization(py::module_& m) {
  m.def(
      "set_log_level",
      [](const std::string& name) {
        LogLevel level;
        if (!parse_log_level(name, &level)) {
          fail(ErrorKind::kInvalidArgument,
               "log level '{}': expected error, warn, info, debug or trace", name);
        }
        set_log_level(level);
      },
      py::arg("level"), kSetLogLevelDoc);
  m.def(
      "dtype_row_bytes",
      [](const std::string& dtype, int64_t cols) {
        const DType t = dtype_of(dtype);
        if (cols % dtype_info(t).block_elems != 0) {
          fail(ErrorKind::kInvalidArgument, "{} values are not a multiple of {}'s block of {}",
               cols, dtype, dtype_info(t).block_elems);
        }
        return dtype_bytes(t, cols);
      },
      py::arg("dtype"), py::arg("cols"));
  m.def(
      "quantize_rows",
      [](uintptr_t src, int64_t rows, int64_t cols, const std::string& dtype, uintptr_t dst) {
        const DType t = dtype_of(dtype);
        if (!can_quantize(t)) fail(ErrorKind::kUnsupported, "cannot quantize to {}", dtype);
        const int64_t rb = dtype_bytes(t, cols);
        py::gil_scoped_release release;
        for (int64_t r = 0; r < rows; ++r) {
          quantize_row(t, ptr<const float>(src) + r * cols, ptr<uint8_t>(dst) + r * rb, cols);
        }
      },
      py::arg("src"), py::arg("rows"), py::arg("cols"), py::arg("dtype"), py::arg("dst"));
  m.def(
      "dequantize_rows",
      [](uintptr_t src, int64_t rows, int64_t cols, const std::string& dtype, uintptr_t dst) {
        const DType t = dtype_of(dtype);
        const int64_t rb = dtype_bytes(t, cols);
        py::gil_scoped_release release;
        for (int64_t r = 0; r < rows; ++r) {
          dequantize_row(t, ptr<const uint8_t>(src) + r * rb, ptr<float>(dst) + r * cols, cols);
        }
      },
      py::arg("src"), py::arg("rows"), py::arg("cols"), py::arg("dtype"), py::arg("dst"));
  m.def(
      "quantize_fp8",
      [](uintptr_t src, int64_t rows, int64_t cols, int64_t br, int64_t bc, uintptr_t w,
         uintptr_t scales) {
        py::gil_scoped_release release;
        quantize_fp8_blocks(ptr<const float>(src), rows, cols, br, bc, ptr<uint8_t>(w),
                            ptr<float>(scales));
      },
      py::arg("src"), py::arg("rows"), py::arg("cols"), py::arg("block_rows"),
      py::arg("block_cols"), py::arg("dst"), py::arg("scales"));
  m.def(
      "dequantize_fp8",
      [](uintptr_t w, uintptr_t scales, int64_t rows, int64_t cols, int64_t br, int64_t bc,
         uintptr_t dst) {
        py::gil_scoped_release release;
        dequantize_fp8_blocks(ptr<const uint8_t>(w), ptr<const float>(scales), rows, cols, br, bc,
                              ptr<float>(dst));
      },
      py::arg("src"), py::arg("scales"), py::arg("rows"), py::arg("cols"), py::arg("block_rows"),
      py::arg("block_cols"), py::arg("dst"));
}

// The thread pools (Context): one per (threads, numa_parts), shared by the layers given it.
void bind_context(py::module_& m) {
  py::class_<ContextHandle>(m, "Context")
      .def(py::init([](int threads, int numa_parts, int spin_us) {
             return ContextHandle{make_moe_context(threads, numa_parts, spin_us)};
           }),
           py::arg("threads") = 0, py::arg("numa_parts") = 1,
           py::arg("spin_us") = kMoeContextSpinUs)
      .def_property_readonly("threads", [](const ContextHandle& c) { return moe_context_threads(*c.ctx); })
      .def_property_readonly("numa_parts",
                             [](const ContextHandle& c) { return moe_context_numa_parts(*c.ctx); });
}

// One weight family of a layer (ExpertTensor), described by keywords (expert_tensor above).
void bind_expert_tensor(py::module_& m) {
  py::class_<ExpertTensor>(m, "ExpertTensor")
      .def(py::init(&expert_tensor), py::arg("data"), py::arg("dtype"), py::arg("experts"),
           py::arg("rows"), py::arg("cols"), py::arg("scales"), py::arg("block_rows"),
           py::arg("block_cols"));
}

// Layer(ctx, sizes, method, group, gpu_experts_mask, chunk_tokens, ...): from gate / up / down
// ExpertTensors, or from a model file's layer.
void bind_layer_init(py::class_<MoeLayer>& layer) {
  layer
      .def(py::init([](const ContextHandle& ctx, int64_t num_experts, int64_t k, int64_t hidden,
                       int64_t inter, const std::string& method, int group,
                       const std::vector<uint8_t>& mask, int64_t chunk, const ExpertTensor& gate,
                       const ExpertTensor& up, const ExpertTensor& down) {
             const MoeLayerOptions o =
                 layer_options(num_experts, k, hidden, inter, method, group, mask, chunk);
             py::gil_scoped_release release;
             return std::make_unique<MoeLayer>(ctx.ctx, o, gate, up, down);
           }),
           py::arg("ctx"), py::arg("num_experts"), py::arg("num_experts_per_tok"),
           py::arg("hidden_size"), py::arg("intermediate_size"), py::arg("method"),
           py::arg("group"), py::arg("gpu_experts_mask"), py::arg("chunk_tokens"),
           py::arg("gate"), py::arg("up"), py::arg("down"))
      .def(py::init([](const ContextHandle& ctx, int64_t num_experts, int64_t k, int64_t hidden,
                       int64_t inter, const std::string& method, int group,
                       const std::vector<uint8_t>& mask, int64_t chunk, const std::string& path,
                       int64_t layer) {
             const MoeLayerOptions o =
                 layer_options(num_experts, k, hidden, inter, method, group, mask, chunk);
             py::gil_scoped_release release;
             return std::make_unique<MoeLayer>(ctx.ctx, o, std::filesystem::path(path), layer);
           }),
           py::arg("ctx"), py::arg("num_experts"), py::arg("num_experts_per_tok"),
           py::arg("hidden_size"), py::arg("intermediate_size"), py::arg("method"),
           py::arg("group"), py::arg("gpu_experts_mask"), py::arg("chunk_tokens"),
           py::arg("path"), py::arg("layer"));
}

// A layer's forward on the calling thread (forward, or begin + end) and its submits on the
// driver thread (submit + sync), or on a CUDA stream's host functions.
void bind_layer_compute(py::class_<MoeLayer>& layer) {
  layer
      .def("forward",
           [](MoeLayer& l, uintptr_t hidden, int64_t tokens, uintptr_t ids, uintptr_t weights,
              int64_t k, uintptr_t out) {
             py::gil_scoped_release release;
             l.forward(ptr<const float>(hidden), tokens, ptr<const int32_t>(ids),
                       ptr<const float>(weights), k, ptr<float>(out));
           },
           py::arg("hidden"), py::arg("tokens"), py::arg("ids"), py::arg("weights"), py::arg("k"),
           py::arg("out"))
      .def("begin",
           [](MoeLayer& l, uintptr_t hidden, int64_t tokens, uintptr_t ids, uintptr_t weights,
              int64_t k) {
             py::gil_scoped_release release;
             l.begin(ptr<const float>(hidden), tokens, ptr<const int32_t>(ids),
                     ptr<const float>(weights), k);
           },
           py::arg("hidden"), py::arg("tokens"), py::arg("ids"), py::arg("weights"), py::arg("k"))
      .def("end",
           [](MoeLayer& l, uintptr_t out) {
             py::gil_scoped_release release;
             l.end(ptr<float>(out));
           },
           py::arg("out"))
      .def("submit",
           [](MoeLayer& l, uintptr_t hidden, int64_t tokens, uintptr_t ids, uintptr_t weights,
              int64_t k, uintptr_t out, bool accumulate, bool deferred, uintptr_t mask,
              int64_t mask_size) {
             l.submit(ptr<const float>(hidden), tokens, ptr<const int32_t>(ids),
                      ptr<const float>(weights), k, ptr<float>(out),
                      submit_options(accumulate, deferred, mask, mask_size));
           },
           py::arg("hidden"), py::arg("tokens"), py::arg("ids"), py::arg("weights"), py::arg("k"),
           py::arg("out"), py::arg("accumulate") = false, py::arg("deferred") = false,
           py::arg("mask") = 0, py::arg("mask_size") = 0)
      .def("sync", [](MoeLayer& l) {
        py::gil_scoped_release release;
        l.sync();
      })
      .def("submit_on_stream",
           [](MoeLayer& l, uintptr_t stream, uintptr_t hidden, int64_t tokens, uintptr_t ids,
              uintptr_t weights, int64_t k, uintptr_t out, bool accumulate, bool deferred,
              uintptr_t mask, int64_t mask_size) {
             enqueue_submit(stream, &l, ptr<const float>(hidden), tokens, ptr<const int32_t>(ids),
                            ptr<const float>(weights), k, ptr<float>(out),
                            submit_options(accumulate, deferred, mask, mask_size));
           },
           py::arg("stream"), py::arg("hidden"), py::arg("tokens"), py::arg("ids"),
           py::arg("weights"), py::arg("k"), py::arg("out"), py::arg("accumulate") = false,
           py::arg("deferred") = false, py::arg("mask") = 0, py::arg("mask_size") = 0)
      .def("sync_on_stream", [](MoeLayer& l, uintptr_t stream) { enqueue_sync(stream, &l); },
           py::arg("stream"));
}

// A layer's expert placement (remap, GPU mask) and what it was built with.
void bind_layer_state(py::class_<MoeLayer>& layer) {
  layer.def_property_readonly("in_flight", &MoeLayer::in_flight)
      .def("remap", &MoeLayer::remap, py::arg("physical_to_logical"))
      .def("set_gpu_experts_mask", &MoeLayer::set_gpu_experts_mask, py::arg("mask"))
      .def_property_readonly("weight_format", &MoeLayer::weight_format)
      .def_property_readonly("swiglu_limit", &MoeLayer::swiglu_limit)
      .def_property_readonly("weight_bytes", &MoeLayer::weight_bytes)
      .def_property_readonly("num_experts",
                             [](const MoeLayer& l) { return l.options().num_experts; })
      .def_property_readonly("num_experts_per_tok",
                             [](const MoeLayer& l) { return l.options().num_experts_per_tok; })
      .def_property_readonly("hidden_size",
                             [](const MoeLayer& l) { return l.options().hidden_size; })
      .def_property_readonly("intermediate_size",
                             [](const MoeLayer& l) { return l.options().intermediate_size; });
}

// The MoE operator: its thread pools (Context) and layers (Layer), and their CUDA-stream hooks.
void bind_operator(py::module_& m) {
  bind_context(m);
  bind_expert_tensor(m);
  py::class_<MoeLayer> layer(m, "Layer");
  bind_layer_init(layer);
  bind_layer_compute(layer);
  bind_layer_state(layer);
  m.attr("cuda_streams") = py::bool_(stream_hooks_built());
  m.attr("swiglu_oai_alpha") = py::float_(ops::kSwigluOaiAlpha);
}

// The engine: a loaded model generating (Model).
void bind_engine(py::module_& m) {
  py::class_<PyModel>(m, "Model")
      .def(py::init([](const std::string& path, int threads, int64_t ctx,
                       const std::string& cache_type, int max_sequences, int64_t checkpoints,
                       int64_t checkpoint_every, const std::vector<std::string>& args) {
             py::gil_scoped_release release;
             return std::make_unique<PyModel>(path, threads, ctx, cache_type, max_sequences,
                                              CheckpointOptions{checkpoints, checkpoint_every},
                                              args);
           }),
           py::arg("path"), py::arg("threads"), py::arg("ctx"), py::arg("cache_type"),
           py::arg("max_sequences"), py::arg("checkpoints"), py::arg("checkpoint_every"),
           py::arg("backend_args"))
      .def("encode", &PyModel::encode, py::arg("text"), py::arg("add_special"))
      .def("decode", &PyModel::decode, py::arg("ids"))
      .def("chat_prompt", &PyModel::chat_prompt, py::arg("messages_json"))
      .def("submit", &PyModel::submit, py::arg("prompt"), py::arg("continues_prompt"),
           py::arg("max_tokens"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"),
           py::arg("min_p"), py::arg("seed"), py::arg("repeat_penalty"),
           py::arg("presence_penalty"), py::arg("frequency_penalty"), py::arg("stop"),
           py::arg("ignore_eos"))
      .def("step", &PyModel::step)
      .def("cancel", &PyModel::cancel, py::arg("request"))
      .def("idle", &PyModel::idle)
      .def_property_readonly("context_size", &PyModel::context_size)
      .def_property_readonly("summary", &PyModel::summary);
}

}  // namespace
}  // namespace tandem

PYBIND11_MODULE(_tandem, m) {
  m.doc() = "tandem's native module: the CPU MoE operator and the engine (see tandem/__init__.py)";
  tandem::bind_errors(m);
  tandem::bind_quantization(m);
  tandem::bind_operator(m);
  tandem::bind_engine(m);
}
