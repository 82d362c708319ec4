// The _p3 extension: thin pybind11 glue over the core. It releases the GIL around every call that can
// block, turns Status into p3kv.errors exceptions, and takes arrays through the buffer protocol (the
// Python layer keeps them alive while the core uses them: until the operation's Ticket says released).
#include <Python.h>
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include "emulated_compute.h"
#include "engine_bridge.h"
#include "optimizer_bindings.h"
#include "p3/log.h"
#include "p3/scheduler.h"
#include "p3/server.h"
#include "p3/slice_optimizer.h"
#include "p3/worker.h"

namespace py = pybind11;
using p3::Status;

namespace {

[[noreturn]] void Raise(const Status& st) {
  const char* cls = "P3Error";
  switch (st.code()) {
    case Status::Code::kTimeout: cls = "P3TimeoutError"; break;
    case Status::Code::kInvalid: cls = "ConfigError"; break;
    case Status::Code::kUnsupported: cls = "UnsupportedRequest"; break;
    default: break;
  }
  py::object type = py::module_::import("p3kv.core.errors").attr(cls);
  PyErr_SetString(type.ptr(), st.message().c_str());
  throw py::error_already_set();
}

void Check(const Status& st) {
  if (!st.ok()) Raise(st);
}

// Lets Ctrl-C end a long wait: the core polls this with the GIL released.
p3::InterruptCheck SignalCheck() {
  return [] {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) {
      PyErr_Clear();  // re-raised below as KeyboardInterrupt by the wrapper's caller
      return true;
    }
    return false;
  };
}

void CheckInterruptible(const Status& st) {
  if (st.code() == Status::Code::kInterrupted) {
    PyErr_SetNone(PyExc_KeyboardInterrupt);
    throw py::error_already_set();
  }
  Check(st);
}

// Runs `fn`, a call into the core that may block, with the GIL released so that other Python threads (and
// the callbacks the core runs on its own threads) can take it meanwhile; returns what `fn` returns.
template <typename Fn>
auto WithoutGil(Fn&& fn) -> decltype(fn()) {
  py::gil_scoped_release nogil;
  return fn();
}

struct Buffer {
  void* ptr;
  uint64_t count;
};

// One worker operation's hold on the caller's arrays: `released` once the core completed the operation and
// nothing (no receiver, no queued frame) can touch the arrays any more. Set on a core thread without the GIL;
// Python keeps the arrays referenced until then, also when its wait gave up (timeout, Ctrl-C).
struct Ticket {
  std::atomic<bool> released{false};
  p3::Callback Done(const std::shared_ptr<Ticket>& self) {
    return [self](const Status&) { self->released.store(true); };
  }
};

Buffer GetBuffer(const py::buffer& b, const std::string& what, p3::DType dtype, bool writable) {
  py::buffer_info info = b.request(writable);
  if (info.itemsize != static_cast<py::ssize_t>(p3::DTypeSize(dtype))) {
    Raise(Status::Invalid(what + " has " + std::to_string(info.itemsize) + "-byte elements, expected " +
                          p3::DTypeName(dtype)));
  }
  py::ssize_t expected = info.itemsize;
  for (py::ssize_t i = info.ndim - 1; i >= 0; --i) {
    if (info.shape[i] != 1 && info.strides[i] != expected) Raise(Status::Invalid(what + " is not C-contiguous"));
    expected *= info.shape[i];
  }
  return Buffer{info.ptr, static_cast<uint64_t>(info.size)};
}

p3::DType ToDType(const std::string& name) {
  p3::DType t;
  if (!p3::ParseDType(name, &t)) {
    Raise(Status::Invalid("dtype " + name + " is not supported (use float32, float64, float16, bfloat16, int32, "
                          "int64 or uint8)"));
  }
  return t;
}

py::dict CountersToDict(const p3::Counters& c) {
  py::dict sent, received;
  for (int i = 1; i < p3::kNumCommands; ++i) {
    const char* name = p3::CommandName(static_cast<p3::Command>(i));
    sent[name] = c.sent[i].load();
    received[name] = c.received[i].load();
  }
  py::dict d;
  d["sent"] = sent;
  d["received"] = received;
  d["bytes_sent"] = c.bytes_sent.load();
  d["bytes_received"] = c.bytes_received.load();
  d["rejected_frames"] = c.rejected_frames.load();
  return d;
}

py::list TraceToList(const p3::Trace& t) {
  py::list out;
  for (const p3::TraceRecord& r : t.Snapshot()) {
    out.append(py::make_tuple(r.time_ns, p3::TraceEventName(r.event), r.key, r.slice, r.priority, r.iteration,
                              r.peer));
  }
  return out;
}

// Numpy view of core memory without copying; valid only during the call it is passed to.
py::array View(p3::DType dtype, const void* ptr, uint64_t count, bool writable) {
  py::dtype dt(std::string(p3::DTypeName(dtype)));
  py::capsule no_owner(ptr, [](void*) {});
  py::array a(dt, {static_cast<py::ssize_t>(count)}, {}, ptr, no_owner);
  if (!writable) a.attr("flags").attr("writeable") = false;
  return a;
}

// A Python exception as a one-line status for the peer ("ValueError: ..."); the traceback goes to this node's log.
Status PyErrorStatus(const py::error_already_set& e, const char* where) {
  p3::Log(p3::LogLevel::kWarning, where, e.what());
  std::string text = py::str(e.type().attr("__name__")).cast<std::string>();
  const std::string message = py::str(e.value()).cast<std::string>();
  if (!message.empty()) text += ": " + message;
  return Status::Rejected(text);
}

// A Python callable owned by C++: its last reference may be dropped on a core thread, so take the GIL.
struct PyCallable {
  explicit PyCallable(py::object f) : fn(std::move(f)) {}
  ~PyCallable() {
    py::gil_scoped_acquire gil;
    fn = py::object();
  }
  py::object fn;
};

// What Python calls EngineBridge: the bridge, plus the benchmark-only emulated compute on the same engine
// (created on first use: it owns a timer thread) with the dispatch slack set before that use.
struct PyEngineBridge {
  std::unique_ptr<p3::EngineBridge> bridge;
  std::unique_ptr<p3::EmulatedCompute> emulated;
  p3::VirtualStream::Clock::duration slack = p3::DeviceClock::kDefaultSlack;

  p3::EmulatedCompute& Emulated() {
    if (!emulated) emulated = std::make_unique<p3::EmulatedCompute>(bridge->api(), slack);
    return *emulated;
  }
};

double Microseconds(p3::VirtualStream::Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

// A per-slice Python update function `fn(key, slice, offset, iteration, aggregated, value)`. With `exact_sum`,
// `aggregated` of a float16 slice is the servers' float32 sum of the workers' gradients, unrounded (what MXNet's
// dist_sync server updates its float32 copy of the weights from under multi_precision); otherwise the sum in the
// slice's dtype.
p3::Updater PyUpdater(py::object f, bool exact_sum = false) {
  auto callable = std::make_shared<PyCallable>(std::move(f));
  return [callable, exact_sum](const p3::UpdateRequest& r) -> Status {
    py::gil_scoped_acquire gil;  // the consumer thread takes the GIL only for the update itself
    const bool wide = exact_sum && r.sum != nullptr && p3::AccumulatorType(r.dtype) != r.dtype;
    try {
      callable->fn(r.key, r.slice, r.offset, r.iteration,
                   wide ? View(p3::AccumulatorType(r.dtype), r.sum, r.count, false)
                        : View(r.dtype, p3::Aggregated(r), r.count, false),
                   View(r.dtype, r.value, r.count, true));
    } catch (py::error_already_set& e) {
      return PyErrorStatus(e, "update function");
    }
    return Status::Ok();
  };
}

}  // namespace

PYBIND11_MODULE(_p3, m) {
  m.doc() = "p3kv core: priority-based parameter propagation transport (C++)";
  p3py::BindOptimizer(m);

  m.def("set_log_level", [](int level) { p3::SetLogLevel(static_cast<p3::LogLevel>(level)); },
        "0=DEBUG 1=INFO 2=WARNING 3=ERROR");
  m.def("slice_key", [](uint64_t count, uint64_t slice_size, int num_servers, uint64_t round_robin) {
    std::vector<py::tuple> out;
    for (const p3::Slice& s : p3::SliceKey(count, slice_size, num_servers, &round_robin)) {
      out.push_back(py::make_tuple(s.index, s.offset, s.count, s.server));
    }
    return py::make_tuple(out, round_robin);
  }, "Pure slicing function: ([(index, offset, count, server)], next_round_robin)");

  py::class_<p3::NodeConfig>(m, "NodeConfig")
      .def(py::init<>())
      .def_readwrite("root_uri", &p3::NodeConfig::root_uri)
      .def_readwrite("root_port", &p3::NodeConfig::root_port)
      .def_readwrite("num_worker", &p3::NodeConfig::num_worker)
      .def_readwrite("num_server", &p3::NodeConfig::num_server)
      .def_readwrite("host", &p3::NodeConfig::host)
      .def_readwrite("port", &p3::NodeConfig::port)
      .def_readwrite("slice_size", &p3::NodeConfig::slice_size)
      .def_readwrite("socket_buffer", &p3::NodeConfig::socket_buffer)
      .def_readwrite("priority_hold", &p3::NodeConfig::priority_hold)
      .def_readwrite("connect_timeout", &p3::NodeConfig::connect_timeout)
      .def_readwrite("timeout", &p3::NodeConfig::timeout)
      .def_readwrite("max_message_bytes", &p3::NodeConfig::max_message_bytes)
      .def_readwrite("server_queue_bytes", &p3::NodeConfig::server_queue_bytes)
      .def_readwrite("server_slice_bytes", &p3::NodeConfig::server_slice_bytes)
      .def_readwrite("trace", &p3::NodeConfig::trace)
      .def_readwrite("secret", &p3::NodeConfig::secret)
      .def_readwrite("heartbeat_interval", &p3::NodeConfig::heartbeat_interval)
      .def_readwrite("heartbeat_timeout", &p3::NodeConfig::heartbeat_timeout)
      .def_readwrite("rank", &p3::NodeConfig::rank);

  py::class_<p3::Scheduler>(m, "Scheduler")
      .def(py::init(&p3::Scheduler::Create))
      .def("bind", [](p3::Scheduler& s) { Check(s.Bind()); })
      .def("run", [](p3::Scheduler& s) {
        CheckInterruptible(WithoutGil([&] { return s.Run(SignalCheck()); }));
      })
      .def("stop", &p3::Scheduler::Stop)
      .def_property_readonly("port", &p3::Scheduler::port);

  py::class_<p3::SliceOptimizer, std::shared_ptr<p3::SliceOptimizer>>(m, "SliceOptimizer",
      "A server's MXNet optimizer per slice (kernels in C++); pass it to Server as the updater. Consumer thread "
      "only: call its methods from the server's request handler.")
      .def(py::init<>())
      .def("use_kernel", [](p3::SliceOptimizer& o, const py::dict& spec, py::object step, bool keep_states) {
        const p3::OptimizerSpec parsed = p3py::SpecFromDict(spec);
        auto callable = std::make_shared<PyCallable>(std::move(step));
        const auto carry = keep_states ? p3::SliceOptimizer::StateCarry::kKeep : p3::SliceOptimizer::StateCarry::kDrop;
        Check(o.UseKernel(parsed, [callable](uint64_t key, p3::StepParams* out) -> Status {
          py::gil_scoped_acquire gil;  // once per key and iteration, never per slice
          try {
            *out = p3py::StepFromTuple(callable->fn(key).cast<py::tuple>());
          } catch (py::error_already_set& e) {
            return PyErrorStatus(e, "optimizer step");
          } catch (py::cast_error& e) {
            return Status::Rejected(std::string("the step function must return a tuple: ") + e.what());
          }
          return Status::Ok();
        }, carry));
      }, py::arg("spec"), py::arg("step"), py::arg("keep_states") = false,
         "Kernel from now on: spec dict (see optimizer_bindings.h), step(key) -> (lr, wd, rescale_grad, ...). "
         "keep_states: every slice keeps its states; otherwise they are dropped (as MXNet's dist_sync does on a "
         "new optimizer), except the float32 copy of float16 weights. ValueError while a key is partly updated.")
      .def("use_function", [](p3::SliceOptimizer& o, py::object fn, bool exact_sum) {
             Check(o.UseFunction(PyUpdater(std::move(fn), exact_sum)));
           }, py::arg("fn"), py::arg("exact_sum") = false,
           "Per-slice Python update function from now on (no kernel). exact_sum: float16 slices get the float32 "
           "sum of the workers' gradients (multi_precision), not the sum rounded to float16")
      .def("clear", [](p3::SliceOptimizer& o) { Check(o.Clear()); })
      .def("set_kernel_keys", &p3::SliceOptimizer::SetKernelKeys, py::arg("keys"),
           "With a kernel: only these keys are updated by it, the others aggregated only (until the next "
           "use_kernel/use_function/clear)")
      .def_property_readonly("has_kernel", &p3::SliceOptimizer::has_kernel)
      .def_property_readonly("step_calls", &p3::SliceOptimizer::step_calls)
      .def("slices", &p3::SliceOptimizer::Slices)
      .def("states", [](const p3::SliceOptimizer& o, uint64_t key, uint32_t slice) -> py::object {
        const p3::SliceOptimizer::States* s = o.StatesOf(key, slice);
        if (s == nullptr) return py::none();
        py::list arrays;
        py::dtype dt(std::string(p3::DTypeName(s->dtype)));
        for (const auto& a : s->arrays) {
          py::array copy(dt, std::vector<py::ssize_t>{static_cast<py::ssize_t>(s->count)});
          std::memcpy(copy.mutable_data(), a.data(), a.size());
          arrays.append(copy);
        }
        return py::make_tuple(p3::DTypeName(s->weight), arrays);
      }, "(weight dtype, copies of one slice's state arrays), or None")
      .def("set_states", [](p3::SliceOptimizer& o, uint64_t key, uint32_t slice, const std::string& weight_dtype,
                            const std::string& dtype, const std::vector<py::buffer>& arrays) {
        p3::SliceOptimizer::States s;
        s.weight = ToDType(weight_dtype);
        s.dtype = ToDType(dtype);
        for (const py::buffer& b : arrays) {
          Buffer buf = GetBuffer(b, "an optimizer state", s.dtype, false);
          if (!s.arrays.empty() && buf.count != s.count) Raise(Status::Invalid("optimizer states differ in size"));
          s.count = buf.count;
          const char* p = static_cast<const char*>(buf.ptr);
          s.arrays.emplace_back(p, p + buf.count * p3::DTypeSize(s.dtype));
        }
        o.SetStates(key, slice, std::move(s));
      });

  py::class_<p3::Server>(m, "Server")
      .def(py::init([](p3::NodeConfig config, py::object updater, py::object on_request) {
        p3::Updater fn;
        if (py::isinstance<p3::SliceOptimizer>(updater)) {
          auto native = updater.cast<std::shared_ptr<p3::SliceOptimizer>>();
          fn = [native](const p3::UpdateRequest& r) { return native->Update(r); };
        } else if (!updater.is_none()) {
          fn = PyUpdater(updater);
        }
        p3::RequestHandler handler;
        if (!on_request.is_none()) {
          auto callable = std::make_shared<PyCallable>(on_request);
          handler = [callable](uint32_t type, const std::string& body, std::string* reply) -> Status {
            py::gil_scoped_acquire gil;
            try {
              *reply = callable->fn(type, py::bytes(body)).cast<std::string>();
            } catch (py::error_already_set& e) {
              // A handler that takes no request of this kind says so as a server without a handler does: the
              // worker raises UnsupportedRequest (p3kv.mxnet.kvstore then names the server command to use).
              if (e.matches(py::module_::import("p3kv.core.errors").attr("UnsupportedRequest"))) {
                return Status::Unsupported(py::str(e.value()).cast<std::string>());
              }
              return PyErrorStatus(e, "request handler");
            } catch (py::cast_error& e) {
              return Status::Rejected(std::string("the request handler must return bytes: ") + e.what());
            }
            return Status::Ok();
          };
        }
        return p3::Server::Create(std::move(config), std::move(fn), std::move(handler));
      }), py::arg("config"), py::arg("updater") = py::none(), py::arg("on_request") = py::none())
      .def("start", [](p3::Server& s) {
        Check(WithoutGil([&] { return s.Start(); }));
      })
      .def("run", [](p3::Server& s) {
        CheckInterruptible(WithoutGil([&] { return s.Run(SignalCheck()); }));
      })
      .def("stop", &p3::Server::Stop)
      .def("enable_updater", &p3::Server::EnableUpdater)
      .def_property_readonly("rank", &p3::Server::rank)
      .def_property_readonly("port", &p3::Server::port)
      .def("counters", [](const p3::Server& s) { return CountersToDict(s.counters()); })
      .def("buffer_stats", [](const p3::Server& s) {
        py::dict d;
        d["reused"] = s.buffers_reused();
        d["allocated"] = s.buffers_allocated();
        d["value_copies"] = s.value_copies();
        return d;
      }, "Receive buffers reused from the pool / allocated, and updates that copied a value being broadcast")
      .def("trace", [](const p3::Server& s) { return TraceToList(s.trace()); })
      .def("trace_dropped", [](const p3::Server& s) { return s.trace().dropped(); },
           "Trace records overwritten because the trace's ring was full (the oldest go first)");

  py::class_<PyEngineBridge>(m, "EngineBridge")
      .def_static("load", [](const std::string& libmxnet_path) {
        auto b = std::make_unique<PyEngineBridge>();
        Check(p3::EngineBridge::Load(libmxnet_path, &b->bridge));
        return b;
      }, "Binds to the libmxnet.so that `import mxnet` loaded")
      .def("push_pull", [](PyEngineBridge& b, p3::Worker& w, uint64_t key, uintptr_t grad, uintptr_t out,
                           int32_t priority) {
        Check(WithoutGil([&] {
          return b.bridge->PushPull(&w, key, reinterpret_cast<void*>(grad), reinterpret_cast<void*>(out), priority);
        }));
      }, "Engine-asynchronous push of NDArray `grad` (handle) whose broadcast lands in NDArray `out`")
      .def("emulate_compute", [](PyEngineBridge& b, const std::vector<uintptr_t>& reads,
                                 const std::vector<uintptr_t>& writes, double seconds, bool chained,
                                 const std::vector<uintptr_t>& external, uintptr_t arrival) {
        std::vector<void*> r, w, e;
        for (uintptr_t h : reads) r.push_back(reinterpret_cast<void*>(h));
        for (uintptr_t h : writes) w.push_back(reinterpret_cast<void*>(h));
        for (uintptr_t h : external) e.push_back(reinterpret_cast<void*>(h));
        p3::EmulatedCompute& emulated = b.Emulated();
        Check(WithoutGil([&] { return emulated.Run(r, w, seconds, chained, e, reinterpret_cast<void*>(arrival)); }));
      }, py::arg("reads"), py::arg("writes"), py::arg("seconds"), py::arg("chained") = false,
         py::arg("external") = std::vector<uintptr_t>{}, py::arg("arrival") = 0,
         "Engine operation that reads/writes the NDArrays (handles) and takes `seconds` on the virtual device; "
         "`chained`: all it waits for comes from the virtual device or is listed in `external` (arrays written "
         "off the device, whose arrival the array `arrival` records): it starts where the work before it "
         "ended, or when those arrived (cpp/mxnet/emulated_compute.h)")
      .def("set_emulation_slack", [](PyEngineBridge& b, double microseconds) {
        if (!(microseconds >= 0) || microseconds > 1e6) Raise(Status::Invalid("the slack must be 0..1e6 us"));
        const auto slack = std::chrono::duration_cast<p3::VirtualStream::Clock::duration>(
            std::chrono::duration<double, std::micro>(microseconds));
        if (b.emulated && b.emulated->stream().slack() != slack) {
          Raise(Status::Invalid("the virtual device already runs: set its slack before the first emulate_compute"));
        }
        b.slack = slack;
      }, "The virtual device's dispatch slack in microseconds (cpp/src/device_clock.h); before the first use")
      .def("emulation_timer_tid", [](PyEngineBridge& b) { return b.Emulated().stream().timer_tid(); },
           "The Linux thread id of the virtual device's timer thread (it stands for the GPU)")
      .def("emulation_stats", [](PyEngineBridge& b, bool reset) {
        p3::VirtualStream& stream = b.Emulated().stream();
        const p3::DeviceClock::Stats st = stream.stats();
        if (reset) stream.ResetStats();
        py::dict d;
        d["slack_us"] = Microseconds(stream.slack());
        d["forgiven_us"] = Microseconds(st.forgiven);
        d["forgiven_gaps"] = st.forgiven_gaps;
        d["idle_us"] = Microseconds(st.idle);
        d["idle_gaps"] = st.idle_gaps;
        d["started"] = st.started;
        d["completed"] = st.completed;
        d["late_max_us"] = Microseconds(st.late_max);
        d["wake_late_max_us"] = Microseconds(st.wake_late_max);
        d["wake_late_total_us"] = Microseconds(st.wake_late_total);
        d["callback_max_us"] = Microseconds(st.callback_max);
        d["dispatch_absorbed_us"] = Microseconds(st.dispatch_absorbed);
        d["dispatch_max_us"] = Microseconds(st.dispatch_max);
        return d;
      }, py::arg("reset") = false,
         "The virtual device's accounting since its start or the last reset: gaps forgiven by the slack, idle "
         "gaps, items, the latest completion past its due time (us); `reset` starts a new count");

  py::class_<Ticket, std::shared_ptr<Ticket>>(m, "Ticket",
      "What init/push return: whether the core has released the operation's arrays")
      .def_property_readonly("released", [](const Ticket& t) { return t.released.load(); });

  py::class_<p3::Worker>(m, "Worker")
      .def(py::init(&p3::Worker::Create))
      .def("start", [](p3::Worker& w) {
        Check(WithoutGil([&] { return w.Start(); }));
      })
      .def("init", [](p3::Worker& w, uint64_t key, const std::string& name, const std::string& dtype,
                      py::buffer value, py::buffer out) {
        const p3::DType t = ToDType(dtype);
        Buffer v = GetBuffer(value, "the value of key '" + name + "'", t, false);
        Buffer o = GetBuffer(out, "the output of key '" + name + "'", t, true);
        if (v.count != o.count) Raise(Status::Invalid("value and output of key '" + name + "' differ in size"));
        auto ticket = std::make_shared<Ticket>();
        Check(WithoutGil([&] { return w.Init(key, name, t, v.count, v.ptr, o.ptr, ticket->Done(ticket)); }));
        return ticket;
      })
      .def("push", [](p3::Worker& w, uint64_t key, const std::string& dtype, py::buffer grad, py::buffer out,
                      int32_t priority) {
        const p3::DType t = ToDType(dtype);
        Buffer g = GetBuffer(grad, "the gradient", t, false);
        Buffer o = GetBuffer(out, "the output", t, true);
        auto ticket = std::make_shared<Ticket>();
        Check(WithoutGil([&] { return w.Push(key, g.ptr, o.ptr, priority, ticket->Done(ticket)); }));
        return ticket;
      })
      .def("wait", [](p3::Worker& w, uint64_t key, double timeout) {
        CheckInterruptible(WithoutGil([&] { return w.Wait(key, timeout, SignalCheck()); }));
      })
      .def("wait_all", [](p3::Worker& w, double timeout) {
        CheckInterruptible(WithoutGil([&] { return w.WaitAll(timeout, SignalCheck()); }));
      })
      .def("barrier", [](p3::Worker& w, double timeout) {
        Check(WithoutGil([&] { return w.Barrier(timeout); }));
      })
      .def("request", [](p3::Worker& w, int server, uint32_t type, const std::string& body, double timeout) {
        std::string reply;
        Check(WithoutGil([&] { return w.Request(server, type, body, &reply, timeout); }));
        return py::bytes(reply);
      })
      .def("close", [](p3::Worker& w, double timeout) {
        Check(WithoutGil([&] { return w.Close(timeout); }));
      })
      .def_property_readonly("rank", &p3::Worker::rank)
      .def_property_readonly("num_workers", &p3::Worker::num_workers)
      .def_property_readonly("num_servers", &p3::Worker::num_servers)
      .def("slices", [](const p3::Worker& w, uint64_t key) {
        std::vector<py::tuple> out;
        for (const p3::Slice& s : w.Slices(key)) out.push_back(py::make_tuple(s.index, s.offset, s.count, s.server));
        return out;
      })
      .def("counters", [](const p3::Worker& w) { return CountersToDict(w.counters()); })
      .def("trace", [](const p3::Worker& w) { return TraceToList(w.trace()); })
      .def("trace_dropped", [](const p3::Worker& w) { return w.trace().dropped(); },
           "Trace records overwritten because the trace's ring was full (the oldest go first)");
}
