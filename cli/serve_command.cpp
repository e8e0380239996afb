// `cubevec serve`: the models loaded once and served over HTTP until SIGTERM / SIGINT (server/).
//
//   cubevec serve --model assets/tinyflux [--model wan=assets/tinywan] [--instances 2] [--port 8080]
//   mpirun -np 2 cubevec serve --model assets/tinyflux --ulysses 2   (rank 0 serves, every rank runs)
//
// Binds loopback unless --host says otherwise. A stop signal stops new requests (503), lets the
// running and queued ones finish within --drain-timeout, cancels what is left, and exits 0; a
// second signal ends the process at once.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/interrupt.h"
#include "device/trace.h"
#include "cli/command.h"
#include "cli/device_flags.h"
#include "cli/generation_flags.h"
#include "cli/output_flag.h"
#include "cli/parallel_flags.h"
#include "cli/range_flag.h"
#include "pipelines/memory_estimate.h"
#include "pipelines/pipeline.h"
#include "server/http_server.h"
#include "server/rank_relay.h"
#include "server/scheduler.h"

namespace cubevec::cli {

namespace {

struct ServeFlags {
  std::vector<std::string> models;
  std::string host = "127.0.0.1";
  int port = 8080;
  server::SchedulerOptions scheduler;
  server::ServeLimits limits;
  std::string max_body = "32M";
  double drain_timeout_s = 30;
  std::string dtype = "f32", variant, quant, quant_2, timestep_policy, memory_limit, packed_cache, trace_path;
  std::vector<std::string> lora;  // fused into every served model's transformer
  bool lora_ignore_unmatched = false;
  std::string lora_mode;        // fused | runtime (empty: fused, runtime with --quant)
  std::string lora_dir;         // the folder requests' "lora" files are named in (none: requests may not name LoRAs)
  bool lora_dir_given = false;  // --lora-dir given (an empty one is an error, not "none")
  int offload = 0;
  bool check_weights = false;
};

// "NAME=DIR" or "DIR" (named after the folder).
std::pair<std::string, std::string> model_name_and_dir(const std::string& spec) {
  std::string name, dir = spec;
  if (const std::size_t eq = spec.find('='); eq != std::string::npos) name = spec.substr(0, eq), dir = spec.substr(eq + 1);
  if (dir.empty()) throw Error("--model " + spec + ": expected DIR or NAME=DIR");
  if (name.empty()) {
    std::filesystem::path path(dir);
    while (!path.empty() && path.filename().empty()) path = path.parent_path();  // "a/b/" names b
    name = path.filename().string();
  }
  if (name.empty() || name.size() > 64 ||
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != std::string::npos)
    throw Error("--model " + spec + ": the model's name '" + name + "' must be 1..64 letters, digits, '.', '_' or '-' (give NAME=DIR)");
  return {name, dir};
}

// --trace: every instance's kernels as a Chrome trace, and on stderr the overlap they show (the Cube
// and Vector units busy at once, and the instances' kernels running at once) over the busy span.
void write_serve_trace(const std::string& path, const std::vector<TraceSection>& sections) {
  write_chrome_trace(path, sections);
  Intervals cube, vector, all;
  double each_instance_busy = 0, first = 1e300, last = 0;
  for (const TraceSection& section : sections) {
    Intervals instance;
    for (const KernelRecord& r : section.records) {
      if (!r.ran || r.desc.unit == Unit::comm) continue;
      (r.desc.unit == Unit::cube ? cube : vector).emplace_back(r.real_start_s, r.real_end_s);
      instance.emplace_back(r.real_start_s, r.real_end_s);
      all.emplace_back(r.real_start_s, r.real_end_s);
      first = std::min(first, r.real_start_s), last = std::max(last, r.real_end_s);
    }
    each_instance_busy += busy_time(std::move(instance));
  }
  const double span = last > first ? last - first : 0, all_busy = busy_time(all);
  const auto share = [&](double seconds) { return span > 0 ? 100 * seconds / span : 0.0; };
  std::fprintf(stderr,
               "serve: trace written to %s (%zu instance(s), %.2f s from the first kernel to the last): Cube busy %.1f%%, Vector busy "
               "%.1f%%, Cube and Vector at once %.1f%%, kernels of two or more instances at once %.1f%%\n",
               path.c_str(), sections.size(), span, share(busy_time(cube)), share(busy_time(vector)), share(overlap_time(cube, vector)),
               share(each_instance_busy - all_busy));
}

int run(const ServeFlags& f, const DeviceFlags& device_flags, const ParallelFlags& parallel_flags) {
  if (f.models.empty()) throw Error("--model DIR is required (a diffusers Flux or Wan folder; repeat it to serve several)");
  server::ServeLimits limits = f.limits;
  limits.max_body_bytes = pipelines::parse_memory_size(f.max_body, "--max-body");
  if (limits.max_body_bytes < 1024) throw Error("--max-body must be at least 1K, got " + f.max_body);
  pipelines::LoadOptions load;
  if (f.dtype != "f32" && f.dtype != "bf16") throw Error("--dtype must be f32 or bf16, got " + f.dtype);
  load.dtype = f.dtype == "bf16" ? DType::bf16 : DType::f32;
  load.variant = f.variant;
  load.quant = f.quant;
  load.quant_2 = f.quant_2;
  load.timestep_policy = f.timestep_policy;
  load.offload = f.offload;
  load.memory_limit = f.memory_limit;
  load.check_weights = f.check_weights;
  load.packed_cache = f.packed_cache;
  load.lora = f.lora;
  load.lora_ignore_unmatched = f.lora_ignore_unmatched;
  load.lora_mode = f.lora_mode;
  if (f.lora_dir_given) {
    if (f.lora_dir.empty() || !std::filesystem::is_directory(f.lora_dir)) throw Error("--lora-dir '" + f.lora_dir + "': not a folder");
    limits.lora_dir = f.lora_dir;
  }
  load.profile = device_flags.resolve();
  // Under mpirun: every rank loads the model sharded by the degrees; rank 0 serves.
  load.groups = parallel_flags.resolve_generation(
      false, parallel_flags.degrees.cfg == 2 ? pipelines::CfgMode::fused : pipelines::CfgMode::off, load.cfg_parallel);
  load.vae_parallel = parallel_flags.vae_group(*load.groups, false);
  const int ranks = load.groups->world.size(), rank = load.groups->world.rank();
  if (ranks > 1 && (f.models.size() != 1 || f.scheduler.instances != 1))
    throw Error("under mpirun, serve runs one --model with --instances 1 (every rank runs each request together)");

  std::vector<server::ServedModel> models;
  std::set<std::string> names;
  for (const std::string& spec : f.models) {
    auto [name, dir] = model_name_and_dir(spec);
    if (!names.insert(name).second) throw Error("--model " + spec + ": a model named '" + name + "' is given twice (name one NAME=DIR)");
    if (rank == 0) std::fprintf(stderr, "serve: loading %s from %s\n", name.c_str(), dir.c_str());
    auto pipeline = pipelines::Pipeline::load(dir, load);
    if (rank == 0)
      std::fprintf(stderr, "serve: %s (%s) loaded in %.2f s%s\n", name.c_str(), pipeline->model().task().c_str(), pipeline->load_seconds(),
                   ranks > 1 ? (" on " + std::to_string(ranks) + " ranks").c_str() : "");
    if (rank == 0 && pipeline->packed_cache()) print_packed_cache("serve", *pipeline->packed_cache());
    models.push_back({name, dir, std::move(pipeline)});
  }

  // From here a stop signal drains instead of stopping the kernels in flight.
  serve_signals_by_draining();
  std::optional<server::RankRelay> relay;
  server::SchedulerOptions scheduler_options = f.scheduler;
  scheduler_options.trace = !f.trace_path.empty();
  if (ranks > 1) {
    relay.emplace(load.groups->world);
    if (rank != 0) return server::follow_rank_zero(*models.front().pipeline, *relay);
    scheduler_options.relay = &*relay;
  }
  server::Scheduler scheduler(std::move(models), scheduler_options);
  server::HttpServer http(scheduler, limits);
  const int port = http.bind(f.host, f.port);
  if (!server::is_loopback(f.host))
    std::fprintf(stderr, "serve: warning: listening on %s, not loopback: anyone who can reach this machine can use the server\n",
                 f.host.c_str());
  std::fprintf(stderr, "serve: listening on http://%s:%d (pid %d, %d instance(s) per model, queue %d%s)\n",
               f.host.find(':') != std::string::npos ? ("[" + f.host + "]").c_str() : f.host.c_str(), port, static_cast<int>(::getpid()),
               f.scheduler.instances, f.scheduler.max_queue,
               ranks > 1 ? (", every request on " + std::to_string(ranks) + " ranks").c_str() : "");
  std::fflush(stderr);
  std::thread listener([&] { http.run(); });

  while (!stop_signal()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  scheduler.stop_accepting();
  std::fprintf(stderr, "serve: stop signal: no new requests; finishing the running ones (--drain-timeout %g s)\n", f.drain_timeout_s);
  const auto drain_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(f.drain_timeout_s * 1000));
  if (!scheduler.wait_idle(drain_end)) {
    std::fprintf(stderr, "serve: --drain-timeout passed: cancelling what is left\n");
    scheduler.cancel_all();
    scheduler.wait_idle(std::chrono::steady_clock::now() + std::chrono::seconds(60));
  }
  http.stop();
  listener.join();
  scheduler.shutdown();
  if (!f.trace_path.empty()) write_serve_trace(f.trace_path, scheduler.trace_sections());
  std::fprintf(stderr, "serve: stopped\n");
  return 0;
}

}  // namespace

CommandRunner add_serve_command(CLI::App& app) {
  auto* command =
      app.add_subcommand("serve", "Serve models over HTTP: OpenAI images and videos, AUTOMATIC1111, jobs with progress, a web page");
  auto flags = std::make_shared<ServeFlags>();
  auto device_flags = add_device_flags(*command);
  auto parallel_flags = add_parallel_flags(*command, /*cfg_parallel=*/true);
  ServeFlags& f = *flags;
  command->add_option("--model", f.models, "A diffusers model folder to serve, as DIR (named after the folder) or NAME=DIR; repeatable");
  command->add_option("--instances", f.scheduler.instances, "Requests per model run at once, sharing one copy of the weights (default 1)")
      ->check(in_range(1, 64));
  command->add_option("--host", f.host, "Address to listen on (default 127.0.0.1: this machine only)");
  command->add_option("--port", f.port, "Port (default 8080; 0: any free port, printed)")->check(in_range(0, 65535));
  command->add_option("--max-queue", f.scheduler.max_queue, "Requests per model that may wait for an instance; more get 429 (default 16)")
      ->check(in_range(0, 100000));
  command->add_option("--timeout", f.scheduler.timeout_s, "Seconds a request may take, queued and running (default 600; 0: no limit)")
      ->check(in_range(0.0, 1e7));
  command->add_option("--drain-timeout", f.drain_timeout_s, "Seconds running requests get to finish after SIGTERM / SIGINT (default 30)")
      ->check(in_range(0.0, 1e6));
  command->add_option("--keep-jobs", f.scheduler.keep_finished, "Finished jobs kept for their results (default 64)")
      ->check(in_range(1, 100000));
  command->add_option("--fps", f.scheduler.video_fps, "Frame rate of served videos (default 16)")->check(in_range(1, 240));
  command->add_option("--max-body", f.max_body, "Largest request body, uploads included (default 32M)");
  command->add_option("--max-n", f.limits.max_n, "Pictures per request at most (default 4)")->check(in_range(1, 64));
  command->add_option("--max-size", f.limits.max_side, "Width and height at most (default 2048)")->check(in_range(16, 16384));
  command->add_option("--max-steps", f.limits.max_steps, "Denoising steps at most (default 200)")->check(in_range(1, 1000));
  command->add_option("--max-frames", f.limits.max_frames, "Video frames at most (default 129)")->check(in_range(1, 4097));
  command->add_option("--read-timeout", f.limits.read_timeout_s, "Seconds a client may stall while sending (default 10)")
      ->check(in_range(1, 3600));
  command->add_option("--write-timeout", f.limits.write_timeout_s, "Seconds a client may stall while receiving (default 10)")
      ->check(in_range(1, 3600));
  command
      ->add_option("--http-threads", f.limits.http_threads,
                   "Connections served at once (default 64; half of them at most may be event streams)")
      ->check(in_range(2, 1024));
  command->add_option("--dtype", f.dtype, "f32 or bf16 weights and activations (default f32)");
  command->add_option("--variant", f.variant, "Load diffusion_pytorch_model.<variant>.safetensors");
  command->add_option("--quant", f.quant, "MindIE SD quantization description (quant_model_description_*.json)");
  command->add_option("--quant-2", f.quant_2, "Two experts (Wan2.2 A14B): transformer_2/'s quantization description");
  command->add_option("--timestep-policy", f.timestep_policy, "The timestep policy for --quant's W8A8_TIMESTEP layers");
  command->add_option("--offload", f.offload, "Resident transformer blocks under weight streaming (0: off)")->check(in_range(0, 100000));
  command->add_option("--packed-cache", f.packed_cache, kPackedCacheHelp)->check(packed_cache_folder());
  command->add_option(
      "--lora", f.lora,
      "A LoRA (diffusers / PEFT, kohya Flux or Wan safetensors) fused into every model's transformer: FILE or FILE:SCALE; repeatable");
  command->add_flag("--lora-ignore-unmatched", f.lora_ignore_unmatched, "Skip (and count) a LoRA's layers a model does not have");
  command->add_option("--lora-mode", f.lora_mode,
                      "fused (into the weights at load, as diffusers' fuse_lora; the default) or runtime (beside each layer, the weights "
                      "untouched; the default with --quant, whose int8 layers a fused LoRA would not reach)");
  CLI::Option* lora_dir = command->add_option(
      "--lora-dir", f.lora_dir,
      "A folder of LoRA files that requests may name in their \"lora\" key (\"NAME.safetensors:0.8\"), applied at run time "
      "per request; without it, requests may not name LoRAs");
  command
      ->add_option("--trace", f.trace_path,
                   "Record every instance's kernels and write them as a Chrome trace at shutdown, with their CV overlap on stderr "
                   "(memory grows with every request: for measurement runs)")
      ->check(output_file_path());
  command->add_option("--memory-limit", f.memory_limit, "Refuse what would not fit in this much memory (\"24G\")");
  command->add_flag("--check-weights", f.check_weights, "Every loaded weight must be finite");
  return [flags, device_flags, parallel_flags, lora_dir] {
    flags->lora_dir_given = lora_dir->count() > 0;
    return run(*flags, *device_flags, *parallel_flags);
  };
}

}  // namespace cubevec::cli
