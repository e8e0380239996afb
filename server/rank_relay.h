// Serving past one machine: under `mpirun -np N cubevec serve ... --ulysses U`, rank 0 runs the
// HTTP front end and the scheduler; every request it runs, every rank runs with it, sharded by the
// parallel stages. Rank 0's one worker tells the others what to run through the world
// communicator, and they follow:
//
//   rank 0                                   ranks 1..N-1 (follow_rank_zero)
//   encodes the prompt (a bad one fails      waits for a command
//   here, before any rank commits)
//   "generate" + the request  ------------>  generate() the same request
//   generate() (collectives with them)  <-->  ...
//   "finished"                ------------>  next command
//   "idle" every few seconds while idle --->  (keeps the collectives' timeout from passing)
//   "stop" when the server stops -------->  returns 0
//
// A rank whose run fails announces it on the failure channel (parallel/mpi_runtime.h) and ends; rank
// 0's collective then raises "rank R failed: ..." instead of waiting, that request fails, and the
// server answers every later request 503 (the run's communicators are unusable) instead of hanging.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "parallel/communicator.h"
#include "pipelines/pipeline.h"

namespace cubevec::server {

class RankRelay {
 public:
  explicit RankRelay(parallel::Communicator world) : world_(std::move(world)) {}
  // Rank 0: every other rank receives `command`.
  void send(const nlohmann::json& command) const;
  // Ranks 1..N-1: the next command rank 0 sends.
  nlohmann::json receive() const;
  // How often rank 0 says "idle" while it waits for requests: well inside the collective timeout.
  double idle_interval_s() const;
  int rank() const { return world_.rank(); }
  int size() const { return world_.size(); }

 private:
  parallel::Communicator world_;
};

// What ranks 1..N-1 do for the server's life; returns the exit status.
int follow_rank_zero(const pipelines::Pipeline& pipeline, const RankRelay& relay);

}  // namespace cubevec::server
